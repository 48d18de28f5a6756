#include "ctl/session.h"

#include "absl/strings/str_cat.h"
#include "ctl/errors.h"
#include "ctl/text.h"

namespace sdc::sdcctl {

void Session::Print(absl::string_view text) { std::fwrite(text.data(), 1, text.size(), out_); }

void Session::PrintList(absl::string_view text, bool empty) {
  if (empty) Notice("No resources found.\n");
  Print(text);
}

void Session::PrintTable(absl::string_view text, bool empty) {
  PrintList(config_.no_headers && IsTable(config_.output) ? WithoutHeaders(text) : text, empty);
}

void Session::Notice(absl::string_view text) { std::fwrite(text.data(), 1, text.size(), err_); }

void Session::Flush() { std::fflush(out_); }

int Session::Fail(int exit_code, absl::string_view message) {
  Notice(absl::StrCat("sdcctl: error: ", message, "\n"));
  return exit_code;
}

int Session::Failed(const grpc::Status& status) {
  std::string message = RpcErrorMessage(status, config_.connection.server);
  if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED && admin_ != nullptr) {
    absl::StrAppend(&message, " (sdcctl sent ", admin_->credential(), ")");
  }
  return Fail(ExitCodeFor(status.error_code()), message);
}

}  // namespace sdc::sdcctl
