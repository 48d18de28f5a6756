#ifndef SDC_TESTS_TESTING_PROCESS_H_
#define SDC_TESTS_TESTING_PROCESS_H_

// The process utilities of demo/process.h, under the tests' namespace.

#include "demo/process.h"

namespace sdc::testing {

using ::sdc::demo::BinaryPath;
using ::sdc::demo::HttpGet;
using ::sdc::demo::Process;
using ::sdc::demo::ReadFile;
using ::sdc::demo::Run;
using ::sdc::demo::RunResult;
using ::sdc::demo::TestDir;
using ::sdc::demo::WriteRecordingStandIn;

}  // namespace sdc::testing

#endif  // SDC_TESTS_TESTING_PROCESS_H_
