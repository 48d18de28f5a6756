#ifndef SDC_CLIENT_ONE_RANK_GROUP_H_
#define SDC_CLIENT_ONE_RANK_GROUP_H_

// Tests only: a real one-rank Gloo process group, for the engine's parts
// whose collectives have a single participant in a unit test.

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <string>

namespace sdc::client {

// A Gloo group of one rank rendezvousing in a file named `name` under
// $TEST_TMPDIR (else /tmp); a stale file of that name is removed first.
c10::intrusive_ptr<c10d::ProcessGroup> OneRankGroup(const std::string& name);

}  // namespace sdc::client

#endif  // SDC_CLIENT_ONE_RANK_GROUP_H_
