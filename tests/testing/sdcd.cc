#include "tests/testing/sdcd.h"

#include <unistd.h>

#include <regex>

#include "absl/strings/numbers.h"
#include "grpcpp/generic/generic_stub.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "tests/testing/scripted_rank.h"

namespace sdc::testing {

absl::StatusOr<std::unique_ptr<Sdcd>> Sdcd::Start(const std::string& dir,
                                                  const std::vector<std::string>& extra_flags,
                                                  const std::map<std::string, std::string>& env,
                                                  int trainer_port, int admin_port,
                                                  int metrics_port) {
  return Launch(dir, extra_flags, env, trainer_port, admin_port, metrics_port,
                /*insecure_dev_mode=*/true);
}

absl::StatusOr<std::unique_ptr<Sdcd>> Sdcd::Launch(const std::string& dir,
                                                   const std::vector<std::string>& extra_flags,
                                                   const std::map<std::string, std::string>& env,
                                                   int trainer_port, int admin_port,
                                                   int metrics_port, bool insecure_dev_mode) {
  auto d = std::make_unique<Sdcd>();
  d->dir_ = dir;
  std::vector<std::string> argv = {
      BinaryPath("daemon/sdcd"),
      absl::StrCat("--db=", dir, "/sdcd.db"),
      absl::StrCat("--admin_token_file=", dir, "/admin.token"),
      absl::StrCat("--listen=127.0.0.1:", trainer_port),
      absl::StrCat("--admin_listen=127.0.0.1:", admin_port),
      absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port)};
  // An --agent_listen among the flags wins (absl: the last one).
  argv.push_back("--agent_listen=127.0.0.1:0");
  if (insecure_dev_mode) argv.push_back("--insecure_dev_mode");
  argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
  absl::StatusOr<Process> p = Process::Start(argv, dir + "/sdcd.log", env);
  if (!p.ok()) return p.status();
  d->process_ = *std::move(p);
  absl::StatusOr<std::string> line =
      d->process_.WaitForLog("serving trainers on .*");
  if (!line.ok()) return line.status();
  auto number_after = [&](const std::string& prefix) {
    const size_t at = line->find(prefix);
    int n = 0;
    if (at != std::string::npos) {
      const std::string rest = line->substr(at + prefix.size());
      (void)absl::SimpleAtoi(rest.substr(0, rest.find_first_not_of("0123456789")), &n);
    }
    return n;
  };
  d->trainer_port_ = number_after("(port ");
  const size_t admin_at = line->find("admin on");
  d->admin_port_ = 0;
  if (admin_at != std::string::npos) {
    const size_t p2 = line->find("(port ", admin_at);
    int n = 0;
    const std::string rest = line->substr(p2 + 6);
    (void)absl::SimpleAtoi(rest.substr(0, rest.find_first_not_of("0123456789")), &n);
    d->admin_port_ = n;
  }
  d->metrics_port_ = number_after("metrics on port ");
  if (const size_t agents_at = line->find("agents on "); agents_at != std::string::npos) {
    const size_t p2 = line->find("(port ", agents_at);
    const size_t comma = line->find(',', agents_at);
    if (p2 != std::string::npos && p2 < comma) {
      const std::string rest = line->substr(p2 + 6);
      (void)absl::SimpleAtoi(rest.substr(0, rest.find_first_not_of("0123456789")),
                             &d->agent_port_);
    }
  }
  if (d->trainer_port_ == 0 || d->admin_port_ == 0 || d->metrics_port_ == 0) {
    return absl::InternalError(absl::StrCat("cannot read ports from: ", *line));
  }
  return d;
}

absl::StatusOr<std::unique_ptr<Sdcd>> Sdcd::StartWithIdentities(
    const std::string& dir, const std::vector<std::string>& nodes,
    const std::vector<std::string>& extra_flags, const std::map<std::string, std::string>& env,
    int trainer_port, int agent_port) {
  const std::string pki_dir = dir + "/pki";
  absl::StatusOr<demo::ClusterPki> pki;
  if (access((pki_dir + "/ca.pem").c_str(), R_OK) == 0) {
    // A restart: the agents and ranks still hold this CA's certificates.
    demo::ClusterPki kept;
    kept.dir = pki_dir;
    kept.ca = pki_dir + "/ca.pem";
    kept.server_cert = pki_dir + "/server.pem";
    kept.server_key = pki_dir + "/server.key";
    pki = kept;
  } else {
    Run({"mkdir", "-p", pki_dir});
    pki = demo::WriteClusterPki(pki_dir, nodes);
  }
  if (!pki.ok()) return pki.status();
  std::vector<std::string> flags = {absl::StrCat("--tls_cert=", pki->server_cert),
                                    absl::StrCat("--tls_key=", pki->server_key),
                                    absl::StrCat("--tls_client_ca=", pki->ca),
                                    absl::StrCat("--agent_listen=127.0.0.1:", agent_port)};
  flags.insert(flags.end(), extra_flags.begin(), extra_flags.end());
  absl::StatusOr<std::unique_ptr<Sdcd>> d =
      Launch(dir, flags, env, trainer_port, 0, 0, /*insecure_dev_mode=*/false);
  if (!d.ok()) return d.status();
  (*d)->pki_ = *std::move(pki);
  return d;
}

std::shared_ptr<grpc::Channel> Sdcd::NodeChannel(const std::string& node) const {
  return TlsChannel(trainer_address(), pki_.ca, node.empty() ? "" : pki_.NodeCert(node),
                    node.empty() ? "" : pki_.NodeKey(node));
}

std::shared_ptr<grpc::Channel> Sdcd::NodeAgentChannel(const std::string& node) const {
  return TlsChannel(agent_address(), pki_.ca, node.empty() ? "" : pki_.NodeCert(node),
                    node.empty() ? "" : pki_.NodeKey(node));
}

std::vector<std::string> Sdcd::AgentTlsFlags(const std::string& node) const {
  return {absl::StrCat("--tls_ca=", pki_.ca), absl::StrCat("--tls_cert=", pki_.NodeCert(node)),
          absl::StrCat("--tls_key=", pki_.NodeKey(node))};
}

std::unique_ptr<v1::AdminService::Stub> Sdcd::Admin() const {
  return v1::AdminService::NewStub(Channel(admin_address()));
}

std::unique_ptr<grpc::ClientContext> Sdcd::AdminContext() const {
  auto c = std::make_unique<grpc::ClientContext>();
  c->AddMetadata("authorization",
                 absl::StrCat("Bearer ", absl::StripAsciiWhitespace(ReadFile(token_file()))));
  c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return c;
}

RunResult Sdcd::Sdcctl(const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {BinaryPath("ctl/sdcctl"),
                                   absl::StrCat("--server=", admin_address()),
                                   absl::StrCat("--token_file=", token_file())};
  argv.insert(argv.end(), args.begin(), args.end());
  // $USER is not who decides (sdcd records the credential's operator); it
  // is set so that a regression to trusting it shows.
  return Run(argv, {{"USER", "test-operator"}});
}

absl::Status WriteTestCertificates(const std::string& dir) {
  RunResult r = Run(
      {"sh", "-c",
       absl::StrCat(
           "cd ", dir, " && ",
           "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 "
           "-subj /CN=sdc-test-ca && ",
           "openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr "
           "-subj /CN=localhost && ",
           "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1' > san.ext && ",
           "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
           "-out server.pem -days 2 -extfile san.ext && ",
           "openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr "
           "-subj /CN=sdc-client && ",
           "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
           "-out client.pem -days 2")});
  if (r.exit_code != 0) {
    return absl::InternalError(absl::StrCat("openssl failed (exit ", r.exit_code, "): ", r.output));
  }
  return absl::OkStatus();
}

double Sdcd::Rejected(const std::string& reason) const {
  return Counter("sdc_rejected_inputs_total", "reason", reason);
}

double Sdcd::Counter(const std::string& name, const std::string& label,
                     const std::string& value) const {
  absl::StatusOr<std::string> body = HttpGet(metrics_port_, "/metrics");
  if (!body.ok()) return -1;
  const std::regex re(name + "\\{" + label + "=\"" + value + "\"\\} ([0-9.e+]+)");
  std::smatch m;
  return std::regex_search(*body, m, re) ? std::stod(m[1].str()) : 0;
}

grpc::Status SendRawFrame(const std::shared_ptr<grpc::Channel>& channel,
                          const std::string& method, const std::string& frame) {
  return SendRawFrames(channel, method, {frame});
}

grpc::Status SendRawFrames(const std::shared_ptr<grpc::Channel>& channel,
                           const std::string& method, const std::vector<std::string>& frames) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub.PrepareCall(&context, method, &cq);
  // One operation at a time; each waits for its own tag, and one that fails
  // (the server ended the call) ends the exchange.
  intptr_t next_tag = 1;
  auto wait = [&cq](intptr_t tag) {
    void* got = nullptr;
    bool ok = false;
    return cq.Next(&got, &ok) && reinterpret_cast<intptr_t>(got) == tag && ok;
  };
  call->StartCall(reinterpret_cast<void*>(next_tag));
  bool open = wait(next_tag++);
  for (size_t i = 0; open && i < frames.size(); ++i) {
    grpc::Slice slice(frames[i].data(), frames[i].size());
    grpc::ByteBuffer buffer(&slice, 1);
    call->Write(buffer, reinterpret_cast<void*>(next_tag));
    open = wait(next_tag++);
  }
  if (open) {
    call->WritesDone(reinterpret_cast<void*>(next_tag));
    open = wait(next_tag++);
  }
  grpc::ByteBuffer reply;
  do {
    call->Read(&reply, reinterpret_cast<void*>(next_tag));
  } while (wait(next_tag++));
  grpc::Status status;
  const intptr_t finish = next_tag;
  call->Finish(&status, reinterpret_cast<void*>(finish));
  void* got = nullptr;
  bool ok = false;
  while (cq.Next(&got, &ok) && reinterpret_cast<intptr_t>(got) != finish) {
  }
  cq.Shutdown();
  while (cq.Next(&got, &ok)) {
  }
  return status;
}

}  // namespace sdc::testing
