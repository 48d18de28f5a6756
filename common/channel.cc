#include "common/channel.h"

#include <fstream>
#include <sstream>

namespace sdc::common {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

grpc::ChannelArguments KeepaliveArguments() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  return args;
}

std::shared_ptr<grpc::Channel> MakeClientChannel(const ChannelOptions& options,
                                                 const grpc::ChannelArguments& args) {
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!options.tls_ca.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ReadFile(options.tls_ca);
    if (!options.tls_cert.empty()) {
      ssl.pem_cert_chain = ReadFile(options.tls_cert);
      ssl.pem_private_key = ReadFile(options.tls_key);
    }
    creds = grpc::SslCredentials(ssl);
  }
  return grpc::CreateCustomChannel(options.address, creds, args);
}

}  // namespace sdc::common
