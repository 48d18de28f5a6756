// Issue 38, finding 2, as the attack: a process that reaches sdcd poses as
// node-a's agent (to answer "done" for it, fake its diagnostics, or give
// node-a another node's instance id for the HyperPod actuator). Before,
// AgentService was served on the trainer port and took any node name. Now
// it is served only on the agent listener, where a caller proves its node
// with a certificate whose SAN is the node's name: node-b's certificate
// cannot register node-a, no certificate registers nothing, and the
// trainer port does not serve AgentService. node-b's own registration
// works, so the refusals are about identity, not a broken listener.

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "agent.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/testing/scripted_rank.h"
#include "tests/testing/sdcd.h"

namespace sdc::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Registration {
  grpc::Status status;
  bool welcomed = false;
};

// Connects over `channel`, registers `node` (claiming `instance_id`), and
// reads until the welcome or the stream's end.
Registration Register(const std::shared_ptr<grpc::Channel>& channel, const std::string& node,
                      const std::string& instance_id) {
  auto stub = v1::AgentService::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto stream = stub->Connect(&context);
  v1::AgentMessage hello;
  hello.mutable_identity()->set_node_name(node);
  hello.mutable_identity()->set_hostname(node);
  hello.mutable_identity()->set_instance_id(instance_id);
  hello.mutable_identity()->set_agent_version("attacker");
  hello.mutable_identity()->set_heartbeat_interval_ms(5000);
  Registration r;
  if (stream->Write(hello)) {
    v1::CoordinatorToAgent down;
    if (stream->Read(&down) && down.has_welcome()) {
      r.welcomed = true;
      context.TryCancel();
    }
  }
  r.status = stream->Finish();
  return r;
}

TEST(FakeAgentTest, OnlyANodesOwnCertificateRegistersIt) {
  const std::string dir = TestDir("fake-agent");
  absl::StatusOr<std::unique_ptr<Sdcd>> sdcd =
      Sdcd::StartWithIdentities(dir, {"node-a", "node-b"});
  ASSERT_TRUE(sdcd.ok()) << sdcd.status();

  // node-b's certificate, node-a's name and an instance id of node-b's choosing.
  const Registration forged =
      Register((*sdcd)->NodeAgentChannel("node-b"), "node-a", "i-0123456789abcdef0");
  EXPECT_FALSE(forged.welcomed);
  EXPECT_EQ(forged.status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
      << forged.status.error_message();
  EXPECT_THAT(forged.status.error_message(),
              HasSubstr("proved to be node node-b (certificate) and may not register node "
                        "'node-a'"));

  // No certificate at all.
  const Registration anonymous =
      Register((*sdcd)->NodeAgentChannel(""), "node-a", "i-0123456789abcdef0");
  EXPECT_FALSE(anonymous.welcomed);
  EXPECT_FALSE(anonymous.status.ok());

  // The trainer port, where it used to be served.
  const Registration on_trainer_port =
      Register((*sdcd)->NodeChannel("node-b"), "node-a", "i-0123456789abcdef0");
  EXPECT_FALSE(on_trainer_port.welcomed);
  EXPECT_EQ(on_trainer_port.status.error_code(), grpc::StatusCode::UNIMPLEMENTED)
      << on_trainer_port.status.error_message();

  // node-b as itself is welcomed.
  const Registration own = Register((*sdcd)->NodeAgentChannel("node-b"), "node-b", "");
  EXPECT_TRUE(own.welcomed) << own.status.error_message();

  const RunResult nodes = (*sdcd)->Sdcctl({"get", "nodes"});
  ASSERT_EQ(nodes.exit_code, 0) << nodes.output;
  EXPECT_THAT(nodes.output, HasSubstr("node-b"));
  EXPECT_THAT(nodes.output, Not(HasSubstr("node-a")));
}

}  // namespace
}  // namespace sdc::testing
