#ifndef SDC_BENCH_RESUME_TALLY_H_
#define SDC_BENCH_RESUME_TALLY_H_

// The detection matrix's row for the replace-and-resume scenario (issue
// 42's whole loop): over its runs, how many were approved (the request
// reached Done under the bench's operator), resumed (attempt 1 trained to
// the end), the incidents sdcd recorded after the resume, and the runs that
// resumed from a corrupted checkpoint. Goals: every run approved and
// resumed, 0 incidents after a resume, 0 resumes from a corrupted checkpoint.

#include <string>
#include <vector>

#include "demo/launcher.h"
#include "demo/report.h"

namespace sdc::bench {

// The loop needs a final checkpoint before the fault (the matrix's fault
// steps are 15 to 25) and time for the approval before the job ends.
inline constexpr int kResumeSteps = 60;
inline constexpr int kResumeCheckpointEvery = 6;

// Sets `c` up for the whole loop (ClusterConfig::replace_and_resume).
void ConfigureResume(demo::ClusterConfig& c);

struct ResumeTally {
  int approved = 0;
  int resumed = 0;
  int incidents_after_resume = 0;
  int corrupted_resumes = 0;

  void Add(const demo::RunFacts& facts);
  // The goals this tally misses over `completed` runs, in words.
  void Missed(int completed, std::vector<std::string>* missed) const;
  // `"approved":N,"resumed":N,...`: the row's JSON fields.
  std::string JsonFields() const;
};

}  // namespace sdc::bench

#endif  // SDC_BENCH_RESUME_TALLY_H_
