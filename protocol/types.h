#ifndef SDC_PROTOCOL_TYPES_H_
#define SDC_PROTOCOL_TYPES_H_

// What a trainer rank tells the coordinator (proto/trainer.proto's Hello and
// Report), as plain data. Trainers build these and convert them to the wire
// (protocol/convert.h); sdcd converts the wire back and its core decides on
// them, so the core never sees protobuf or gRPC, and benchmarks and fuzzers
// drive it directly.

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "kernels/fingerprint.h"

namespace sdc::protocol {

using Rank = uint32_t;
using Step = uint64_t;
using kernels::Fingerprint;

// Where a rank runs.
struct Placement {
  Rank rank = 0;
  std::string node;          // Node (host) name.
  uint32_t local_rank = 0;   // GPU index on the node.
  std::string gpu_uuid;      // NVML UUID, or "cpu-<node>-<local_rank>".
  uint32_t replica_group = 0;  // Ranks of a group hold identical weights.
};

// The longest node name (bytes): common::IsSafeNodeName's limit, which sdcd
// enforces on Hello and trainers at start. The trainers' in-band topology
// exchange carries this many bytes per name, so two names that differ
// anywhere are two nodes in-band as at sdcd (issue 39, case 8).
inline constexpr size_t kMaxNodeNameBytes = 253;

// The software a rank computes with, as its trainer reports it in Hello
// (issue 39, case 3). Two ranks whose stacks differ may compute different
// but equally correct results (another cuBLAS picks other kernels, another
// GPU model other tile sizes): sdcd does not blame a GPU for a replay
// mismatch between them. An empty field is unknown (an older trainer).
struct SoftwareStack {
  std::string driver;  // CUDA driver version ("12040"); empty on the CPU.
  std::string cuda;    // CUDA runtime version torch was built with; empty on the CPU.
  std::string cublas;  // cuBLAS version; empty on the CPU.
  std::string torch;   // torch's version ("2.11.0").
  std::string device;  // GPU model ("NVIDIA H100 80GB HBM3"), or the CPU's model name.
  std::string isa;     // On the CPU: the vector ISA ATen dispatches to ("AVX2").

  // True when nothing is known (every field empty).
  bool unknown() const;
  // A 64-bit digest of every field (FNV-1a over each field and a 0 byte),
  // the same in every process; 0 exactly when unknown() (a known stack
  // hashing to 0 is taken as 1). What ranks exchange in-band to tell a
  // stack difference from a fault (issue 39, case 3).
  uint64_t Digest() const;
  // "driver 12040, CUDA 12.4, cuBLAS 120403, torch 2.11.0, NVIDIA H100": the
  // known fields; "unknown" when none is.
  std::string Describe() const;
  bool operator==(const SoftwareStack& o) const;
  bool operator!=(const SoftwareStack& o) const { return !(*this == o); }
};

// Where a rank sits in a sharded layout (an FSDP2/HSDP module on a
// replicate x shard DeviceMesh): shard `index` of `count`, as replica
// `replica` of it. The ranks of one replica group hold one shard. count 0:
// full replicas (DDP), index and replica then 0.
struct ShardCoordinates {
  uint32_t index = 0;
  uint32_t count = 0;
  uint32_t replica = 0;

  bool sharded() const { return count > 0; }
  // "replica 2 of shard 1/2"; "" for full replicas.
  std::string Describe() const;
  bool operator==(const ShardCoordinates& o) const {
    return index == o.index && count == o.count && replica == o.replica;
  }
  bool operator!=(const ShardCoordinates& o) const { return !(*this == o); }
};

// The first message of a rank's stream.
struct Hello {
  std::string job_id;
  Placement placement;
  uint32_t world_size = 0;
  uint64_t incarnation = 0;  // Grows each time the rank's process starts.
  std::vector<std::string> weight_tensors;  // Parameters, then buffers.
  uint32_t parameter_count = 0;  // Prefix of weight_tensors with gradients.
  uint64_t layout_digest = 0;
  bool deterministic = false;  // Audit steps run deterministic kernels.
  uint32_t audit_every = 0;         // Scheduled audits on steps divisible by N.
  uint32_t weight_check_every = 0;  // Weight checks on steps divisible by K.
  SoftwareStack software;
  ShardCoordinates shard;
  // The job's attempt (grows with every launcher restart of the whole job)
  // and the checkpoint step it resumed from (0: none said). See
  // docs/ARCHITECTURE.md, "Attempts".
  uint64_t attempt = 0;
  Step resume_step = 0;
};

// Check 1's inputs and the step's outcome; one per rank per step.
struct StepReport {
  uint64_t local_nonfinite = 0;
  uint64_t reduced_nonfinite = 0;
  double reduced_sum_squares = 0;
  uint64_t reduced_digest = 0;
  bool applied = true;
  std::string skip_reason;
  bool audit_unverified = false;
  std::string audits_off;  // Why the job turned replay audits off at this step.
  // The step ran under a loss scaler (torch.amp.GradScaler): NaN/Inf in
  // every rank's gradients is the scaler's overflow, which it skips and
  // backs off from, not an incident; a lone rank's is named only when a
  // replay on another domain comes out finite.
  bool loss_scaled = false;
  // Why no confirmation replay of this step's lone local NaN/Inf comes
  // (every rank sets it alike); empty when one comes or none is needed.
  std::string no_confirmation;
};

enum class AuditRole {
  kOriginal,  // The rank's own micro-batch.
  kReplay,    // A scheduled or targeted replay of `subject`'s micro-batch.
  kTieBreak,  // A tie-break replay of `subject`'s micro-batch.
  kConfirm,   // A replay of a micro-batch that gave local NaN/Inf.
};

const char* AuditRoleName(AuditRole role);

struct AuditResult {
  AuditRole role = AuditRole::kOriginal;
  uint64_t plan_id = 0;  // 0: the scheduled audit of the step.
  Rank subject = 0;  // Whose micro-batch; the rank itself for kOriginal.
  uint64_t loss_bits = 0;
  // Per parameter (Hello::parameter_count of them) or empty when the job
  // does not run deterministic kernels.
  std::vector<Fingerprint> gradients;
  uint64_t gradient_digest = 0;
  uint64_t nonfinite = 0;
  // kReplay only: the subject's micro-batch arrived corrupted (checksum
  // mismatch); nothing was replayed (issue 39, case 4).
  bool corrupted_transfer = false;
};

struct WeightReport {
  uint64_t digest = 0;
  std::vector<Fingerprint> tensors;  // Hello::weight_tensors order.
  bool checkpoint = false;
  bool has_optimizer_digest = false;
  uint64_t optimizer_digest = 0;
  // A relay removed `tensors`: an earlier report of this digest carried
  // them (v1::WeightReport.tensors_elided).
  bool tensors_elided = false;
};

struct Report {
  std::string job_id;
  Rank rank = 0;
  uint64_t incarnation = 0;
  uint64_t sequence = 0;  // Contiguous from 1 within an incarnation.
  Step step = 0;
  std::variant<StepReport, AuditResult, WeightReport> body;
};

}  // namespace sdc::protocol

#endif  // SDC_PROTOCOL_TYPES_H_
