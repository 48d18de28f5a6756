// The relay socket as an attacker on the node meets it (issue 38, finding
// 6): a process of a uid not in the allowed list connects to the socket and
// is closed before gRPC reads a byte, while an allowed uid's connection is
// served (the gRPC server's first SETTINGS frame arrives); and the socket
// file is not world-writable. Before, the socket was created mode 0777 by
// gRPC and any local user's process could relay ranks as this node.

#include "agent/relay_socket.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace sdc::agent {
namespace {

// Under /tmp: TEST_TMPDIR's path is longer than a socket address holds.
std::string SocketPath(const std::string& name) {
  return absl::StrCat("/tmp/sdc-relay-test-", name, "-", getpid(), ".sock");
}

// Connects to `path` and reads what the server sends within 10 s: the byte
// count (0: the server closed the connection; -1: nothing arrived, or the
// connection failed).
int ConnectAndRead(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  pollfd p{fd, POLLIN, 0};
  int n = -1;
  if (poll(&p, 1, 10000) == 1) {
    char buf[256];
    n = static_cast<int>(read(fd, buf, sizeof(buf)));
  }
  close(fd);
  return n;
}

// Whether a gRPC channel over `path` completes its HTTP/2 handshake.
bool GrpcConnects(const std::string& path) {
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel("unix:" + path, grpc::InsecureChannelCredentials());
  return channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(5));
}

class RelaySocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.RegisterCallbackGenericService(&unimplemented_);  // Answers every call UNIMPLEMENTED.
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }
  grpc::CallbackGenericService unimplemented_;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(RelaySocketTest, AnotherUidIsClosedBeforeGrpcSeesAByte) {
  const std::string path = SocketPath("other-uid");
  const uid_t someone_else = getuid() + 1;
  absl::StatusOr<std::unique_ptr<RelaySocket>> socket =
      RelaySocket::Listen(path, {someone_else}, static_cast<gid_t>(-1));
  ASSERT_TRUE(socket.ok()) << socket.status();
  (*socket)->Serve(server_.get());
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u) << "no other user may even connect";
  // Our uid is not allowed: the attacker's connection is closed unanswered,
  // and gRPC never gets through.
  EXPECT_EQ(ConnectAndRead(path), 0);
  EXPECT_EQ((*socket)->refused(), 1u);
  EXPECT_FALSE(GrpcConnects(path));
  EXPECT_GE((*socket)->refused(), 2u);
  (*socket)->Stop();
  EXPECT_NE(stat(path.c_str(), &st), 0) << "Stop removes the socket file";
}

TEST_F(RelaySocketTest, AnAllowedUidIsServed) {
  const std::string path = SocketPath("own-uid");
  absl::StatusOr<std::unique_ptr<RelaySocket>> socket =
      RelaySocket::Listen(path, {getuid()}, static_cast<gid_t>(-1));
  ASSERT_TRUE(socket.ok()) << socket.status();
  (*socket)->Serve(server_.get());
  EXPECT_TRUE(GrpcConnects(path));
  EXPECT_EQ((*socket)->refused(), 0u);
  (*socket)->Stop();
}

}  // namespace
}  // namespace sdc::agent
