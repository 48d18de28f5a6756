#include "ctl/admin_client.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace sdc::sdcctl {
namespace {

// sdcd sends messages of up to 16 MiB (kMaxMessageBytes in daemon/grpc_edge.h);
// gRPC clients accept 4 MiB by default.
constexpr int kMaxReceiveBytes = 16 << 20;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": ", std::strerror(errno)));
  }
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), f)) > 0) out.append(buffer, n);
  const bool failed = std::ferror(f) != 0;
  const int error = errno;
  std::fclose(f);
  if (failed) return absl::FailedPreconditionError(absl::StrCat(path, ": ", std::strerror(error)));
  return out;
}

}  // namespace

absl::StatusOr<Credentials> LoadCredentials(const Connection& c) {
  Credentials creds;
  absl::StatusOr<std::string> token = ReadFile(c.token_file);
  if (token.ok()) {
    creds.bearer_token = std::string(absl::StripAsciiWhitespace(*token));
    if (creds.bearer_token.empty() && c.tls_cert.empty()) {
      return absl::PermissionDeniedError(
          absl::StrCat("the admin token file ", c.token_file, " is empty"));
    }
  } else if (c.tls_cert.empty()) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot read the admin token: ", token.status().message(),
                     " (pass --token_file=PATH or set $SDC_ADMIN_TOKEN_FILE, or use --tls_cert)"));
  }
  creds.description = creds.bearer_token.empty()
                          ? absl::StrCat("the client certificate ", c.tls_cert)
                          : absl::StrCat("the token in ", c.token_file);
  if (c.tls_ca.empty() && c.tls_cert.empty()) {
    creds.channel = grpc::InsecureChannelCredentials();
    return creds;
  }
  grpc::SslCredentialsOptions options;
  if (!c.tls_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadFile(c.tls_ca);
    if (!ca.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("--tls_ca: ", ca.status().message()));
    }
    options.pem_root_certs = *ca;
  }
  if (!c.tls_cert.empty()) {
    absl::StatusOr<std::string> cert = ReadFile(c.tls_cert);
    if (!cert.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("--tls_cert: ", cert.status().message()));
    }
    absl::StatusOr<std::string> key = ReadFile(c.tls_key);
    if (!key.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("--tls_key: ", key.status().message()));
    }
    options.pem_cert_chain = *cert;
    options.pem_private_key = *key;
  }
  creds.channel = grpc::SslCredentials(options);
  return creds;
}

AdminClient::AdminClient(const Connection& connection, const Credentials& credentials)
    : timeout_(connection.timeout),
      bearer_token_(credentials.bearer_token),
      credential_(credentials.description) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxReceiveBytes);
  args.SetUserAgentPrefix("sdcctl");
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(connection.server, credentials.channel, args);
  admin_ = v1::AdminService::NewStub(channel);
  nodes_ = v1::NodeAdminService::NewStub(channel);
}

void AdminClient::Prepare(grpc::ClientContext* context) const {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
  if (!bearer_token_.empty()) {
    context->AddMetadata("authorization", absl::StrCat("Bearer ", bearer_token_));
  }
}

}  // namespace sdc::sdcctl
