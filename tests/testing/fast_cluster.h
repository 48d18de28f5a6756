#ifndef SDC_TESTS_TESTING_FAST_CLUSTER_H_
#define SDC_TESTS_TESTING_FAST_CLUSTER_H_

// The cluster tests' configuration: the demo's 3 nodes x 2 ranks, 24 steps,
// every check every 5 steps, a checkpoint every 10, in a fresh test folder.

#include <string>

#include "absl/time/time.h"
#include "demo/launcher.h"
#include "demo/process.h"

namespace sdc::testing {

inline demo::ClusterConfig FastCluster(const std::string& name, const std::string& fault) {
  demo::ClusterConfig c;
  c.run_dir = demo::TestDir(name);
  c.steps = 24;
  c.audit_every = 5;
  c.weight_check_every = 5;
  c.checkpoint_every = 10;
  c.fault = fault;
  c.job_id = name;
  c.timeout = absl::Minutes(8);
  return c;
}

}  // namespace sdc::testing

#endif  // SDC_TESTS_TESTING_FAST_CLUSTER_H_
