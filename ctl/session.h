#ifndef SDC_CTL_SESSION_H_
#define SDC_CTL_SESSION_H_

// One run of one sdcctl command: its Config, its connection to sdcd, and
// where its output goes (stdout and stderr in the binary, memory in tests).
// Not thread-safe: one command runs at a time.

#include <cstdio>
#include <string>

#include "absl/strings/string_view.h"
#include "ctl/admin_client.h"
#include "ctl/config.h"
#include "grpcpp/support/status.h"

namespace sdc::sdcctl {

class Session {
 public:
  // `admin` is null for commands that need no server.
  Session(const Config& config, AdminClient* admin, std::FILE* out, std::FILE* err)
      : config_(config), admin_(admin), out_(out), err_(err) {}

  const Config& config() const { return config_; }
  // REQUIRES: the command needs the server (Needs::kServer).
  AdminClient& admin() { return *admin_; }

  // On stdout.
  void Print(absl::string_view text);
  // A list on stdout, or on stderr "No resources found." when it is empty
  // (as kubectl does; json and yaml still print the empty document).
  void PrintList(absl::string_view text, bool empty);
  // PrintList, without the header line under --no-headers (tables only).
  void PrintTable(absl::string_view text, bool empty);
  // On stderr.
  void Notice(absl::string_view text);
  // Flushes stdout (between lists of --watch).
  void Flush();

  // "sdcctl: error: MESSAGE" on stderr; returns `exit_code`.
  int Fail(int exit_code, absl::string_view message);
  // Fail for a failed call, with ExitCodeFor and RpcErrorMessage; when sdcd
  // did not accept the credential, also which one was sent. REQUIRES:
  // !status.ok().
  int Failed(const grpc::Status& status);

 private:
  const Config& config_;
  AdminClient* const admin_;
  std::FILE* const out_;
  std::FILE* const err_;
};

}  // namespace sdc::sdcctl

#endif  // SDC_CTL_SESSION_H_
