#include "daemon/core/coordinator_internal.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace sdc::core::internal {
namespace {

constexpr size_t kMaxListedRanks = 8;

}  // namespace

std::string Echo(absl::string_view value) {
  std::string out = "'";
  for (char c : value.substr(0, 64)) {
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += c;
    } else {
      absl::StrAppendFormat(&out, "\\x%02x", static_cast<unsigned char>(c));
    }
  }
  out += "'";
  if (value.size() > 64) absl::StrAppend(&out, " (", value.size(), " characters)");
  return out;
}

std::string EchoJobId(const std::string& id) {
  if (id.size() <= kMaxJobIdLength) return id;
  return absl::StrCat(id.substr(0, 32), "... (", id.size(), " characters)");
}

std::string RankList(const std::vector<Rank>& ranks) {
  if (ranks.size() <= kMaxListedRanks) return absl::StrJoin(ranks, ", ");
  std::vector<Rank> head(ranks.begin(), ranks.begin() + kMaxListedRanks);
  return absl::StrCat(absl::StrJoin(head, ", "), ", ... (", ranks.size(), " ranks)");
}

std::vector<Rank> ToVector(const std::set<Rank>& s) { return {s.begin(), s.end()}; }

PendingKey KeyOf(const Report& r) { return {r.job_id, r.rank, r.incarnation, r.sequence}; }

std::string IdentityKey(const RankRecord& r) {
  return r.identity.empty() ? absl::StrCat("?", r.placement.node) : r.identity;
}

std::string IdentityClass(const std::string& key) {
  return absl::StartsWith(key, "?") ? "" : key;
}

}  // namespace sdc::core::internal
