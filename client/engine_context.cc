#include "client/engine_context.h"

#include <cstdio>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/device.h"
#include "client/small_collectives.h"
#include "client/tensor_checks.h"

namespace sdc::client {

EngineContext::EngineContext(GuardOptions options,
                             c10::intrusive_ptr<c10d::ProcessGroup> process_group)
    : options_(std::move(options)),
      pg_(std::move(process_group)),
      rank_(static_cast<uint32_t>(pg_->getRank())),
      world_(static_cast<uint32_t>(pg_->getSize())),
      fault_(FaultFor(options_.faults, rank_)),
      small_collectives_(Resolve(options_.small_collectives, *pg_)),
      collective_device_(CollectiveDevice(*pg_)) {}

EngineContext::~EngineContext() = default;

absl::Status EngineContext::ExchangeTopology(uint64_t software_digest) {
  // Every rank's node name and replica group, for the replay plans, and rank
  // 0's fingerprint seed, for the job's key (with a byte saying whether it
  // could draw one: a failure must reach every rank, not leave the others
  // waiting in the all-gather).
  // Whole names (OptionsFromVariables and GuardEngine::Create refuse longer
  // ones): a cut would merge two nodes sdcd keeps apart.
  // The whole 32-bit replica group, as sdcd keeps it: a cut (it was 8 bits)
  // would put groups 1 and 257 in one in-band topology (issue 39, case 6).
  constexpr int64_t kNameBytes = protocol::kMaxNodeNameBytes;
  constexpr int64_t kGroupAt = kNameBytes;
  constexpr int64_t kGroupBytes = sizeof(uint32_t);
  constexpr int64_t kSeedAt = kGroupAt + kGroupBytes;
  constexpr int64_t kSeedBytes = sizeof(uint64_t);
  constexpr int64_t kSeedDrawnAt = kSeedAt + kSeedBytes;
  constexpr int64_t kStackAt = kSeedDrawnAt + 1;
  constexpr int64_t kStackBytes = sizeof(uint64_t);
  uint64_t seed = 0;
  absl::Status drawn_status;
  if (rank_ == 0) {
    absl::StatusOr<uint64_t> drawn = kernels::DrawFingerprintSeed();
    drawn_status = drawn.status();
    if (drawn.ok()) seed = *drawn;
  }
  torch::Tensor mine = torch::zeros({kStackAt + kStackBytes}, torch::kUInt8);
  const std::string node = options_.node_name.substr(0, kNameBytes);
  std::memcpy(mine.data_ptr(), node.data(), node.size());
  std::memcpy(static_cast<uint8_t*>(mine.data_ptr()) + kGroupAt, &options_.replica_group,
              kGroupBytes);
  std::memcpy(static_cast<uint8_t*>(mine.data_ptr()) + kSeedAt, &seed, kSeedBytes);
  mine[kSeedDrawnAt] = drawn_status.ok() ? 1 : 0;
  std::memcpy(static_cast<uint8_t*>(mine.data_ptr()) + kStackAt, &software_digest, kStackBytes);
  std::vector<std::vector<torch::Tensor>> gathered(1);
  std::vector<torch::Tensor> input;
  SDC_TORCH_TRY({
    input.push_back(mine.to(collective_device_));
    for (uint32_t r = 0; r < world_; ++r) gathered[0].push_back(torch::zeros_like(input[0]));
    pg_->allgather(gathered, input)->wait();
    for (torch::Tensor& t : gathered[0]) t = t.cpu();
  });
  std::vector<protocol::PlanMember> members;
  software_digests_.assign(world_, 0);
  std::vector<uint32_t> group_of_rank(world_, 0);
  for (uint32_t r = 0; r < world_; ++r) {
    const auto* bytes = static_cast<const char*>(gathered[0][r].data_ptr());
    std::memcpy(&software_digests_[r], bytes + kStackAt, kStackBytes);
    uint32_t group = 0;
    std::memcpy(&group, bytes + kGroupAt, kGroupBytes);
    group_of_rank[r] = group;
    if (group == options_.replica_group) {
      members.push_back({r, std::string(bytes, strnlen(bytes, kNameBytes))});
    }
  }
  topology_ = std::make_unique<protocol::Topology>(std::move(members));
  replica_groups_ = ReplicaGroups(std::move(group_of_rank));
  const auto* rank0 = static_cast<const uint8_t*>(gathered[0][0].data_ptr());
  if (rank0[kSeedDrawnAt] == 0) {
    return absl::UnavailableError(absl::StrCat(
        "rank 0 could not draw the job's fingerprint seed",
        drawn_status.ok() ? "" : absl::StrCat(": ", drawn_status.message())));
  }
  std::memcpy(&seed, rank0 + kSeedAt, kSeedBytes);
  fingerprint_key_ =
      std::make_unique<kernels::FingerprintKey>(kernels::FingerprintKey::FromSeed(seed));
  return absl::OkStatus();
}

absl::Status EngineContext::Connect(protocol::Hello hello) {
  if (!options_.coordinator.empty()) {
    link_ = std::make_unique<CoordinatorLink>(options_, std::move(hello));
    link_->Start();
  }
  if (!options_.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<TrainerMetrics>> m = TrainerMetrics::Start(
        options_.metrics_listen, options_.job_id, rank_,
        [this] {
          return link_ != nullptr ? std::optional(link_->stats()) : std::nullopt;
        });
    if (!m.ok()) return m.status();
    metrics_ = *std::move(m);
    Log(absl::StrCat("serving metrics on port ", metrics_->port()));
  }
  return absl::OkStatus();
}

void EngineContext::Stop(absl::Duration flush) {
  if (link_ != nullptr) link_->Stop(flush);
}

void EngineContext::AllReduceMax(std::vector<int64_t>& words) const {
  client::AllReduceMax(*pg_, small_collectives_, words);
}

std::vector<int64_t> EngineContext::AllGather(const std::vector<int64_t>& words) const {
  return client::AllGather(*pg_, small_collectives_, words);
}

void EngineContext::Send(uint64_t step, decltype(protocol::Report::body) body) const {
  if (link_ != nullptr) link_->Send(step, std::move(body));
}

void EngineContext::Log(const std::string& line) const {
  std::fprintf(stderr, "sdc-guard rank %u: %s\n", rank_, line.c_str());
}

void EngineContext::Summarize(GuardSummary& summary) const {
  if (link_ == nullptr) return;
  const CoordinatorLink::Stats l = link_->stats();
  summary.reports_sent = l.sent;
  summary.reports_acked = l.acked;
  summary.reports_dropped = l.dropped;
  summary.coordinator_connected = l.connected;
}

}  // namespace sdc::client
