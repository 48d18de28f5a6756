#include "protocol/types.h"

#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace sdc::protocol {

bool SoftwareStack::unknown() const {
  return driver.empty() && cuda.empty() && cublas.empty() && torch.empty() && device.empty() &&
         isa.empty();
}

uint64_t SoftwareStack::Digest() const {
  if (unknown()) return 0;
  uint64_t h = 0xcbf29ce484222325ull;
  for (const std::string* f : {&driver, &cuda, &cublas, &torch, &device, &isa}) {
    for (unsigned char c : *f) h = (h ^ c) * 0x100000001b3ull;
    h *= 0x100000001b3ull;  // The 0 byte between fields.
  }
  return h == 0 ? 1 : h;
}

std::string SoftwareStack::Describe() const {
  std::vector<std::string> parts;
  if (!driver.empty()) parts.push_back(absl::StrCat("driver ", driver));
  if (!cuda.empty()) parts.push_back(absl::StrCat("CUDA ", cuda));
  if (!cublas.empty()) parts.push_back(absl::StrCat("cuBLAS ", cublas));
  if (!torch.empty()) parts.push_back(absl::StrCat("torch ", torch));
  if (!device.empty()) parts.push_back(device);
  if (!isa.empty()) parts.push_back(absl::StrCat("ISA ", isa));
  return parts.empty() ? "unknown" : absl::StrJoin(parts, ", ");
}

std::string ShardCoordinates::Describe() const {
  if (!sharded()) return "";
  return absl::StrCat("replica ", replica, " of shard ", index, "/", count);
}

bool SoftwareStack::operator==(const SoftwareStack& o) const {
  return std::tie(driver, cuda, cublas, torch, device, isa) ==
         std::tie(o.driver, o.cuda, o.cublas, o.torch, o.device, o.isa);
}

const char* AuditRoleName(AuditRole role) {
  switch (role) {
    case AuditRole::kOriginal:
      return "original";
    case AuditRole::kReplay:
      return "replay";
    case AuditRole::kTieBreak:
      return "tiebreak";
    case AuditRole::kConfirm:
      return "confirm";
  }
  return "unknown";
}

}  // namespace sdc::protocol
