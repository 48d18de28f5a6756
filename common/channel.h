#ifndef SDC_COMMON_CHANNEL_H_
#define SDC_COMMON_CHANNEL_H_

// The channel every sdcd client dials with (trainer ranks, node agents):
// keepalive that sdcd's server settings accept (pings every 10 s or more)
// and, when a CA is given, TLS with an optional client certificate.

#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"

namespace sdc::common {

struct ChannelOptions {
  std::string address;  // host:port
  std::string tls_ca;   // PEM file; empty: plaintext.
  std::string tls_cert; // Client certificate and key (PEM files), optional.
  std::string tls_key;
};

// Keepalive: a ping after 30 s idle, 10 s to answer, also without calls.
grpc::ChannelArguments KeepaliveArguments();

// `args` usually starts from KeepaliveArguments().
std::shared_ptr<grpc::Channel> MakeClientChannel(const ChannelOptions& options,
                                                 const grpc::ChannelArguments& args);

}  // namespace sdc::common

#endif  // SDC_COMMON_CHANNEL_H_
