#ifndef SDC_CTL_SDCCTL_H_
#define SDC_CTL_SDCCTL_H_

// One sdcctl run, from argv to the exit code: the command line into a
// validated Config (ctl/config.h), the credential and the connection when
// the command needs sdcd, then the command's handler. main() passes its
// argv, environment, stdout and stderr; tests pass their own.

#include <cstdio>
#include <string>
#include <vector>

#include "ctl/config.h"

namespace sdc::sdcctl {

// argv[0] is the program. Returns the exit code (ctl/errors.h).
int Main(const std::vector<std::string>& argv, const Environment& env, std::FILE* out,
         std::FILE* err);

}  // namespace sdc::sdcctl

#endif  // SDC_CTL_SDCCTL_H_
