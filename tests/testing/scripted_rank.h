#ifndef SDC_TESTS_TESTING_SCRIPTED_RANK_H_
#define SDC_TESTS_TESTING_SCRIPTED_RANK_H_

// A trainer rank reduced to its wire behaviour, for sdcd's tests: it opens
// the real Attach stream over gRPC, says Hello, sends the reports a test
// scripts, and records everything the coordinator sends back.

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/core/types.h"
#include "grpcpp/grpcpp.h"
#include "trainer.grpc.pb.h"

namespace sdc::testing {

std::shared_ptr<grpc::Channel> Channel(const std::string& address);

// A TLS channel to sdcd at `address` (127.0.0.1:PORT; the server's name is
// checked as "localhost") trusting `ca`, presenting the certificate and key
// in `cert` and `key` (empty: none).
std::shared_ptr<grpc::Channel> TlsChannel(const std::string& address, const std::string& ca,
                                          const std::string& cert, const std::string& key);

// The channel a rank on `node` dials with.
using ChannelFor = std::function<std::shared_ptr<grpc::Channel>(const std::string& node)>;

// A Hello for rank `rank` of a job laid out as nodes "node-a", "node-b", ...
// with `gpus_per_node` ranks each, GPU UUIDs "GPU-<rank>", one replica group,
// the given weight tensors (all parameters), deterministic kernels.
core::Hello TestHello(const std::string& job, core::Rank rank, uint32_t world,
                      uint32_t gpus_per_node, const std::vector<std::string>& tensors,
                      uint32_t audit_every = 10, uint32_t weight_check_every = 10);

class ScriptedRank {
 public:
  ScriptedRank(std::shared_ptr<grpc::Channel> channel, core::Hello hello);
  ~ScriptedRank();

  // Opens the stream and waits for the Welcome. Sequences continue from the
  // Welcome's acked_sequence (what a real client resends after).
  absl::Status Connect(absl::Duration timeout = absl::Seconds(10));
  // Sends one report; returns its sequence number.
  uint64_t Send(core::Step step, decltype(core::Report::body) body);
  // Sends raw; the test controls every field.
  bool SendRaw(const v1::Report& report);
  absl::Status WaitAcked(uint64_t sequence, absl::Duration timeout = absl::Seconds(10));
  // The first received message (since the last Clear) matching `match`.
  absl::StatusOr<v1::CoordinatorMessage> WaitFor(
      const std::function<bool(const v1::CoordinatorMessage&)>& match,
      absl::Duration timeout = absl::Seconds(10));
  // Waits for the server to end the stream; returns its status.
  grpc::Status WaitFinished(absl::Duration timeout = absl::Seconds(10));
  // Half-closes and finishes the stream.
  grpc::Status Close();

  uint64_t acked() const;
  uint64_t welcome_acked() const { return welcome_acked_; }
  uint64_t next_sequence() const { return next_sequence_; }
  void set_next_sequence(uint64_t s) { next_sequence_ = s; }
  const core::Hello& hello() const { return hello_; }
  std::vector<v1::CoordinatorMessage> Messages() const;

 private:
  void ReadLoop();

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::TrainerService::Stub> stub_;
  core::Hello hello_;
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::TrainerMessage, v1::CoordinatorMessage>> stream_;
  std::thread reader_;
  uint64_t welcome_acked_ = 0;
  uint64_t next_sequence_ = 1;

  mutable absl::Mutex mu_;
  std::vector<v1::CoordinatorMessage> messages_ ABSL_GUARDED_BY(mu_);
  uint64_t acked_ ABSL_GUARDED_BY(mu_) = 0;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

using Ranks = std::vector<std::unique_ptr<ScriptedRank>>;

// Ranks 0 .. world-1 of `job` (laid out as TestHello does), each connected to
// the sdcd at `address` and welcomed, in rank order.
absl::StatusOr<Ranks> ConnectRanks(const std::string& address, const std::string& job,
                                   uint32_t world, uint32_t gpus_per_node,
                                   const std::vector<std::string>& tensors);
// The same, each rank dialling with channel_for(its node): e.g. its node's
// certificate (Sdcd::NodeChannel).
absl::StatusOr<Ranks> ConnectRanks(const ChannelFor& channel_for, const std::string& job,
                                   uint32_t world, uint32_t gpus_per_node,
                                   const std::vector<std::string>& tensors);

// Every rank's part of the scheduled (full) audit of `step`, as the ranks
// compute it (ScheduledAudit with their Hello's audit_every; InvalidArgument
// when `step` has none); `faulty` (if any) gets its own batch and its
// replays wrong. Then the tie-breaks the ranks derive in-band. Waits until
// every report is acknowledged.
absl::Status SendScheduledAudit(const std::vector<std::unique_ptr<ScriptedRank>>& ranks,
                                core::Step step, std::optional<core::Rank> faulty);

}  // namespace sdc::testing

#endif  // SDC_TESTS_TESTING_SCRIPTED_RANK_H_
