// sdcctl: the operator's command line over sdcd's AdminService. The run
// itself is ctl/sdcctl.h's Main; this is where the process's argv,
// environment, stdout and stderr come in.

#include <cstdio>
#include <string>
#include <vector>

#include "ctl/config.h"
#include "ctl/sdcctl.h"

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv, argv + argc);
  return sdc::sdcctl::Main(args, sdc::sdcctl::ReadEnvironment(), stdout, stderr);
}
