#ifndef SDC_CTL_RESOURCES_H_
#define SDC_CTL_RESOURCES_H_

// The table of what sdcctl lists and describes: requests, incidents,
// suspects, jobs, nodes and operators (ctl/resource.h says what an entry
// holds). `get` takes each by its plural, `describe` the describable ones by
// their kind.

#include <vector>

#include "absl/strings/string_view.h"
#include "ctl/resource.h"

namespace sdc::sdcctl {

// Every resource, in the order help lists them. Built once; thread-safe.
const std::vector<Resource>& Resources();

// The resource whose kind or plural is `word` ("request", "requests");
// nullptr for none.
const Resource* FindResource(absl::string_view word);

}  // namespace sdc::sdcctl

#endif  // SDC_CTL_RESOURCES_H_
