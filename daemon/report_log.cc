#include "daemon/report_log.h"

namespace sdc::daemon {
namespace {

void AppendVarint(std::string* out, uint64_t v) {
  uint8_t buf[10];  // The longest varint of 64 bits.
  uint8_t* end = google::protobuf::io::CodedOutputStream::WriteVarint64ToArray(v, buf);
  out->append(reinterpret_cast<const char*>(buf), end - buf);
}

}  // namespace

void AppendLogEntry(std::string* blob, int64_t arrival, absl::string_view report) {
  AppendVarint(blob, static_cast<uint64_t>(arrival));
  AppendVarint(blob, report.size());
  blob->append(report.data(), report.size());
}

void AppendLogEntry(std::string* blob, int64_t arrival, const v1::Report& report) {
  AppendVarint(blob, static_cast<uint64_t>(arrival));
  const size_t size = report.ByteSizeLong();
  AppendVarint(blob, size);
  const size_t at = blob->size();
  blob->resize(at + size);
  report.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(&(*blob)[at]));
}

}  // namespace sdc::daemon
