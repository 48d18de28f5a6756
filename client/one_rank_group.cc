#include "client/one_rank_group.h"

#include <cstdio>
#include <cstdlib>

#include "client/gloo_group.h"

namespace sdc::client {

c10::intrusive_ptr<c10d::ProcessGroup> OneRankGroup(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name;
  std::remove(path.c_str());
  return MakeGlooGroup(path, 0, 1);
}

}  // namespace sdc::client
