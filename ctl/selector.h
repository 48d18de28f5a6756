#ifndef SDC_CTL_SELECTOR_H_
#define SDC_CTL_SELECTOR_H_

// -l key=value[,key=value]: a label selector, matched on sdcctl's side
// against the labels each resource gives its items (ctl/resources.h). Pure
// functions; all thread-safe.

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sdc::sdcctl {

// The terms, in order; every term must match.
using Selector = std::vector<std::pair<std::string, std::string>>;

// "key=value[,key=value]" ("key==value" too; spaces around terms ignored).
// InvalidArgument for an empty key or value, or a term without "=".
absl::StatusOr<Selector> ParseSelector(absl::string_view text);

// An item's labels, (key, value) pairs; a key may repeat (an incident has a
// node and a GPU per blamed rank).
using Labels = std::vector<std::pair<std::string, std::string>>;

// True when every term of `selector` equals one of the item's values for its
// key (so an empty selector matches everything).
bool Matches(const Labels& labels, const Selector& selector);

// InvalidArgument naming `resource` and its `keys` (in the order given) when
// a term's key is not one of them.
absl::Status CheckKeys(const Selector& selector, const std::vector<std::string>& keys,
                       absl::string_view resource);

}  // namespace sdc::sdcctl

#endif  // SDC_CTL_SELECTOR_H_
