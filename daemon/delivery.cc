#include "daemon/delivery.h"

#include <algorithm>

#include "daemon/convert.h"

namespace sdc::daemon {

void Delivery::Deliver(core::Effects effects, std::function<void(absl::Status)> then) {
  const uint64_t ticket = effects.ticket;
  // Most reports' effects: nothing to send or count, only a ticket.
  if (!then && effects.messages.empty() && effects.checks.empty() && effects.incidents.empty() &&
      effects.requests.empty() && effects.skipped_steps == 0 && effects.expired_jobs.empty() &&
      effects.notes.empty()) {
    if (Batch* batch = Batch::current_; batch != nullptr && batch->delivery_ == this) {
      batch->ticket_ = std::max(batch->ticket_, ticket);
    }
    return;
  }
  auto send = [this, effects = std::move(effects), then = std::move(then)](absl::Status s) {
    if (s.ok()) {
      for (const core::OutMessage& m : effects.messages) {
        streams_->Send(m.job_id, m.ranks, ToProto(m));
      }
      metrics_->Observe(effects);
      if (log_) log_(effects);
    }
    if (then) then(s);
  };
  if (Batch* batch = Batch::current_; batch != nullptr && batch->delivery_ == this) {
    batch->ticket_ = std::max(batch->ticket_, ticket);
    batch->sends_.push_back(std::move(send));
  } else if (ticket == 0) {
    send(absl::OkStatus());
  } else {
    store_->NotifyDurable(ticket, std::move(send));
  }
}

Delivery::Batch::~Batch() {
  current_ = outer_;
  if (sends_.empty()) return;
  auto send_all = [sends = std::move(sends_)](absl::Status s) {
    for (const auto& send : sends) send(s);
  };
  if (ticket_ == 0) {
    send_all(absl::OkStatus());
  } else {
    delivery_->store_->NotifyDurable(ticket_, std::move(send_all));
  }
}

}  // namespace sdc::daemon
