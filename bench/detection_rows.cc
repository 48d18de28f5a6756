#include "bench/detection_rows.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/json_text.h"

namespace sdc::bench {

std::string RowJson(const ScenarioResult& r) {
  std::vector<std::string> positions;
  for (const FaultRun& run : r.runs) {
    positions.push_back(absl::StrCat("\"", JsonEscape(run.fault), "\""));
  }
  std::string json = absl::StrCat(
      "{\"runs\":", r.completed, ",\"detected\":", JsonNumberOrNull(r.detected_fraction()),
      ",\"attributed_correctly\":", JsonNumberOrNull(r.attributed_fraction()),
      ",\"mean_latency_steps\":", JsonNumberOrNull(r.mean_latency()),
      ",\"false_alarms\":", r.false_alarms, ",\"skipped_steps\":", r.skipped,
      ",\"bad_checkpoints_written\":", r.bad_checkpoints,
      ",\"bad_checkpoints_revoked\":", r.bad_checkpoints_revoked, ",\"errors\":", r.errors,
      ",\"fired\":", r.fired, ",\"nodes\":", r.nodes,
      r.scenario.replace_and_resume ? absl::StrCat(",", r.resume.JsonFields()) : "",
      r.layout == "ddp" ? "" : absl::StrCat(",\"checkpoints_vetoed\":", r.checkpoints_vetoed,
                                            ",\"suspected\":", r.suspected),
      r.layout == "tp" ? absl::StrCat(",\"tp_group_suspected\":", r.group_suspected) : "",
      ",\"goals_met\":", r.missed.empty() ? "true" : "false", ",\"missed\":[");
  for (size_t i = 0; i < r.missed.size(); ++i) {
    absl::StrAppend(&json, i > 0 ? "," : "", "\"", JsonEscape(r.missed[i]), "\"");
  }
  absl::StrAppend(&json, "],\"faults\":[", absl::StrJoin(positions, ","), "]}");
  return json;
}

bool InTpGroup(const std::vector<int>& suspects, int faulty, int tp) {
  if (suspects.empty() || tp < 1) return false;
  for (int r : suspects) {
    if (r / tp != faulty / tp) return false;
  }
  return true;
}

std::string SuspectCell(const ScenarioResult& r) {
  if (r.group_suspected == 0) return absl::StrCat(r.suspected);
  if (r.suspected == 0) return absl::StrCat(r.group_suspected, " tp group");
  return absl::StrCat(r.suspected, " + ", r.group_suspected, " tp group");
}

std::string Fraction(std::optional<double> v) {
  return v.has_value() ? absl::StrFormat("%.2f", *v) : "n/a";
}

}  // namespace sdc::bench
