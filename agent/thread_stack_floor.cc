// Raises every explicit thread stack size in sdc-agent to at least 1 MiB.
//
// sdc-agent links libtorch (its diagnostic), whose libraries bring about
// 170 KiB of static TLS; glibc carves static TLS out of each thread's stack
// and refuses (EINVAL, without a syscall) to create a thread whose requested
// stack cannot hold it. Debian's civetweb asks for a 100 KiB stack for its
// worker threads, so the --metrics_listen exposer could not start. This
// definition takes precedence over glibc's for every library in the
// process (the executable's symbols come first) and forwards to it.

#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>

namespace {
constexpr size_t kMinimumStackBytes = size_t{1} << 20;
using SetStackSize = int (*)(pthread_attr_t*, size_t);
}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  static const auto next =
      reinterpret_cast<SetStackSize>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  if (next == nullptr) return ENOSYS;
  return next(attr, std::max(size, kMinimumStackBytes));
}
