// sdc-trainer: one data-parallel rank of the demo's training job (CPU, Gloo),
// guarded by sdc::Guard. The demo launcher and the multi-process tests start
// several of these; sdc-guard's own settings come from SDC_* environment
// variables (client/options.h), the trainer's from its flags. Progress is
// written as one JSON line per step to --progress.

#include <fcntl.h>
#include <malloc.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/gloo_group.h"
#include "client/guard.h"
#include "client/options.h"
#include "client/small_collectives.h"
#include "demo/model.h"
#include "demo/progress_line.h"
#include "kernels/fingerprint.h"
#include "kernels/model_digest.h"

ABSL_FLAG(int, rank, -1, "This process's global rank.");
ABSL_FLAG(int, world_size, -1, "Number of ranks.");
ABSL_FLAG(std::string, rendezvous, "", "c10d FileStore path shared by every rank.");
ABSL_FLAG(int, steps, 100, "Training steps.");
ABSL_FLAG(int, first_step, 1, "Number of the first step (resuming).");
ABSL_FLAG(std::string, model, "transformer",
          "transformer, bn-mlp, center-mlp, put-mlp or frozen-mlp.");
ABSL_FLAG(int, batch, 8, "Sequences per micro-batch.");
ABSL_FLAG(int, micro_batches, 1, "Micro-batches per step (gradient accumulation).");
ABSL_FLAG(int, checkpoint_every, 0, "Ask for a checkpoint every N steps (0 = never).");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "Where allowed checkpoints are written (rank 0): step-N.pt.provisional, renamed "
          "step-N.pt when confirmed, deleted when revoked.");
ABSL_FLAG(std::string, resume_from, "",
          "A checkpoint this trainer wrote (step-N.pt): load its weights and optimizer state "
          "before the first step (a restarted attempt; pair with --first_step=N+1).");
ABSL_FLAG(std::string, progress, "", "JSON lines: one per step, then a summary.");
ABSL_FLAG(std::string, corpus, "/usr/share/common-licenses", "Directory of text files.");
ABSL_FLAG(double, lr, 3e-3, "AdamW learning rate.");
ABSL_FLAG(int, seed, 1234,
          "Model initialization seed (the same on every rank of a replica group).");
ABSL_FLAG(int, collective_timeout_s, 120, "The process group's collective timeout, seconds.");
ABSL_FLAG(bool, unguarded, false, "Train without sdc-guard (the overhead baseline).");
ABSL_FLAG(bool, every_step, false,
          "Checksum every matrix product of each step's forward and backward "
          "(sdc::FrontEndOptions::every_step; issue 45).");
ABSL_FLAG(bool, count_collectives, false,
          "Count the collectives each step issues (the process group's backend counts every "
          "call) and write them in the progress line's \"collectives\".");
ABSL_FLAG(bool, extra_collective, false,
          "With --unguarded: one more all-reduce (MAX of 12 int64) per step, the guard's "
          "agreement run the guard's way (SDC_SMALL_COLLECTIVES), to measure what that one "
          "collective costs here.");
ABSL_FLAG(std::string, turn_file, "",
          "Take turns with other clusters on this machine (the overhead benchmark): run "
          "--turn_steps steps whenever this file names --turn_name (or says *), then write "
          "--turn_next into it.");
ABSL_FLAG(std::string, turn_name, "", "This cluster's name in --turn_file.");
ABSL_FLAG(std::string, turn_next, "", "The cluster whose turn follows this one's.");
ABSL_FLAG(int, turn_steps, 10, "Steps per turn.");

namespace sdc::demo {
namespace {

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "sdc-trainer: %s\n", why.c_str());
  std::exit(2);
}

// What the unguarded baseline does instead of the Guard: one flat
// all-reduce, the way a plain DDP loop would (and, as the guard by default,
// no clipping).
double PlainAllReduce(c10d::ProcessGroup& pg, std::vector<torch::Tensor>& params, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (auto& p : params) {
    grads.push_back(p.grad().defined() ? p.grad().reshape({-1}) : torch::zeros({p.numel()}));
  }
  torch::Tensor flat = torch::cat(grads);
  std::vector<torch::Tensor> one = {flat};
  pg.allreduce(one)->wait();
  flat.div_(pg.getSize());
  const double norm = flat.norm().item<double>();
  if (max_norm > 0 && norm > max_norm) flat.mul_(max_norm / (norm + 1e-6));
  int64_t offset = 0;
  for (auto& p : params) {
    p.mutable_grad() = flat.narrow(0, offset, p.numel()).view(p.sizes());
    offset += p.numel();
  }
  return norm;
}

// Turn-taking between clusters sharing one machine, so that its drift (other
// tenants, clocks) falls on each of them alike: the overhead benchmark runs
// its loops this way. A turn starts once rank 0 reads its cluster's name in
// the file and every rank has passed a barrier; it ends after a barrier,
// with rank 0 naming the next cluster. Neither barrier is inside a timed
// step.
class Turns {
 public:
  Turns(c10d::ProcessGroup& pg, int rank, int first_step, int last_step)
      : pg_(pg), rank_(rank), first_(first_step), last_(last_step),
        file_(absl::GetFlag(FLAGS_turn_file)), name_(absl::GetFlag(FLAGS_turn_name)),
        next_(absl::GetFlag(FLAGS_turn_next)), steps_(absl::GetFlag(FLAGS_turn_steps)) {}

  // Before `step` is timed.
  void Begin(int step) {
    if (file_.empty() || (step - first_) % steps_ != 0) return;
    if (rank_ == 0) {
      while (true) {
        std::ifstream in(file_);
        std::string holder;
        std::getline(in, holder);
        if (holder == name_ || holder == "*") break;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    pg_.barrier()->wait();
  }

  // After `step` is timed and recorded.
  void End(int step) {
    if (file_.empty() || ((step - first_ + 1) % steps_ != 0 && step != last_)) return;
    pg_.barrier()->wait();
    if (rank_ != 0) return;
    const std::string tmp = file_ + "." + name_;
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << next_ << "\n";
    }
    if (std::rename(tmp.c_str(), file_.c_str()) != 0) {
      Die(absl::StrCat("--turn_file: renaming ", tmp, ": ", std::strerror(errno)));
    }
  }

 private:
  c10d::ProcessGroup& pg_;
  const int rank_, first_, last_;
  const std::string file_, name_, next_;
  const int steps_;
};

// Rank 0's checkpoint files: written provisional, renamed final when the
// guard says they are confirmed, deleted when revoked.
class CheckpointFiles {
 public:
  explicit CheckpointFiles(std::string dir) : dir_(std::move(dir)) {}

  // The weights and buffers at the top level, the optimizer's state under
  // "optimizer": what a restarted attempt needs to go on (LoadCheckpoint).
  void WriteProvisional(int step, torch::nn::Module& model, torch::optim::Optimizer& optimizer) {
    torch::serialize::OutputArchive archive;
    model.save(archive);
    torch::serialize::OutputArchive optimizer_state;
    optimizer.save(optimizer_state);
    archive.write("optimizer", optimizer_state);
    archive.save_to(Path(step, /*provisional=*/true));
    pending_.push_back(step);
  }

  // A restarted attempt: an earlier attempt's provisional files that sdcd
  // revoked after that attempt last asked (it was stopped first) go now.
  void DropRevoked(const protocol::CheckpointLedger& ledger) {
    for (const auto step : ledger.revoked()) {
      const std::string path = Path(static_cast<int>(step), /*provisional=*/true);
      if (std::remove(path.c_str()) == 0) {
        std::fprintf(stderr,
                     "sdc-trainer: checkpoint of step %d (an earlier attempt's) revoked and "
                     "deleted\n",
                     static_cast<int>(step));
      }
    }
  }

  void Reconcile(const protocol::CheckpointLedger& ledger) {
    std::vector<int> still;
    for (int step : pending_) {
      switch (ledger.Of(step)) {
        case protocol::CheckpointLedger::Standing::kFinal:
          if (std::rename(Path(step, true).c_str(), Path(step, false).c_str()) != 0) {
            Die(absl::StrCat("renaming ", Path(step, true), ": ", std::strerror(errno)));
          }
          std::fprintf(stderr, "sdc-trainer: checkpoint of step %d confirmed: %s\n", step,
                       Path(step, false).c_str());
          break;
        case protocol::CheckpointLedger::Standing::kRevoked:
          std::remove(Path(step, true).c_str());
          std::fprintf(stderr, "sdc-trainer: checkpoint of step %d revoked and deleted\n", step);
          break;
        case protocol::CheckpointLedger::Standing::kProvisional:
          still.push_back(step);
          break;
      }
    }
    pending_ = std::move(still);
  }

 private:
  std::string Path(int step, bool provisional) const {
    return absl::StrCat(dir_, "/step-", step, ".pt", provisional ? ".provisional" : "");
  }

  std::string dir_;
  std::vector<int> pending_;  // Written, still provisional.
};

// Loads what CheckpointFiles wrote into the model and optimizer (every
// rank reads the same file: identical replicas again).
void LoadCheckpoint(const std::string& path, torch::nn::Module& model,
                    torch::optim::Optimizer& optimizer) {
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(path);
    model.load(archive);
    torch::serialize::InputArchive optimizer_state;
    if (!archive.try_read("optimizer", optimizer_state)) {
      Die(absl::StrCat("--resume_from: ", path, " holds no optimizer state"));
    }
    optimizer.load(optimizer_state);
  } catch (const std::exception& e) {
    Die(absl::StrCat("--resume_from: cannot load ", path, ": ", e.what()));
  }
  std::fprintf(stderr, "sdc-trainer: resumed from %s\n", path.c_str());
}

// Compared across separate runs (guarded and plain), so under the fixed key.
uint64_t WeightsDigest(torch::nn::Module& model) {
  static const auto* key =
      new kernels::FingerprintKey(kernels::FingerprintKey::FromSeed(kernels::kFixedFingerprintSeed));
  kernels::ModelDigestBuilder d;
  for (const auto& item : model.named_parameters()) {
    torch::Tensor t = item.value().detach().contiguous();
    kernels::ByteSpan span{t.data_ptr(), static_cast<uint64_t>(t.numel()) * t.element_size()};
    kernels::Fingerprint fp;
    (void)kernels::FingerprintTensors({&span, 1}, *key, {&fp, 1});
    d.Add(item.key(), fp);
  }
  return d.Finish();
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "one rank of the demo's data-parallel training job (CPU, Gloo), guarded by sdc::Guard; "
      "sdc-guard's settings come from SDC_* environment variables.\n"
      "  sdc-trainer --rank=R --world_size=N --rendezvous=FILE [--steps=N] [--progress=FILE] ...");
  // --help lists the flags of the main file, which Abseil looks for by the
  // binary's name: sdc-trainer's are in trainer_main.cc.
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "demo/trainer_main.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  const std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) Die(absl::StrCat("unexpected argument '", rest[1], "' (see --help)"));
  // Abseil here is built with mutex deadlock detection on: a graph walk on
  // every lock. Production code does not pay for a debugging aid.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // Keep freed memory for the next step. glibc by default returns the top of
  // its heap to the kernel and moves its mmap threshold as blocks come and
  // go, so libtorch's activation and gradient buffers were faulted in afresh
  // each step; how often depended on every other allocation in the process,
  // the guard's included (a profile of the guarded loop showed 70% more page
  // faults than the unguarded one, and the guard's measured overhead fell
  // from 11 - 13% to 1.9 - 5.3% with this). CPU trainers in production use
  // jemalloc or tcmalloc for the same reason; GPU memory is cached by the
  // CUDA allocator. Both loops of the overhead benchmark run with it.
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  const int rank = absl::GetFlag(FLAGS_rank), world = absl::GetFlag(FLAGS_world_size);
  if (rank < 0 || world < 1 || rank >= world) Die("--rank and --world_size: need 0 <= rank < world_size");
  if (absl::GetFlag(FLAGS_rendezvous).empty()) Die("--rendezvous: a FileStore path is required");
  if (absl::GetFlag(FLAGS_micro_batches) < 1) Die("--micro_batches: must be at least 1");
  if (!absl::GetFlag(FLAGS_turn_file).empty() &&
      (absl::GetFlag(FLAGS_turn_name).empty() || absl::GetFlag(FLAGS_turn_next).empty())) {
    Die("--turn_file: needs --turn_name and --turn_next");
  }
  if (absl::GetFlag(FLAGS_turn_steps) < 1) Die("--turn_steps: must be at least 1");
  const std::string model_kind = absl::GetFlag(FLAGS_model);
  if (model_kind != "transformer" && model_kind != "bn-mlp" && model_kind != "center-mlp" &&
      model_kind != "put-mlp" && model_kind != "frozen-mlp") {
    Die("--model: transformer, bn-mlp, center-mlp, put-mlp or frozen-mlp");
  }
  torch::set_num_threads(1);  // Ranks share the CPUs; one thread keeps them deterministic.

  std::string corpus;
  if (model_kind == "transformer") {
    absl::StatusOr<std::string> c = LoadCorpus(absl::GetFlag(FLAGS_corpus));
    if (!c.ok()) Die(absl::StrCat("--corpus: ", c.status().message()));
    corpus = *std::move(c);
  }
  std::unique_ptr<client::GuardOptions> options;
  client::SmallCollectives small_collectives = client::SmallCollectives::kAuto;
  if (!absl::GetFlag(FLAGS_unguarded) || absl::GetFlag(FLAGS_extra_collective)) {
    absl::StatusOr<client::GuardOptions> o = client::OptionsFromEnvironment();
    if (!o.ok()) Die(std::string(o.status().message()));
    small_collectives = o->small_collectives;  // The extra collective runs as the guard's would.
    if (!absl::GetFlag(FLAGS_unguarded)) options = std::make_unique<client::GuardOptions>(*std::move(o));
  }

  const bool count = absl::GetFlag(FLAGS_count_collectives);
  auto issued = std::make_shared<std::atomic<int64_t>>(0);
  if (absl::GetFlag(FLAGS_collective_timeout_s) < 1) Die("--collective_timeout_s: must be at least 1");
  const std::chrono::milliseconds timeout =
      std::chrono::seconds(absl::GetFlag(FLAGS_collective_timeout_s));
  c10::intrusive_ptr<c10d::ProcessGroup> pg =
      count ? client::MakeCountingGlooGroup(absl::GetFlag(FLAGS_rendezvous), rank, world, issued,
                                            timeout)
            : client::MakeGlooGroup(absl::GetFlag(FLAGS_rendezvous), rank, world, timeout);

  torch::manual_seed(absl::GetFlag(FLAGS_seed));  // Identical initial replicas.
  std::shared_ptr<torch::nn::Module> model;
  TinyTransformer transformer{nullptr};
  BnMlp mlp{nullptr};
  LossFn loss_fn;
  const TransformerConfig config;
  if (model_kind == "transformer") {
    transformer = TinyTransformer(config);
    model = transformer.ptr();
    loss_fn = [transformer, &config](const std::vector<torch::Tensor>& b) mutable {
      torch::Tensor logits = transformer->forward(b[0]);
      return torch::nn::functional::cross_entropy(logits.view({-1, config.vocab}), b[1].view({-1}));
    };
  } else {
    mlp = BnMlp(model_kind == "center-mlp", model_kind == "put-mlp");
    if (model_kind == "frozen-mlp") mlp->Freeze();
    model = mlp.ptr();
    loss_fn = [mlp](const std::vector<torch::Tensor>& b) mutable {
      return torch::mse_loss(mlp->forward(b[0]), b[1]);
    };
  }
  model->train();
  torch::manual_seed(absl::GetFlag(FLAGS_seed) + 1000 * (rank + 1));  // Per-rank dropout streams.
  std::vector<torch::Tensor> params = model->parameters();
  torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(absl::GetFlag(FLAGS_lr)));

  if (!absl::GetFlag(FLAGS_resume_from).empty()) {
    LoadCheckpoint(absl::GetFlag(FLAGS_resume_from), *model, optimizer);
  }

  std::unique_ptr<Guard> guard;
  if (options != nullptr) {
    FrontEndOptions front_end;
    front_end.every_step = absl::GetFlag(FLAGS_every_step);
    absl::StatusOr<std::unique_ptr<Guard>> g = Guard::Create(*options, pg, *model, optimizer, loss_fn,
                                                       front_end);
    if (!g.ok()) Die(std::string(g.status().message()));
    guard = *std::move(g);
    Guard* raw = guard.get();
    auto hook = [raw](const torch::Tensor& x) { return raw->FaultPoint(x); };
    if (transformer) transformer->set_fault_hook(hook);
    if (mlp) mlp->set_fault_hook(hook);
  }

  std::ofstream progress;
  if (!absl::GetFlag(FLAGS_progress).empty()) progress.open(absl::GetFlag(FLAGS_progress), std::ios::app);
  const int first = absl::GetFlag(FLAGS_first_step);
  const int last = first + absl::GetFlag(FLAGS_steps) - 1;
  const int every = absl::GetFlag(FLAGS_checkpoint_every);
  std::unique_ptr<CheckpointFiles> files;
  if (rank == 0 && guard != nullptr && !absl::GetFlag(FLAGS_checkpoint_dir).empty()) {
    files = std::make_unique<CheckpointFiles>(absl::GetFlag(FLAGS_checkpoint_dir));
    if (!absl::GetFlag(FLAGS_resume_from).empty()) {
      absl::StatusOr<protocol::CheckpointLedger> ledger =
          guard->RefreshCheckpoints(absl::Seconds(5));
      if (ledger.ok()) {
        files->DropRevoked(*ledger);
      } else {
        std::fprintf(stderr, "sdc-trainer: checkpoint status unknown at the resume: %s\n",
                     std::string(ledger.status().message()).c_str());
      }
    }
  }
  Turns turns(*pg, rank, first, last);
  for (int step = first; step <= last; ++step) {
    turns.Begin(step);
    const int64_t issued_before = issued->load();
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::vector<torch::Tensor>> batches;
    for (int m = 0; m < absl::GetFlag(FLAGS_micro_batches); ++m) {
      const uint64_t seed = (static_cast<uint64_t>(step) * 1000003 + rank) * 31 + m;
      batches.push_back(model_kind == "transformer"
                            ? TextBatch(corpus, absl::GetFlag(FLAGS_batch), config.context, seed)
                            : RegressionBatch(absl::GetFlag(FLAGS_batch), seed));
    }
    const bool checkpoint = every > 0 && step % every == 0;
    double loss = 0;
    StepDecision d;
    if (guard != nullptr) {
      absl::StatusOr<StepDecision> r = guard->TrainStep(step, std::move(batches), checkpoint, &loss);
      if (!r.ok()) Die(absl::StrCat("step ", step, ": ", r.status().message()));
      d = *r;
    } else {
      // Gradients are views into the last step's flat buffer: drop them
      // (optimizer.zero_grad() cannot detach views in place).
      for (auto& p : params) p.mutable_grad() = torch::Tensor();
      for (auto& b : batches) {
        torch::Tensor l = loss_fn(b) / static_cast<double>(absl::GetFlag(FLAGS_micro_batches));
        l.backward();
        loss += l.item<double>();
      }
      d.grad_norm = PlainAllReduce(*pg, params, /*max_norm=*/0);
      if (absl::GetFlag(FLAGS_extra_collective)) {
        std::vector<int64_t> words(12, rank);
        client::AllReduceMax(*pg, small_collectives, words);
      }
      optimizer.step();
    }
    std::string checkpoint_result = "none";
    if (checkpoint && guard != nullptr) {
      absl::StatusOr<bool> may = guard->MayCheckpoint();
      checkpoint_result = may.ok() && *may ? "allowed" : "vetoed";
      if (files != nullptr) {
        if (may.ok() && *may) files->WriteProvisional(step, *model, optimizer);
      }
    }
    // Promote or delete on every step, not only at checkpoints: a launcher
    // that restarts the job resumes from what is final on disk.
    if (files != nullptr) files->Reconcile(guard->Checkpoints());
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (progress.is_open()) {
      StepRecord r;
      r.step = step;
      r.rank = rank;
      r.loss = loss;
      r.apply = d.apply;
      r.reason = d.reason;
      r.audited = d.audited;
      r.outcome = d.audit_outcome;
      r.unverified = d.audit_unverified;
      r.norm = d.grad_norm;
      r.repaired = d.repaired;
      r.checkpoint = checkpoint_result;
      r.ms = ms;
      r.check1_ms = d.check1_ms;
      r.agreement_ms = d.agreement_ms;
      r.audit_ms = d.audit_ms;
      r.weight_ms = d.weight_ms;
      r.end_unix_ms = absl::ToDoubleMilliseconds(absl::Now() - absl::UnixEpoch());
      if (count) r.collectives = static_cast<int>(issued->load() - issued_before);
      progress << StepLine(r) << std::endl;
    }
    turns.End(step);
  }
  // Every replica must end with the same weights; the digest says so.
  const uint64_t digest = WeightsDigest(*model);
  FinalRecord final_line;
  final_line.rank = rank;
  final_line.weights_digest = absl::StrFormat("%016x", digest);
  if (guard != nullptr) {
    guard->Shutdown(absl::Seconds(10));
    if (every > 0) {  // The same on every rank.
      // Every rank's reports are in once all have flushed: a revocation of
      // the last checkpoint is decided by then.
      pg->barrier()->wait();
    }
    if (files != nullptr) {
      absl::StatusOr<protocol::CheckpointLedger> ledger =
          guard->RefreshCheckpoints(absl::Seconds(5));
      if (ledger.ok()) {
        files->Reconcile(*ledger);
      } else {
        std::fprintf(stderr, "sdc-trainer: checkpoint status unknown at the end: %s\n",
                     std::string(ledger.status().message()).c_str());
      }
    }
    const GuardSummary s = guard->Summary();
    final_line.guard = {{"steps", s.steps},
                        {"skipped", s.skipped},
                        {"audits", s.audits},
                        {"unverified", s.audits_unverified},
                        {"mismatches", s.audit_mismatches},
                        {"weight_checks", s.weight_checks},
                        {"repairs", s.repairs},
                        {"checkpoints_allowed", s.checkpoints_allowed},
                        {"checkpoints_vetoed", s.checkpoints_vetoed},
                        {"reports_sent", s.reports_sent},
                        {"reports_acked", s.reports_acked},
                        {"reports_dropped", s.reports_dropped}};
    const ChecksumCounts c = guard->Checksums();
    if (c.every_step) {
      final_line.guard["products_checked"] = static_cast<int64_t>(c.checked);
      final_line.guard["products_unchecked"] = static_cast<int64_t>(c.unchecked);
      final_line.guard["checksum_alarms"] = static_cast<int64_t>(c.alarms);
      final_line.guard["checksum_skips"] = static_cast<int64_t>(c.skips);
    }
    std::fprintf(stderr, "sdc-guard rank %d summary: %s\n", rank, s.ToString().c_str());
  }
  if (progress.is_open()) progress << FinalLine(final_line) << std::endl;
  return 0;
}

}  // namespace
}  // namespace sdc::demo

int main(int argc, char** argv) { return sdc::demo::Main(argc, argv); }
