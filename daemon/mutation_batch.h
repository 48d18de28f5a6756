#ifndef SDC_DAEMON_MUTATION_BATCH_H_
#define SDC_DAEMON_MUTATION_BATCH_H_

// The store's group commit, as a pure function: the mutations queued for
// one commit, folded into one.

#include <cstdint>
#include <deque>
#include <utility>

#include "daemon/core/store.h"

namespace sdc::daemon {

// One commit's worth of mutations as one, without writes a later mutation
// of the same batch makes void: a rank record rewritten (the last wins), and
// a report added and removed again before the commit. Order is kept
// otherwise; the result is what applying them one by one would leave.
// `batch` holds (ticket, mutation) in queue order; its mutations are moved
// from.
core::Mutation CoalesceMutations(std::deque<std::pair<uint64_t, core::Mutation>>& batch);

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_MUTATION_BATCH_H_
