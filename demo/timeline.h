#ifndef SDC_DEMO_TIMELINE_H_
#define SDC_DEMO_TIMELINE_H_

// The whole loop of a restarted job (the replace-and-resume scenario), as
// events in order: fault, detection, veto/revocation, request, approval,
// replacement, restart, resume, final checkpoint. Read from the run's facts
// and sdcd's request record; the summary and the HTML report print it.

#include <string>
#include <vector>

#include "demo/launcher.h"
#include "demo/report.h"

namespace sdc::demo {

struct TimelineEvent {
  std::string what;
  std::string at;  // Clock time UTC, HH:MM:SS; empty where the event has a step, not a time.
  std::string detail;
};

// Empty unless the run restarted (ClusterResult::resume.attempt > 0).
std::vector<TimelineEvent> Timeline(const RunFacts& facts, const ClusterResult& result);

}  // namespace sdc::demo

#endif  // SDC_DEMO_TIMELINE_H_
