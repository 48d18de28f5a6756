#ifndef SDC_THIRD_PARTY_TORCH_GLOO_SHIM_GLOO_DECLARATIONS_H_
#define SDC_THIRD_PARTY_TORCH_GLOO_SHIM_GLOO_DECLARATIONS_H_

// The Gloo names torch/csrc/distributed/c10d/ProcessGroupGloo.hpp mentions,
// declared as far as that header needs (see //third_party/torch:gloo).
// Nothing here is defined or called by sdc-guard: Gloo lives in libtorch_cpu.

#include <chrono>
#include <string>
#include <vector>

namespace gloo {

class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);  // Named by an inline setter.
};

namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport

namespace rendezvous {

// The base of c10d's GlooStore adapter: the virtual functions it overrides.
class Store {
 public:
  virtual ~Store();
  virtual void set(const std::string& key, const std::vector<char>& data) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys,
                    const std::chrono::milliseconds& timeout) = 0;
};

}  // namespace rendezvous
}  // namespace gloo

#endif  // SDC_THIRD_PARTY_TORCH_GLOO_SHIM_GLOO_DECLARATIONS_H_
