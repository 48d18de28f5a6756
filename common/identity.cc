#include "common/identity.h"

#include "absl/strings/match.h"
#include "absl/strings/strip.h"

namespace sdc::common {

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

}  // namespace sdc::common
