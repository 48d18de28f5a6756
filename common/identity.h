#ifndef SDC_COMMON_IDENTITY_H_
#define SDC_COMMON_IDENTITY_H_

// HyperPod instance ids and the node names that embed them. Pure functions;
// thread-safe.

#include <string>

#include "absl/strings/string_view.h"

namespace sdc::common {

// "i-" followed by 8 to 17 lowercase hex digits (EC2's two id formats).
bool IsInstanceId(absl::string_view text);

// The instance id a HyperPod EKS node name embeds ("hyperpod-i-0123456789abcdef0"
// gives "i-0123456789abcdef0"): "hyperpod-" followed by an instance id and
// nothing else. "" for any other name.
std::string InstanceIdFromNodeName(absl::string_view node_name);

}  // namespace sdc::common

#endif  // SDC_COMMON_IDENTITY_H_
