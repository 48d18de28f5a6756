#ifndef SDC_CTL_COMPLETION_H_
#define SDC_CTL_COMPLETION_H_

// `completion bash` and `completion zsh`: scripts derived from the tables of
// commands and flags (ctl/command.h) that complete command words, resources,
// arguments with fixed values, flags, and the values of flags that have
// choices. The zsh script loads the bash function through bashcompinit. The
// bash function is _sdcctl.

#include <string>

namespace sdc::sdcctl {

std::string BashCompletion();
std::string ZshCompletion();

}  // namespace sdc::sdcctl

#endif  // SDC_CTL_COMPLETION_H_
