#include "daemon/rank_session.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/version.h"
#include "daemon/convert.h"
#include "daemon/grpc_edge.h"

namespace sdc::daemon {

grpc::Status RankSession::Handle(const v1::TrainerMessage& in, uint64_t* acked) {
  if (!attached_) {
    if (!in.has_hello()) {
      return {grpc::StatusCode::INVALID_ARGUMENT,
              "the first message of a stream must be a Hello"};
    }
    return Attach(in.hello());
  }
  if (in.has_hello()) {
    return {grpc::StatusCode::INVALID_ARGUMENT, "a stream says Hello only once"};
  }
  if (!in.has_report()) {
    return {grpc::StatusCode::INVALID_ARGUMENT, "a message with neither a Hello nor a report"};
  }
  const v1::Report& report = in.report();
  if (report.job_id() != job_ || report.rank() != rank_) {
    return {grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("report for job ", report.job_id(), " rank ", report.rank(),
                         " on the stream of job ", job_, " rank ", rank_)};
  }
  using Kind = ServiceMetrics::ReportKind;
  const Kind kind = report.has_step_report() ? Kind::kStep
                    : report.has_audit()     ? Kind::kAudit
                                             : Kind::kWeights;
  context_.metrics->Report(kind, report.ByteSizeLong());
  absl::StatusOr<core::Report> converted = FromProto(report);
  if (!converted.ok()) return ToGrpc(converted.status());
  absl::StatusOr<core::Effects> effects = context_.coordinator->Ingest(*converted);
  if (!effects.ok()) {
    // A report that contradicts what the rank said or is malformed is
    // consumed: acknowledged with the refusal, so the rank drops it and its
    // later reports flow on (ending the stream made the rank resend it, and
    // everything behind it, forever). The refusal is logged and counted.
    const absl::StatusCode code = effects.status().code();
    if (code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kAlreadyExists) {
      absl::StatusOr<core::Effects> consumed =
          context_.coordinator->Consume(*converted, effects.status());
      if (consumed.ok()) {
        context_.metrics->Rejected(RejectReason(code));
        v1::CoordinatorMessage ack;
        ack.mutable_ack()->set_acked_sequence(consumed->acked_sequence);
        ack.mutable_ack()->set_refused_sequence(converted->sequence);
        ack.mutable_ack()->set_refused_reason(std::string(effects.status().message()));
        std::shared_ptr<Outbox> outbox = outbox_;
        // Whatever carries the session (a relay included): the rank must
        // read which report was refused, so this acknowledgement is never
        // folded into a plain watermark (common/ack.h).
        context_.delivery->Deliver(*std::move(consumed), [outbox, ack](absl::Status s) {
          if (s.ok()) outbox->Push(ack);
        });
        return grpc::Status::OK;
      }
    }
    return ToGrpc(effects.status());
  }
  if (acked != nullptr) {
    *acked = effects->acked_sequence;
    context_.delivery->Deliver(*std::move(effects));
    return grpc::Status::OK;
  }
  v1::CoordinatorMessage ack;
  ack.mutable_ack()->set_acked_sequence(effects->acked_sequence);
  std::shared_ptr<Outbox> outbox = outbox_;
  // The acknowledgement goes out only once the report is durable.
  context_.delivery->Deliver(*std::move(effects), [outbox, ack](absl::Status s) {
    if (s.ok()) outbox->Push(ack);
  });
  return grpc::Status::OK;
}

core::Caller RankSession::CallerFor(const core::Hello& hello) const {
  auto gpus = [&](const std::string& node) {
    return context_.node_gpus ? context_.node_gpus(node) : std::vector<std::string>{};
  };
  if (!identity_.relay_node.empty()) {
    return {identity_.relay_node, "relay", gpus(identity_.relay_node)};
  }
  const std::vector<std::string>& certified = identity_.certificate_nodes;
  if (std::find(certified.begin(), certified.end(), hello.placement.node) != certified.end()) {
    return {hello.placement.node, "certificate", gpus(hello.placement.node)};
  }
  // A certificate for another node: the coordinator refuses the Hello.
  if (!certified.empty()) return {certified.front(), "certificate", {}};
  if (identity_.trust_stated) {
    return {hello.placement.node, NodeAuthenticator::kStated, gpus(hello.placement.node)};
  }
  return {};
}

grpc::Status RankSession::Attach(const v1::Hello& in) {
  core::Hello hello = FromProto(in);
  // The relay overwrites the field: a relayed rank runs on its relay's node.
  if (!identity_.relay_node.empty()) hello.placement.node = identity_.relay_node;
  absl::StatusOr<core::AttachResult> result =
      context_.coordinator->Attach(hello, CallerFor(hello));
  if (!result.ok()) return ToGrpc(result.status());
  attached_ = true;
  job_ = hello.job_id;
  rank_ = hello.placement.rank;
  incarnation_ = hello.incarnation;
  context_.streams->Register(job_, rank_, outbox_);
  v1::CoordinatorMessage welcome;
  welcome.mutable_welcome()->set_acked_sequence(result->acked_sequence);
  welcome.mutable_welcome()->set_coordinator_version(kVersion);
  welcome.mutable_welcome()->set_attempt(result->attempt);
  welcome.mutable_welcome()->set_resume_warning(result->resume_warning);
  for (const core::PlanMessage& p : result->pending_plans) {
    *welcome.mutable_welcome()->add_pending_plans() = ToProto(p);
  }
  std::shared_ptr<Outbox> outbox = outbox_;
  context_.delivery->Deliver(std::move(result->effects), [outbox, welcome](absl::Status s) {
    if (s.ok()) outbox->Push(welcome);
  });
  return grpc::Status::OK;
}

void RankSession::Close() {
  if (!attached_) return;
  attached_ = false;
  if (context_.streams->Unregister(job_, rank_, outbox_.get())) {
    context_.coordinator->Detach(job_, rank_, incarnation_);
  }
}

}  // namespace sdc::daemon
