#include "agent/config.h"

#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace sdc::agent {
namespace {

Config Good() {
  Config c;
  c.coordinator = "sdcd.sdc-system.svc:7400";
  c.node_name = "hyperpod-i-0123456789abcdef0";
  c.hostname = "ip-10-1-0-31";
  return c;
}

TEST(ConfigTest, DefaultsWithACoordinatorAndANodeAreValid) {
  EXPECT_TRUE(Validate(Good()).ok()) << Validate(Good());
  Config c = Good();
  c.action_command = "/usr/local/bin/node-action {action} {request} {node}";
  c.inject_diagnostic_fault = "yes-i-am-testing";
  c.instance_id = "i-0123abcd";
  c.heartbeat = absl::Seconds(1);
  EXPECT_TRUE(Validate(c).ok()) << Validate(c);
  EXPECT_TRUE(c.inject_fault());
  EXPECT_FALSE(Good().inject_fault());
  c.relay_listen = "unix:/run/sdc-agent/trainers.sock";
  c.relay_allowed_uids = {0, 1000};
  c.relay_group = 1000;
  EXPECT_TRUE(Validate(c).ok()) << Validate(c);
}

TEST(ConfigTest, EachBadValueNamesItsFlag) {
  struct Case {
    std::function<void(Config&)> mutate;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](Config& c) { c.coordinator = ""; },
       "--coordinator: required (sdcd's address, HOST:PORT)"},
      {[](Config& c) { c.coordinator = "sdcd"; }, "--coordinator: expected HOST:PORT, got 'sdcd'"},
      {[](Config& c) { c.coordinator = "sdcd:0"; },
       "--coordinator: expected HOST:PORT, got 'sdcd:0'"},
      {[](Config& c) { c.node_name = ""; },
       "--node_name: '' is not a node name ([A-Za-z0-9._-], 1 to 253 characters, not starting "
       "with '-'); set --node_name or $NODE_NAME"},
      {[](Config& c) { c.node_name = "node b"; },
       "--node_name: 'node b' is not a node name ([A-Za-z0-9._-], 1 to 253 characters, not "
       "starting with '-'); set --node_name or $NODE_NAME"},
      {[](Config& c) { c.instance_id = "i-xyz"; },
       "--instance_id: expected i- and 8 to 17 hex digits, got 'i-xyz'"},
      {[](Config& c) { c.heartbeat = absl::Milliseconds(500); },
       "--heartbeat: must be between 1s and 10m, got 500ms"},
      {[](Config& c) { c.heartbeat = absl::Minutes(11); },
       "--heartbeat: must be between 1s and 10m, got 11m"},
      {[](Config& c) { c.tls_cert = "/x.pem"; },
       "--tls_key: --tls_cert and --tls_key go together"},
      {[](Config& c) {
         c.tls_cert = "/x.pem";
         c.tls_key = "/y.pem";
       },
       "--tls_cert: a client certificate needs --tls_ca (TLS to sdcd)"},
      {[](Config& c) { c.tls_ca = "/nonexistent/ca.pem"; },
       "--tls_ca: cannot read /nonexistent/ca.pem"},
      {[](Config& c) { c.action_command = "prog {nod}"; },
       "--action_command: unknown placeholder \"{nod}\" (known: {action}, {request}, {node})"},
      {[](Config& c) { c.action_timeout = absl::ZeroDuration(); },
       "--action_timeout: must be positive"},
      {[](Config& c) { c.diagnostic_timeout = -absl::Seconds(1); },
       "--diagnostic_timeout: must be positive"},
      {[](Config& c) { c.relay_listen = "0.0.0.0:7401"; },
       "--relay_listen: must be unix:PATH (only a Unix socket tells the relay which user "
       "connects), got \"0.0.0.0:7401\""},
      {[](Config& c) { c.relay_listen = "127.0.0.1:7401"; },
       "--relay_listen: must be unix:PATH (only a Unix socket tells the relay which user "
       "connects), got \"127.0.0.1:7401\""},
      {[](Config& c) { c.relay_group = -2; }, "--relay_group: expected a group id, got -2"},
      {[](Config& c) { c.token_file = "/nonexistent/token"; },
       "--token_file: cannot read /nonexistent/token"},
      {[](Config& c) { c.relay_listen = "unix:/" + std::string(120, 'x'); },
       "--relay_listen: a Unix socket path has at most 107 characters, this one 121"},
      {[](Config& c) { c.inject_diagnostic_fault = "yes"; },
       "--inject_diagnostic_fault: corrupts diagnostic results for tests; the only accepted "
       "value is yes-i-am-testing"},
  };
  for (const Case& k : cases) {
    Config c = Good();
    k.mutate(c);
    const absl::Status s = Validate(c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << k.message;
    EXPECT_EQ(s.message(), k.message);
  }
}

}  // namespace
}  // namespace sdc::agent
