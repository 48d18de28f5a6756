#ifndef SDC_CLIENT_PROTOCOL_ALIAS_H_
#define SDC_CLIENT_PROTOCOL_ALIAS_H_

// TRANSITIONAL. The trainer engine's files (guard_engine*.{h,cc}) still
// spell the protocol's names core::X, from when they lived in daemon/core;
// they are being restructured separately, so they were not rewritten with
// the move to protocol/. This alias keeps them compiling. Once that work has
// landed: `sed -i 's/\bcore::/protocol::/g' client/guard_engine*`, then
// delete this file and its include in guard_engine.h. New code writes
// protocol::.

#include "protocol/types.h"

namespace sdc::client {
namespace core = ::sdc::protocol;
}  // namespace sdc::client

#endif  // SDC_CLIENT_PROTOCOL_ALIAS_H_
