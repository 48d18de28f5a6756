#ifndef SDC_PROTOCOL_TESTING_TOPOLOGY_H_
#define SDC_PROTOCOL_TESTING_TOPOLOGY_H_

// Topologies for the protocol's tests.

#include <vector>

#include "absl/strings/str_cat.h"
#include "protocol/replay_plan.h"

namespace sdc::protocol::testing {

// Ranks 0.. laid out node after node: sizes {2, 1} is node "n0" = {0, 1},
// node "n1" = {2}. Node names sort in creation order (fewer than 10 nodes).
inline Topology Contiguous(const std::vector<int>& sizes) {
  std::vector<PlanMember> members;
  Rank next = 0;
  for (size_t node = 0; node < sizes.size(); ++node) {
    for (int gpu = 0; gpu < sizes[node]; ++gpu) {
      members.push_back({next++, absl::StrCat("n", node)});
    }
  }
  return Topology(std::move(members));
}

}  // namespace sdc::protocol::testing

#endif  // SDC_PROTOCOL_TESTING_TOPOLOGY_H_
