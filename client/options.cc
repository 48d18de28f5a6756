#include "client/options.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/identity.h"
#include "protocol/types.h"

namespace sdc::client {
namespace {

// The variables the options are read from: `overrides` first, then the
// process environment. An empty value counts as unset.
class Variables {
 public:
  explicit Variables(const std::map<std::string, std::string>& overrides)
      : overrides_(overrides) {}

  const char* Get(const char* name) const {
    auto it = overrides_.find(name);
    const char* v = it != overrides_.end() ? it->second.c_str() : std::getenv(name);
    return v != nullptr && *v != '\0' ? v : nullptr;
  }

 private:
  const std::map<std::string, std::string>& overrides_;
};

template <typename T>
absl::Status ReadInt(const Variables& vars, const char* name, T* out) {
  const char* v = vars.Get(name);
  if (v == nullptr) return absl::OkStatus();
  if (!absl::SimpleAtoi(v, out)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": expected a non-negative integer, got '", v, "'"));
  }
  return absl::OkStatus();
}

absl::Status ReadMillis(const Variables& vars, const char* name, absl::Duration* out) {
  int64_t ms = -1;
  if (absl::Status s = ReadInt(vars, name, &ms); !s.ok()) return s;
  if (vars.Get(name) != nullptr) {
    if (ms < 0) return absl::InvalidArgumentError(absl::StrCat(name, ": must not be negative"));
    *out = absl::Milliseconds(ms);
  }
  return absl::OkStatus();
}

// One of a few named values: "NAME: expected a, b or c, got 'x'" otherwise.
template <typename T>
absl::Status ReadChoice(const Variables& vars, const char* name,
                        std::initializer_list<std::pair<const char*, T>> choices, T* out) {
  const char* v = vars.Get(name);
  if (v == nullptr) return absl::OkStatus();
  std::string expected;
  size_t i = 0;
  for (const auto& [text, value] : choices) {
    if (std::strcmp(text, v) == 0) {
      *out = value;
      return absl::OkStatus();
    }
    absl::StrAppend(&expected, i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ", text);
    ++i;
  }
  return absl::InvalidArgumentError(absl::StrCat(name, ": expected ", expected, ", got '", v, "'"));
}

absl::StatusOr<JobId> ResolveJobId(const Variables& vars) {
  if (const char* v = vars.Get("SDC_JOB_ID")) return JobId{v, "SDC_JOB_ID"};
  if (const char* v = vars.Get("TORCHELASTIC_RUN_ID"); v != nullptr && std::strcmp(v, "none") != 0) {
    return JobId{v, "TORCHELASTIC_RUN_ID"};
  }
  if (const char* v = vars.Get("PET_RDZV_ID")) return JobId{v, "PET_RDZV_ID"};
  if (const char* v = vars.Get("SLURM_JOB_ID")) return JobId{v, "SLURM_JOB_ID"};
  return absl::NotFoundError(
      "SDC_JOB_ID: not set, and no launcher names the job (torchrun's TORCHELASTIC_RUN_ID is "
      "unset or \"none\", no PET_RDZV_ID, no SLURM_JOB_ID): set SDC_JOB_ID to the same value on "
      "every rank, or run torchrun with --rdzv_id=ID (or --standalone)");
}

}  // namespace

absl::StatusOr<JobId> JobIdFromVariables(const std::map<std::string, std::string>& overrides) {
  return ResolveJobId(Variables(overrides));
}

absl::Status CheckNodeName(const std::string& node_name) {
  if (common::IsSafeNodeName(node_name)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "node name '", node_name.substr(0, 40), node_name.size() > 40 ? "...' (" : "' (",
      node_name.size(), " bytes) is not a node name: [A-Za-z0-9._-], 1 to ",
      protocol::kMaxNodeNameBytes,
      " characters, not starting with '-'; sdcd refuses it. Set SDC_NODE_NAME"));
}

absl::StatusOr<GuardOptions> OptionsFromEnvironment() { return OptionsFromVariables({}); }

absl::StatusOr<GuardOptions> OptionsFromVariables(
    const std::map<std::string, std::string>& overrides) {
  const Variables vars(overrides);
  GuardOptions o;
  if (const char* v = vars.Get("SDC_COORDINATOR")) o.coordinator = v;
  absl::StatusOr<JobId> job = ResolveJobId(vars);
  if (!job.ok()) return absl::InvalidArgumentError(job.status().message());
  o.job_id = job->id;
  o.job_id_source = job->source;
  if (absl::Status s = ReadInt(vars, "LOCAL_RANK", &o.local_rank); !s.ok()) return s;
  if (const char* v = vars.Get("SDC_METRICS_LISTEN"); v != nullptr && *v != '\0') {
    const std::string text = v;
    const size_t colon = text.rfind(':');
    uint32_t port = 0;
    if (colon == std::string::npos || !absl::SimpleAtoi(text.substr(colon + 1), &port) ||
        port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SDC_METRICS_LISTEN: expected HOST:PORT (e.g. 0.0.0.0:9470), got '", text, "'"));
    }
    if (port != 0) port += o.local_rank;
    if (port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("SDC_METRICS_LISTEN: port ", port,
                                                     " (with LOCAL_RANK ", o.local_rank,
                                                     ") is above 65535"));
    }
    o.metrics_listen = absl::StrCat(text.substr(0, colon), ":", port);
  }
  if (const char* v = vars.Get("SDC_NODE_NAME")) {
    o.node_name = v;
  } else {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    o.node_name = host;
  }
  if (absl::Status s = CheckNodeName(o.node_name); !s.ok()) return s;
  if (const char* v = vars.Get("SDC_GPU_UUID")) {
    o.gpu_uuid = v;
    o.gpu_uuid_set = true;
  } else {
    o.gpu_uuid = absl::StrCat("cpu-", o.node_name, "-", o.local_rank);
  }
  if (absl::Status s = ReadInt(vars, "SDC_REPLICA_GROUP", &o.replica_group); !s.ok()) return s;
  if (absl::Status s = ReadInt(vars, "SDC_SHARD_INDEX", &o.shard_index); !s.ok()) return s;
  if (absl::Status s = ReadInt(vars, "SDC_SHARD_COUNT", &o.shard_count); !s.ok()) return s;
  if (absl::Status s = ReadInt(vars, "SDC_REPLICA_INDEX", &o.replica_index); !s.ok()) return s;
  if (o.shard_count == 0 && (o.shard_index != 0 || o.replica_index != 0)) {
    return absl::InvalidArgumentError(
        "SDC_SHARD_INDEX and SDC_REPLICA_INDEX need SDC_SHARD_COUNT (the layout's shard count)");
  }
  if (o.shard_count > 0 && o.shard_index >= o.shard_count) {
    return absl::InvalidArgumentError(absl::StrCat("SDC_SHARD_INDEX: ", o.shard_index,
                                                   " is not below SDC_SHARD_COUNT ",
                                                   o.shard_count));
  }
  if (o.shard_count > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("SDC_SHARD_COUNT: ", o.shard_count,
                     " is above 4096 (the step's agreement carries 4 words per shard)"));
  }
  o.incarnation = static_cast<uint64_t>(absl::ToUnixMillis(absl::Now()));
  if (absl::Status s = ReadInt(vars, "SDC_INCARNATION", &o.incarnation); !s.ok()) return s;
  uint64_t outer = 0;
  for (const char* name : {"SDC_ATTEMPT", "SLURM_RESTART_COUNT"}) {
    if (vars.Get(name) == nullptr) continue;
    if (absl::Status s = ReadInt(vars, name, &outer); !s.ok()) return s;
    if (outer >= (uint64_t{1} << 40)) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": at most 2^40 - 1, got ", outer));
    }
    o.attempt_set = true;
    break;
  }
  uint64_t restarts = 0;
  if (vars.Get("TORCHELASTIC_RESTART_COUNT") != nullptr) {
    if (absl::Status s = ReadInt(vars, "TORCHELASTIC_RESTART_COUNT", &restarts); !s.ok()) return s;
    if (restarts >= GuardOptions::kAttemptsPerOuter) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TORCHELASTIC_RESTART_COUNT: below ", GuardOptions::kAttemptsPerOuter, ", got ", restarts));
    }
    o.attempt_set = true;
  }
  o.attempt = outer * GuardOptions::kAttemptsPerOuter + restarts;
  if (absl::Status s = ReadInt(vars, "SDC_RESUME_STEP", &o.resume_step); !s.ok()) return s;
  if (absl::Status s = ReadInt(vars, "SDC_AUDIT_EVERY", &o.audit_every); !s.ok()) return s;
  if (absl::Status s = ReadInt(vars, "SDC_WEIGHT_CHECK_EVERY", &o.weight_check_every); !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadMillis(vars, "SDC_VERDICT_WAIT_MS", &o.verdict_wait); !s.ok()) return s;
  if (absl::Status s = ReadMillis(vars, "SDC_CHECKPOINT_WAIT_MS", &o.checkpoint_wait); !s.ok()) return s;
  if (absl::Status s = ReadChoice(vars, "SDC_CHECKPOINT_FALLBACK",
                                  {{"veto", CheckpointFallback::kVeto},
                                   {"in-band", CheckpointFallback::kInBand}},
                                  &o.checkpoint_fallback);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadInt(vars, "SDC_REPORT_BUFFER", &o.report_buffer); !s.ok()) return s;
  if (o.report_buffer == 0) return absl::InvalidArgumentError("SDC_REPORT_BUFFER: must be positive");
  size_t buffer_mb = o.report_buffer_bytes >> 20;
  if (absl::Status s = ReadInt(vars, "SDC_REPORT_BUFFER_MB", &buffer_mb); !s.ok()) return s;
  if (buffer_mb == 0 || buffer_mb > (size_t{1} << 20)) {
    return absl::InvalidArgumentError("SDC_REPORT_BUFFER_MB: must be 1 to 1048576");
  }
  o.report_buffer_bytes = buffer_mb << 20;
  if (absl::Status s = ReadMillis(vars, "SDC_RECONNECT_MAX_MS", &o.reconnect_max); !s.ok()) {
    return s;
  }
  if (o.reconnect_max < o.reconnect_min || o.reconnect_max > absl::Minutes(10)) {
    return absl::InvalidArgumentError("SDC_RECONNECT_MAX_MS: must be 100 to 600000");
  }
  if (absl::Status s = ReadMillis(vars, "SDC_REPORT_LINGER_MS", &o.report_linger); !s.ok()) return s;
  if (o.report_linger > absl::Seconds(60)) {
    // sdcd waits --report_deadline (default 120 s) for a step's reports.
    return absl::InvalidArgumentError("SDC_REPORT_LINGER_MS: at most 60000");
  }
  if (absl::Status s = ReadInt(vars, "SDC_BUCKET_BYTES", &o.bucket_bytes); !s.ok()) return s;
  if (o.bucket_bytes < 4096) {
    return absl::InvalidArgumentError("SDC_BUCKET_BYTES: must be at least 4096");
  }
  if (absl::Status s = ReadChoice(vars, "SDC_SMALL_COLLECTIVES",
                                  {{"auto", SmallCollectives::kAuto},
                                   {"backend", SmallCollectives::kBackend},
                                   {"rooted", SmallCollectives::kRooted}},
                                  &o.small_collectives);
      !s.ok()) {
    return s;
  }
  if (const char* v = vars.Get("SDC_MAX_GRAD_NORM")) {
    if (!absl::SimpleAtod(v, &o.max_grad_norm) || o.max_grad_norm < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("SDC_MAX_GRAD_NORM: expected a non-negative number, got '", v, "'"));
    }
  }
  for (const auto& [name, flag] : {std::pair<const char*, bool*>{"SDC_PARAMETER_FINGERPRINTS",
                                                                  &o.parameter_fingerprints},
                                   {"SDC_VOTE_BUFFERS", &o.vote_buffers},
                                   {"SDC_EVERY_STEP", &o.every_step}}) {
    if (const char* v = vars.Get(name)) {
      const std::string f = v;
      if (f != "0" && f != "1") return absl::InvalidArgumentError(absl::StrCat(name, ": expected 0 or 1"));
      *flag = f == "1";
    }
  }
  if (const char* v = vars.Get("SDC_TLS_CA")) o.tls_ca = v;
  if (const char* v = vars.Get("SDC_TLS_CERT")) o.tls_cert = v;
  if (const char* v = vars.Get("SDC_TLS_KEY")) o.tls_key = v;
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return absl::InvalidArgumentError("SDC_TLS_CERT and SDC_TLS_KEY go together");
  }
  const char* spec = vars.Get("SDC_INJECT_FAULT");
  const char* allow = vars.Get("SDC_ALLOW_FAULT_INJECTION");
  if (spec != nullptr) {
    if (allow == nullptr || std::string(allow) != "yes-i-am-testing") {
      return absl::InvalidArgumentError(
          "SDC_INJECT_FAULT is set but SDC_ALLOW_FAULT_INJECTION is not 'yes-i-am-testing': "
          "refusing to corrupt a real job");
    }
    absl::StatusOr<std::vector<FaultPlan>> plans = ParseFaultSpecs(spec);
    if (!plans.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("SDC_INJECT_FAULT: ", plans.status().message()));
    }
    o.faults = *std::move(plans);
  }
  return o;
}

}  // namespace sdc::client
