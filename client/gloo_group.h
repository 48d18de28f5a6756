#ifndef SDC_CLIENT_GLOO_GROUP_H_
#define SDC_CLIENT_GLOO_GROUP_H_

// A c10d process group on the Gloo backend, for C++ trainers, tests and
// benchmarks that make their own group (a Python job passes the group its
// script already initialised). Rendezvous through a FileStore that every
// rank names; the ranks talk over TCP on `host`.

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace sdc::client {

// Collective: every rank of `world` calls it with the same `store_path`.
// Throws c10::Error, as c10d does, when the rendezvous fails or times out.
c10::intrusive_ptr<c10d::ProcessGroup> MakeGlooGroup(
    const std::string& store_path, int rank, int world,
    std::chrono::milliseconds timeout = std::chrono::seconds(120),
    const std::string& host = "127.0.0.1");

// The same group, counting in `issued` every collective and point-to-point
// call that reaches the backend (all-reduce, broadcast, all-gather, gather,
// scatter, reduce, reduce-scatter, all-to-all, barrier, send, recv), from
// any caller: the trainer's own gradient all-reduce and the guard's alike.
// What tests and `./sdc bench overhead` compare guarded and plain steps by.
c10::intrusive_ptr<c10d::ProcessGroup> MakeCountingGlooGroup(
    const std::string& store_path, int rank, int world, std::shared_ptr<std::atomic<int64_t>> issued,
    std::chrono::milliseconds timeout = std::chrono::seconds(120),
    const std::string& host = "127.0.0.1");

}  // namespace sdc::client

#endif  // SDC_CLIENT_GLOO_GROUP_H_
