#ifndef SDC_CLIENT_SMALL_COLLECTIVES_H_
#define SDC_CLIENT_SMALL_COLLECTIVES_H_

// The guard's few-word collectives: the step's agreement (an element-wise
// MAX of 12 int64), the audit exchange and the in-band checkpoint vote.
//
// Why not always the process group's own all-reduce: Gloo's is a ring, 2(n-1)
// dependent hops even for 12 words, and on six ranks sharing two CPUs it took
// 11.4 ms where gathering to rank 0 and broadcasting back took 1.2 ms
// (docs/ARCHITECTURE.md, "The agreement"). The rooted exchange is point to
// point from the calling thread (see small_collectives.cc for why not
// Gloo's own gather and broadcast). NCCL picks a latency algorithm for
// small messages itself, so on other backends the group's collective is used.
//
// Failures (a peer gone, the group's timeout) throw c10::Error, as the
// process group's calls do.

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstdint>
#include <vector>

#include "client/options.h"

namespace sdc::client {

// kAuto made concrete for `pg`: kRooted on Gloo, kBackend on any other.
SmallCollectives Resolve(SmallCollectives how, c10d::ProcessGroup& pg);

// Element-wise maximum of `words` over every rank, in place. Every rank
// passes the same number of words.
void AllReduceMax(c10d::ProcessGroup& pg, SmallCollectives how, std::vector<int64_t>& words);

// Every rank's `words` in rank order (rank r's at r * words.size()). Every
// rank passes the same number of words.
std::vector<int64_t> AllGather(c10d::ProcessGroup& pg, SmallCollectives how,
                               const std::vector<int64_t>& words);

}  // namespace sdc::client

#endif  // SDC_CLIENT_SMALL_COLLECTIVES_H_
