#include "client/gloo_group.h"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <utility>

namespace sdc::client {
namespace {

// A backend that counts each call and hands it to Gloo's.
class CountingBackend : public c10d::Backend {
 public:
  CountingBackend(c10::intrusive_ptr<c10d::Backend> inner,
                  std::shared_ptr<std::atomic<int64_t>> issued)
      : c10d::Backend(inner->getRank(), inner->getSize()),
        inner_(std::move(inner)),
        issued_(std::move(issued)) {}

  const std::string getBackendName() const override { return inner_->getBackendName(); }
  void setTimeout(std::chrono::milliseconds timeout) override { inner_->setTimeout(timeout); }
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override {
    return inner_->getBackendOptions();
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& t,
                                           const c10d::BroadcastOptions& o) override {
    return Count(), inner_->broadcast(t, o);
  }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& t,
                                           const c10d::AllreduceOptions& o) override {
    return Count(), inner_->allreduce(t, o);
  }
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& t, const c10d::AllreduceCoalescedOptions& o) override {
    return Count(), inner_->allreduce_coalesced(t, o);
  }
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& t,
                                        const c10d::ReduceOptions& o) override {
    return Count(), inner_->reduce(t, o);
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& out,
                                           std::vector<at::Tensor>& in,
                                           const c10d::AllgatherOptions& o) override {
    return Count(), inner_->allgather(out, in, o);
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& out, at::Tensor& in,
                                                 const c10d::AllgatherOptions& o) override {
    return Count(), inner_->_allgather_base(out, in, o);
  }
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& out, std::vector<at::Tensor>& in,
      const c10d::AllgatherOptions& o) override {
    return Count(), inner_->allgather_coalesced(out, in, o);
  }
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& out,
                                        std::vector<at::Tensor>& in,
                                        const c10d::GatherOptions& o) override {
    return Count(), inner_->gather(out, in, o);
  }
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& out,
                                         std::vector<std::vector<at::Tensor>>& in,
                                         const c10d::ScatterOptions& o) override {
    return Count(), inner_->scatter(out, in, o);
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& out,
                                                std::vector<std::vector<at::Tensor>>& in,
                                                const c10d::ReduceScatterOptions& o) override {
    return Count(), inner_->reduce_scatter(out, in, o);
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& out, at::Tensor& in,
                                               std::vector<int64_t>& out_splits,
                                               std::vector<int64_t>& in_splits,
                                               const c10d::AllToAllOptions& o) override {
    return Count(), inner_->alltoall_base(out, in, out_splits, in_splits, o);
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& o) override {
    return Count(), inner_->barrier(o);
  }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& t, int dst, int tag) override {
    return Count(), inner_->send(t, dst, tag);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& t, int src, int tag) override {
    return Count(), inner_->recv(t, src, tag);
  }

 private:
  void Count() { issued_->fetch_add(1, std::memory_order_relaxed); }

  c10::intrusive_ptr<c10d::Backend> inner_;
  std::shared_ptr<std::atomic<int64_t>> issued_;
};

c10::intrusive_ptr<c10d::ProcessGroup> MakeGroup(const std::string& store_path, int rank,
                                                 int world, std::chrono::milliseconds timeout,
                                                 const std::string& host,
                                                 std::shared_ptr<std::atomic<int64_t>> issued) {
  auto store = c10::make_intrusive<c10d::FileStore>(store_path, world);
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(host));
  c10::intrusive_ptr<c10d::Backend> gloo =
      c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, options);
  if (issued != nullptr) {
    gloo = c10::make_intrusive<CountingBackend>(std::move(gloo), std::move(issued));
  }
  // Since torch 2.0 a ProcessGroup routes each device type to a backend;
  // CPU tensors (all the guard sends on Gloo) go to this one.
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world);
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  return group;
}

}  // namespace

c10::intrusive_ptr<c10d::ProcessGroup> MakeGlooGroup(const std::string& store_path, int rank,
                                                     int world, std::chrono::milliseconds timeout,
                                                     const std::string& host) {
  return MakeGroup(store_path, rank, world, timeout, host, nullptr);
}

c10::intrusive_ptr<c10d::ProcessGroup> MakeCountingGlooGroup(
    const std::string& store_path, int rank, int world, std::shared_ptr<std::atomic<int64_t>> issued,
    std::chrono::milliseconds timeout, const std::string& host) {
  if (issued == nullptr) issued = std::make_shared<std::atomic<int64_t>>(0);
  return MakeGroup(store_path, rank, world, timeout, host, std::move(issued));
}

}  // namespace sdc::client
