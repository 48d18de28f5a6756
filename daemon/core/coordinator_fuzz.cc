// libFuzzer target over the coordinator's ingestion entry points. The input
// bytes script a cluster's life: hellos, step/audit/weight reports with
// fuzzed fields, clock ticks, checkpoint questions and restarts. Invariants
// checked on every operation:
//   - nothing crashes or trips a sanitizer;
//   - a refused call changes nothing (the store sees no mutation);
//   - a restarted coordinator restores from the store.
// Built with clang -fsanitize=fuzzer by ./sdc test when clang is installed;
// coordinator_fuzz_replay_test runs the same body on fixed inputs under Bazel.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "daemon/core/coordinator.h"

namespace sdc::core {
namespace {

// A caller proven to be the node its Hello names (a node certificate).
Caller Proven(const Hello& h) { return {h.placement.node, "certificate", {}}; }

class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return at_ >= size_; }
  uint8_t Byte() { return at_ < size_ ? data_[at_++] : 0; }
  uint32_t Small(uint32_t bound) { return bound == 0 ? 0 : Byte() % bound; }
  uint64_t Word() {
    uint64_t w = 0;
    for (int i = 0; i < 8; ++i) w = (w << 8) | Byte();
    return w;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

const std::vector<std::string>& Tensors() {
  static const auto* t = new std::vector<std::string>{"a", "b", "c", "d"};
  return *t;
}

Hello HelloFor(Bytes& in, uint32_t world) {
  Hello h;
  h.job_id = in.Small(8) == 0 ? "other" : "job";
  const Rank rank = in.Small(world + 2);
  h.placement = {rank, std::string("node-") + static_cast<char>('a' + in.Small(4)),
                 in.Small(3), "GPU-" + std::to_string(rank), in.Small(8) == 0 ? 1u : 0u};
  h.world_size = in.Small(10) == 0 ? world + 1 : world;
  h.incarnation = 1 + in.Small(3);
  h.weight_tensors = Tensors();
  if (in.Small(10) == 0) h.weight_tensors.pop_back();
  h.parameter_count = in.Small(6);
  h.layout_digest = in.Small(10) == 0 ? 2 : 1;
  h.deterministic = in.Byte() & 1;
  h.audit_every = in.Small(10) == 0 ? 3 : 2;
  h.weight_check_every = 2;
  return h;
}

Report ReportFor(Bytes& in, uint32_t world, std::vector<uint64_t>& sequence) {
  Report r;
  r.job_id = in.Small(10) == 0 ? "nope" : "job";
  r.rank = in.Small(world + 1);
  r.incarnation = 1 + in.Small(3);
  uint64_t& seq = sequence[r.rank % sequence.size()];
  const uint32_t jump = in.Small(8);
  r.sequence = jump == 0 ? seq : jump == 1 ? seq + 3 : seq + 1;
  r.step = in.Small(12);
  switch (in.Small(3)) {
    case 0: {
      StepReport s;
      s.local_nonfinite = in.Small(4) == 0 ? 1 : 0;
      s.reduced_nonfinite = in.Small(4) == 0 ? 1 : 0;
      s.reduced_digest = in.Small(3);
      s.applied = in.Byte() & 1;
      r.body = s;
      break;
    }
    case 1: {
      AuditResult a;
      a.role = static_cast<AuditRole>(in.Small(4));
      a.plan_id = in.Small(6) == 0 ? in.Small(4) : 0;
      a.subject = in.Small(world + 1);
      a.loss_bits = in.Small(3);
      a.gradient_digest = in.Small(3);
      a.gradients.resize(in.Small(5));
      for (auto& g : a.gradients) g = {8, in.Small(3), in.Small(3)};
      a.nonfinite = in.Small(2);
      r.body = a;
      break;
    }
    default: {
      WeightReport w;
      // A wrong layout, a relay's elided report, an elided one that still
      // carries tensors (refused), or the layout's four tensors.
      const uint32_t shape = in.Small(8);
      w.tensors.resize(shape == 0 ? 3 : shape == 1 ? 0 : 4);
      w.tensors_elided = shape == 1 || shape == 2;
      for (auto& t : w.tensors) t = {16, in.Small(2), 0};
      w.digest = in.Small(3);
      w.has_optimizer_digest = in.Small(4) == 0;
      w.optimizer_digest = in.Small(2);
      r.body = w;
      break;
    }
  }
  return r;
}

// A store that counts applied mutations, so a refused call can be seen to
// have written nothing.
class CountingStore : public MemoryStore {
 public:
  absl::StatusOr<uint64_t> Apply(Mutation m) override {
    ++applied_;
    return MemoryStore::Apply(std::move(m));
  }
  uint64_t applied() const { return applied_; }

 private:
  uint64_t applied_ = 0;
};

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant violated: %s\n", what);
    std::abort();
  }
}

}  // namespace

void FuzzCoordinatorOnce(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  const uint32_t world = 3 + in.Small(4);
  FakeClock clock;
  CountingStore store;
  CoordinatorOptions options;
  options.targeted_audits_per_suspect = in.Small(3);
  auto c = std::make_unique<Coordinator>(options, &clock, &store);
  std::vector<uint64_t> sequence(world + 1, 0);
  for (int op = 0; op < 400 && !in.empty(); ++op) {
    const uint64_t before = store.applied();
    switch (in.Small(8)) {
      case 0: {
        const Hello hello = HelloFor(in, world);
        absl::StatusOr<AttachResult> a = c->Attach(hello, Proven(hello));
        Check(a.ok() || store.applied() == before, "refused hello wrote to the store");
        break;
      }
      case 1:
      case 2:
      case 3:
      case 4: {
        Report r = ReportFor(in, world, sequence);
        absl::StatusOr<Effects> e = c->Ingest(r);
        Check(e.ok() || store.applied() == before, "refused report wrote to the store");
        if (e.ok() && !e->duplicate) sequence[r.rank % sequence.size()] = r.sequence;
        break;
      }
      case 5:
        clock.Advance(absl::Seconds(in.Small(200)));
        c->Tick();
        break;
      case 6:
        (void)c->MayCheckpoint(in.Small(5) == 0 ? "nope" : "job", in.Small(12));
        break;
      default: {
        c = std::make_unique<Coordinator>(options, &clock, &store);
        Check(c->Restore().ok(), "restore failed");
        break;
      }
    }
  }
}

}  // namespace sdc::core

#ifdef SDC_LIBFUZZER
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sdc::core::FuzzCoordinatorOnce(data, size);
  return 0;
}
#endif
