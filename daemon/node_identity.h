#ifndef SDC_DAEMON_NODE_IDENTITY_H_
#define SDC_DAEMON_NODE_IDENTITY_H_

// How a caller of sdcd's trainer or agent port proves which node it is
// (docs/operations.md, "Trust model"; the rule Kubernetes' NodeRestriction
// applies to kubelets: evidence about a node counts only from a caller
// proven to be that node).
//
//   certificate  a TLS client certificate that chains to sdcd's client CA
//                (--tls_client_ca) proves the node its DNS subject
//                alternative name gives (a node name: [A-Za-z0-9._-]);
//   token        on EKS, the agent pod's projected service-account token
//                (audience "sdcd", daemon/service_account_token.h) proves
//                the node its pod runs on, as the API server wrote it.
//
// A node agent (AgentService.Connect, TrainerService.Relay on the agent
// port) must prove exactly one node. A trainer's direct stream proves its
// node with a node certificate, or nothing (an unauthenticated rank: its
// reports are recorded, its evidence never opens a replacement request).
// The insecure development mode (sdcd --insecure_dev_mode, loopback only)
// takes what callers say, as sdcd did before node identities.

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/core/clock.h"
#include "daemon/service_account_token.h"
#include "grpcpp/grpcpp.h"

namespace sdc::daemon {

// What a call presented.
struct PeerCredentials {
  // The DNS subject alternative names of its verified client certificate
  // that are node names (common::IsSafeNodeName).
  std::vector<std::string> certificate_nodes;
  // The token of an `authorization: Bearer TOKEN` header, when sent.
  std::optional<std::string> bearer;
};

// The credentials of the call `context` serves.
PeerCredentials CredentialsOf(const grpc::ServerContextBase& context);

// A node a call proved, and how ("certificate", "service-account token of
// pod NS/NAME"). An empty node in the insecure development mode: the caller
// proved nothing and is taken at its word.
struct ProvenNode {
  std::string node;
  std::string proof;
};

// Thread-safe.
class NodeAuthenticator {
 public:
  // `tokens` (may be null: tokens are refused) and `clock` outlive this.
  NodeAuthenticator(const TokenVerifier* tokens, const core::Clock* clock,
                    bool insecure_dev_mode)
      : tokens_(tokens), clock_(clock), insecure_dev_mode_(insecure_dev_mode) {}

  // The one node a node agent's call proves. Unauthenticated (saying what
  // was missing or wrong) when it proves none, or a certificate names
  // several; PermissionDenied when a certificate and a token name different
  // nodes. In the development mode a call without credentials proves
  // ProvenNode{"", "stated (--insecure_dev_mode)"}.
  absl::StatusOr<ProvenNode> Agent(const PeerCredentials& credentials) const;

  bool insecure_dev_mode() const { return insecure_dev_mode_; }

  // The proof a development-mode caller's word stands for.
  static constexpr char kStated[] = "stated (--insecure_dev_mode)";

 private:
  const TokenVerifier* const tokens_;
  const core::Clock* const clock_;
  const bool insecure_dev_mode_;
};

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_NODE_IDENTITY_H_
