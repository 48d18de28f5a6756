#include "common/diagnostic_plan.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace sdc::common {

absl::StatusOr<Shape> ResolveShape(uint32_t size, uint32_t repetitions) {
  Shape shape;
  if (size != 0) shape.size = size;
  if (repetitions != 0) shape.repetitions = repetitions;
  if (shape.size > kMaxSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("size ", shape.size, " is out of range (1..", kMaxSize, ")"));
  }
  if (shape.repetitions > kMaxRepetitions) {
    return absl::InvalidArgumentError(absl::StrCat(
        "repetitions ", shape.repetitions, " is out of range (1..", kMaxRepetitions, ")"));
  }
  return shape;
}

absl::StatusOr<std::vector<PlannedDevice>> PlanDevices(const std::string& gpu_uuid,
                                                       const std::vector<GpuRef>& gpus) {
  std::vector<PlannedDevice> devices;
  if (gpu_uuid == kCpuDevice || (gpu_uuid.empty() && gpus.empty())) {
    devices.push_back({kCpuDevice, -1});
    return devices;
  }
  for (const GpuRef& g : gpus) {
    if (gpu_uuid.empty() || g.uuid == gpu_uuid) {
      devices.push_back({g.uuid, static_cast<int>(g.index)});
    }
  }
  if (devices.empty()) {
    std::vector<std::string> known;
    for (const GpuRef& g : gpus) known.push_back(g.uuid);
    return absl::NotFoundError(absl::StrCat(
        "no GPU ", gpu_uuid, " on this node (GPUs: ",
        known.empty() ? std::string("none") : absl::StrJoin(known, ", "), "; or \"cpu\")"));
  }
  return devices;
}

}  // namespace sdc::common
