#ifndef SDC_AGENT_WEIGHT_ELISION_H_
#define SDC_AGENT_WEIGHT_ELISION_H_

// Weight reports through a relay: the tensors of one digest travel once.
//
// Healthy replicas hold identical weights, so the 8 ranks of a node send
// the same 1,000 fingerprints (24 KB) at every weight check, and sdcd keeps
// one copy per distinct digest anyway (the vote compares digests; tensors
// only name where a minority differs). A relay stream carries a weight
// report's tensors the first time it sees its (job, replica group, step,
// digest, optimizer digest) and sends later ones with the same key as
// `tensors_elided`, digest only. sdcd reads a stream's messages in order,
// so the report that carried them is applied first.
//
// Nothing is decided here: every rank's report, and so its vote, still
// reaches sdcd. A rank whose weights differ has its own digest, and its
// tensors travel. If sdcd refuses or drops the report that carried them
// (it ends that session), the vote still counts and only the naming of
// differing tensors is lost; to keep that window short, a session's end
// makes its group's next report of each digest carry tensors again.
//
// Not thread-safe: call in the order messages go onto one stream.

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "trainer.pb.h"

namespace sdc::agent {

class WeightElision {
 public:
  // `*message` is session `session`'s next message on the stream. Learns
  // the session's job and group from its Hello; elides a weight report's
  // tensors when this stream already carried them. True if it did.
  bool Apply(uint64_t session, v1::TrainerMessage* message);

  // The session ended (either side).
  void End(uint64_t session);

 private:
  using Group = std::pair<std::string, uint32_t>;  // (job, replica group)
  using Digests = std::tuple<uint64_t, bool, uint64_t>;  // digest, optimizer digest
  struct Carried {
    uint64_t step = 0;  // The newest weight step seen; older ones travel whole.
    absl::flat_hash_set<Digests> digests;
  };
  absl::flat_hash_map<uint64_t, Group> sessions_;
  absl::flat_hash_map<Group, Carried> carried_;
};

}  // namespace sdc::agent

#endif  // SDC_AGENT_WEIGHT_ELISION_H_
