// get and describe: one loop over the table of resources (ctl/resources.h)
// for every kind.

#include <algorithm>
#include <atomic>
#include <csignal>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ctl/command.h"
#include "ctl/errors.h"
#include "ctl/handlers.h"
#include "ctl/resource.h"

namespace sdc::sdcctl {
namespace {

// Set by SIGINT or SIGTERM: `get --watch` ends cleanly at its next pause.
std::atomic<bool> interrupted{false};
extern "C" void OnInterrupt(int) { interrupted.store(true); }

// The item `key` names, in -o's format.
int DescribeOne(Session& s, const Resource& resource, const std::string& key) {
  std::unique_ptr<Resource::Message> item = resource.NewItem();
  Related related;
  grpc::Status status = resource.Fetch(s.admin(), key, item.get(), &related);
  if (!status.ok()) return s.Failed(status);
  s.Print(resource.FormatOne(*item, related, s.config().output, absl::Now()));
  return kExitOk;
}

// One list: fetched, filtered by -l, formatted and printed (after a blank
// line when `separate`).
int ListOnce(Session& s, const Resource& resource, bool separate) {
  const Config& c = s.config();
  std::unique_ptr<Resource::Message> list = resource.NewList();
  grpc::Status status = resource.List(s.admin(), c.filter, list.get());
  if (!status.ok()) return s.Failed(status);
  // The keys were checked by Validate.
  resource.Filter(c.selector, list.get()).IgnoreError();
  if (separate) s.Print("\n");
  s.PrintTable(resource.Format(*list, c.output, absl::Now()), resource.Count(*list) == 0);
  s.Flush();
  return kExitOk;
}

}  // namespace

int RunGet(Session& s) {
  const Config& c = s.config();
  const Resource& resource = *c.command->resource;
  if (!c.args.empty()) return DescribeOne(s, resource, c.args[0]);
  if (!c.watch) return ListOnce(s, resource, /*separate=*/false);
  // Lists every --interval, a blank line between, until SIGINT or SIGTERM.
  std::signal(SIGINT, OnInterrupt);
  std::signal(SIGTERM, OnInterrupt);
  for (bool first = true;; first = false) {
    if (int code = ListOnce(s, resource, /*separate=*/!first); code != kExitOk) return code;
    const absl::Time next = absl::Now() + c.interval;
    while (absl::Now() < next) {
      if (interrupted.load()) return kExitOk;
      absl::SleepFor(std::min(absl::Milliseconds(50), next - absl::Now()));
    }
    if (interrupted.load()) return kExitOk;
  }
}

int RunDescribe(Session& s) {
  return DescribeOne(s, *s.config().command->resource, s.config().args[0]);
}

}  // namespace sdc::sdcctl
