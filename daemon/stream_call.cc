#include "daemon/stream_call.h"

#include <pthread.h>

namespace sdc::daemon {

CallQueues::~CallQueues() { Stop(); }

void CallQueues::Add(grpc::ServerBuilder& builder, int queues) {
  for (int i = 0; i < queues; ++i) queues_.push_back(builder.AddCompletionQueue());
}

void CallQueues::Start(const std::function<void(grpc::ServerCompletionQueue*)>& arm) {
  for (auto& q : queues_) {
    grpc::ServerCompletionQueue* queue = q.get();
    arm(queue);
    threads_.emplace_back([queue] {
      pthread_setname_np(pthread_self(), "sdc-streams");  // For top -H and perf.
      Serve(queue);
    });
  }
}

void CallQueues::Serve(grpc::ServerCompletionQueue* queue) {
  void* tag = nullptr;
  bool ok = false;
  while (queue->Next(&tag, &ok)) {
    auto* t = static_cast<QueuedCall::Tag*>(tag);
    t->call->OnEvent(t->op, ok);
  }
}

void CallQueues::Stop() {
  {
    absl::WriterMutexLock lock(&post_mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  for (auto& q : queues_) q->Shutdown();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

}  // namespace sdc::daemon
