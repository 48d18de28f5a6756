#include "common/identity.h"

#include "absl/strings/match.h"
#include "absl/strings/strip.h"

namespace sdc::common {
namespace {

bool OnlyFrom(absl::string_view s, absl::string_view punctuation) {
  for (char c : s) {
    const bool alnum =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (!alnum && punctuation.find(c) == absl::string_view::npos) return false;
  }
  return true;
}

}  // namespace

bool IsSafeNodeName(absl::string_view node) {
  return !node.empty() && node.size() <= 253 && node[0] != '-' && OnlyFrom(node, "._-");
}

bool IsSafeGpuId(absl::string_view gpu) {
  return !gpu.empty() && gpu.size() <= kMaxGpuIdLength && gpu[0] != '-' &&
         OnlyFrom(gpu, "._:/-");
}

bool IsInstanceId(absl::string_view text) {
  if (!absl::ConsumePrefix(&text, "i-")) return false;
  if (text.size() < 8 || text.size() > 17) return false;
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::string InstanceIdFromNodeName(absl::string_view node_name) {
  if (!absl::ConsumePrefix(&node_name, "hyperpod-")) return "";
  return IsInstanceId(node_name) ? std::string(node_name) : "";
}

std::string InstanceIdFromProviderId(absl::string_view provider_id) {
  provider_id = absl::StripAsciiWhitespace(provider_id);
  const size_t slash = provider_id.rfind('/');
  if (slash == absl::string_view::npos) return "";
  const absl::string_view last = provider_id.substr(slash + 1);
  if (IsInstanceId(last)) return std::string(last);
  const size_t at = last.rfind("-i-");
  if (at == absl::string_view::npos) return "";
  const absl::string_view id = last.substr(at + 1);
  return IsInstanceId(id) ? std::string(id) : "";
}

}  // namespace sdc::common
