#include "client/gloo_group.h"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

namespace sdc::client {

c10::intrusive_ptr<c10d::ProcessGroup> MakeGlooGroup(const std::string& store_path, int rank,
                                                     int world, std::chrono::milliseconds timeout,
                                                     const std::string& host) {
  auto store = c10::make_intrusive<c10d::FileStore>(store_path, world);
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(host));
  auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, options);
  // Since torch 2.0 a ProcessGroup routes each device type to a backend;
  // CPU tensors (all the guard sends on Gloo) go to this one.
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world);
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  return group;
}

}  // namespace sdc::client
