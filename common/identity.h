#ifndef SDC_COMMON_IDENTITY_H_
#define SDC_COMMON_IDENTITY_H_

// The identities that trainers and agents send, and that reach actuators,
// logs and the database: node names, GPU ids, HyperPod instance ids. sdcd,
// sdc-agent and the trainer client apply the same rules. Pure functions;
// thread-safe.

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace sdc::common {

// A node name: [A-Za-z0-9._-], 1 to 253 characters, not starting with '-' (a
// Kubernetes or Slurm node name; safe as a command argument).
bool IsSafeNodeName(absl::string_view node);

// A GPU id: NVML's UUID ("GPU-" and hex, "MIG-..."), or a stand-in such as
// "cpu-<node>-<local_rank>": [A-Za-z0-9._:/-], 1 to kMaxGpuIdLength
// characters, not starting with '-'.
inline constexpr size_t kMaxGpuIdLength = 300;
bool IsSafeGpuId(absl::string_view gpu);

// "i-" followed by 8 to 17 lowercase hex digits (EC2's two id formats).
bool IsInstanceId(absl::string_view text);

// The instance id a HyperPod EKS node name embeds ("hyperpod-i-0123456789abcdef0"
// gives "i-0123456789abcdef0"): "hyperpod-" followed by an instance id and
// nothing else. "" for any other name.
std::string InstanceIdFromNodeName(absl::string_view node_name);

// The instance id a Kubernetes Node's spec.providerID names: its last
// '/'-separated part when that is an instance id ("aws:///us-west-2a/i-0abc..."),
// or that part's suffix after its last '-' that starts an instance id
// (HyperPod: ".../hyperpod-<cluster>-i-0abc..."). "" for anything else.
// The providerID is the cluster's record of the node (kubelet and the cloud
// controller set it), not what a caller says.
std::string InstanceIdFromProviderId(absl::string_view provider_id);

}  // namespace sdc::common

#endif  // SDC_COMMON_IDENTITY_H_
