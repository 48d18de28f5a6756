#ifndef SDC_CTL_ADMIN_CLIENT_H_
#define SDC_CTL_ADMIN_CLIENT_H_

// sdcctl's connection to sdcd's admin port: the credential (a bearer token,
// or a TLS client certificate), the channel, and a fresh deadline on every
// call. The only file of sdcctl that makes RPCs.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "admin.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace sdc::sdcctl {

using AdminStub = v1::AdminService::StubInterface;
using NodeAdminStub = v1::NodeAdminService::StubInterface;

// Where and how to connect.
struct Connection {
  std::string server;      // HOST:PORT or unix:PATH.
  std::string token_file;  // The bearer token's file.
  std::string tls_ca;      // PEM CA of sdcd's certificate; empty: plaintext (unless tls_cert).
  std::string tls_cert;    // PEM client certificate; authenticates instead of a token.
  std::string tls_key;     // Its private key.
  absl::Duration timeout = absl::Seconds(10);  // Deadline of every call.
};

struct Credentials {
  std::shared_ptr<grpc::ChannelCredentials> channel;
  std::string bearer_token;  // Empty: authenticate by client certificate.
  // What was loaded, for error messages: "the token in PATH" or "the client
  // certificate PATH".
  std::string description;
};

// Reads the token file (and TLS files). PermissionDenied when there is
// nothing to authenticate with (no readable, non-empty token and no client
// certificate); FailedPrecondition when a TLS file cannot be read.
absl::StatusOr<Credentials> LoadCredentials(const Connection& connection);

// The admin and node-admin stubs of one channel. Thread-compatible: one
// thread at a time (sdcctl makes one call at a time).
class AdminClient {
 public:
  AdminClient(const Connection& connection, const Credentials& credentials);

  // Calls `method` of sdcd's AdminService or NodeAdminService (whichever
  // declares it) with the bearer token and the connection's deadline:
  //   admin.Call(&AdminStub::ListJobs, v1::ListJobsRequest(), &response)
  // Returns the call's status.
  template <typename Stub, typename Request, typename Response>
  grpc::Status Call(grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
                    const Request& request, Response* response) {
    grpc::ClientContext context;
    Prepare(&context);
    return (StubFor(static_cast<Stub*>(nullptr))->*method)(&context, request, response);
  }

  // What the client authenticates with (Credentials::description).
  const std::string& credential() const { return credential_; }

 private:
  void Prepare(grpc::ClientContext* context) const;
  AdminStub* StubFor(AdminStub*) { return admin_.get(); }
  NodeAdminStub* StubFor(NodeAdminStub*) { return nodes_.get(); }

  const absl::Duration timeout_;
  const std::string bearer_token_;
  const std::string credential_;
  std::unique_ptr<AdminStub> admin_;
  std::unique_ptr<NodeAdminStub> nodes_;
};

}  // namespace sdc::sdcctl

#endif  // SDC_CTL_ADMIN_CLIENT_H_
