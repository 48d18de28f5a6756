#include "agent/weight_elision.h"

namespace sdc::agent {

bool WeightElision::Apply(uint64_t session, v1::TrainerMessage* message) {
  if (message->has_hello()) {
    const v1::Hello& h = message->hello();
    // sdcd refuses a second Hello on a session; the first one stands.
    sessions_.try_emplace(session, Group{h.job_id(), h.placement().replica_group()});
    return false;
  }
  if (!message->has_report() || !message->report().has_weights()) return false;
  auto session_it = sessions_.find(session);
  if (session_it == sessions_.end()) return false;
  const Group& group = session_it->second;
  v1::Report& r = *message->mutable_report();
  v1::WeightReport& w = *r.mutable_weights();
  // Only the reports sdcd can take tensors for from an earlier one: of
  // the session's own job, with tensors to elide.
  if (r.job_id() != group.first || w.tensors_size() == 0 || w.tensors_elided()) return false;
  Carried& c = carried_[group];
  if (r.step() < c.step) return false;
  if (r.step() > c.step) {
    c.step = r.step();
    c.digests.clear();
  }
  const Digests key{w.digest(), w.has_optimizer_digest(),
                    w.has_optimizer_digest() ? w.optimizer_digest() : 0};
  if (c.digests.insert(key).second) return false;  // The first: it carries them.
  // Let go of the storage now, not when the message is sent: a burst of
  // reports waiting for the stream would otherwise hold every copy.
  google::protobuf::RepeatedField<uint64_t>().Swap(w.mutable_tensors());
  w.set_tensors_elided(true);
  return true;
}

void WeightElision::End(uint64_t session) {
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;
  // sdcd may have dropped what this session carried: carry again.
  carried_.erase(it->second);
  sessions_.erase(it);
}

}  // namespace sdc::agent
