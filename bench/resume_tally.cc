#include "bench/resume_tally.h"

#include "absl/strings/str_cat.h"

namespace sdc::bench {

void ConfigureResume(demo::ClusterConfig& c) {
  c.replace_and_resume = true;
  c.steps = kResumeSteps;
  c.checkpoint_every = kResumeCheckpointEvery;
}

void ResumeTally::Add(const demo::RunFacts& facts) {
  const demo::RunFacts::Resumed& a = facts.resumed;
  approved += a.approved ? 1 : 0;
  resumed += a.resumed ? 1 : 0;
  incidents_after_resume += a.incidents_after;
  corrupted_resumes += a.resumed && a.from_corrupted ? 1 : 0;
}

void ResumeTally::Missed(int completed, std::vector<std::string>* missed) const {
  if (approved < completed) missed->push_back(absl::StrCat("approved ", approved, "/", completed));
  if (resumed < completed) missed->push_back(absl::StrCat("resumed ", resumed, "/", completed));
  if (incidents_after_resume > 0) {
    missed->push_back(absl::StrCat(incidents_after_resume, " incident(s) after a resume"));
  }
  if (corrupted_resumes > 0) {
    missed->push_back(absl::StrCat(corrupted_resumes, " resume(s) from a corrupted checkpoint"));
  }
}

std::string ResumeTally::JsonFields() const {
  return absl::StrCat("\"approved\":", approved, ",\"resumed\":", resumed,
                      ",\"incidents_after_resume\":", incidents_after_resume,
                      ",\"corrupted_checkpoints_resumed_from\":", corrupted_resumes);
}

}  // namespace sdc::bench
