#include "agent/weight_elision.h"

#include <string>

#include "gtest/gtest.h"
#include "trainer.pb.h"

namespace sdc::agent {
namespace {

// Session `session` says Hello for `job`, replica group `group`.
bool Hello(WeightElision& e, uint64_t session, const std::string& job, uint32_t group) {
  v1::TrainerMessage m;
  m.mutable_hello()->set_job_id(job);
  m.mutable_hello()->mutable_placement()->set_replica_group(group);
  return e.Apply(session, &m);
}

v1::TrainerMessage Weights(const std::string& job, uint64_t step, uint64_t digest,
                           int tensors = 2) {
  v1::TrainerMessage m;
  v1::Report* r = m.mutable_report();
  r->set_job_id(job);
  r->set_step(step);
  v1::WeightReport* w = r->mutable_weights();
  w->set_digest(digest);
  for (int i = 0; i < 3 * tensors; ++i) w->add_tensors(digest + i);
  return m;
}

// Applies and says what went on: "carried" or "elided".
std::string Sent(WeightElision& e, uint64_t session, v1::TrainerMessage m) {
  const bool elided = e.Apply(session, &m);
  const v1::WeightReport& w = m.report().weights();
  EXPECT_EQ(elided, w.tensors_elided());
  EXPECT_EQ(elided, w.tensors_size() == 0);
  return elided ? "elided" : "carried";
}

TEST(WeightElisionTest, EachDigestOfAGroupsStepTravelsOnce) {
  WeightElision e;
  for (uint64_t s = 1; s <= 4; ++s) Hello(e, s, "job", 0);
  EXPECT_EQ(Sent(e, 1, Weights("job", 10, 0xaa)), "carried");
  EXPECT_EQ(Sent(e, 2, Weights("job", 10, 0xaa)), "elided");
  EXPECT_EQ(Sent(e, 3, Weights("job", 10, 0xbb)), "carried");  // A differing rank.
  EXPECT_EQ(Sent(e, 4, Weights("job", 10, 0xaa)), "elided");
  // The next weight step carries again; a late report of the last travels whole.
  EXPECT_EQ(Sent(e, 1, Weights("job", 20, 0xaa)), "carried");
  EXPECT_EQ(Sent(e, 2, Weights("job", 10, 0xaa)), "carried");
  EXPECT_EQ(Sent(e, 2, Weights("job", 20, 0xaa)), "elided");
}

TEST(WeightElisionTest, GroupsJobsAndOptimizerStateAreKeptApart) {
  WeightElision e;
  Hello(e, 1, "job", 0);
  Hello(e, 2, "job", 1);
  Hello(e, 3, "other", 0);
  Hello(e, 4, "job", 0);
  EXPECT_EQ(Sent(e, 1, Weights("job", 10, 0xaa)), "carried");
  EXPECT_EQ(Sent(e, 2, Weights("job", 10, 0xaa)), "carried");    // Another group.
  EXPECT_EQ(Sent(e, 3, Weights("other", 10, 0xaa)), "carried");  // Another job.
  v1::TrainerMessage with_optimizer = Weights("job", 10, 0xaa);
  with_optimizer.mutable_report()->mutable_weights()->set_has_optimizer_digest(true);
  with_optimizer.mutable_report()->mutable_weights()->set_optimizer_digest(5);
  EXPECT_EQ(Sent(e, 4, with_optimizer), "carried");
  // A report naming another job than its session's Hello: sdcd refuses
  // it, so it must not stand for anyone's tensors.
  EXPECT_EQ(Sent(e, 4, Weights("other", 10, 0xaa)), "carried");
}

TEST(WeightElisionTest, OnlySessionsThatSaidHelloAndReportsWithTensors) {
  WeightElision e;
  EXPECT_EQ(Sent(e, 7, Weights("job", 10, 0xaa)), "carried");
  EXPECT_EQ(Sent(e, 7, Weights("job", 10, 0xaa)), "carried");
  Hello(e, 1, "job", 0);
  Hello(e, 2, "job", 0);
  v1::TrainerMessage digest_only = Weights("job", 10, 0xaa, /*tensors=*/0);
  EXPECT_FALSE(e.Apply(1, &digest_only));
  EXPECT_FALSE(digest_only.report().weights().tensors_elided());
  EXPECT_EQ(Sent(e, 2, Weights("job", 10, 0xaa)), "carried");  // The first with tensors.
  v1::TrainerMessage step;
  step.mutable_report()->set_job_id("job");
  step.mutable_report()->mutable_step_report()->set_applied(true);
  EXPECT_FALSE(e.Apply(1, &step));
  EXPECT_FALSE(Hello(e, 1, "job", 0));  // Hellos pass as they are.
}

TEST(WeightElisionTest, ASessionsEndMakesItsGroupCarryAgain) {
  WeightElision e;
  for (uint64_t s = 1; s <= 3; ++s) Hello(e, s, "job", 0);
  EXPECT_EQ(Sent(e, 1, Weights("job", 10, 0xaa)), "carried");
  EXPECT_EQ(Sent(e, 2, Weights("job", 10, 0xaa)), "elided");
  // sdcd may have refused session 1's report, and its tensors with it.
  e.End(1);
  EXPECT_EQ(Sent(e, 3, Weights("job", 10, 0xaa)), "carried");
  // An ended session is forgotten.
  EXPECT_EQ(Sent(e, 1, Weights("job", 10, 0xaa)), "carried");
}

}  // namespace
}  // namespace sdc::agent
