#include "daemon/sqlite_store.h"

#include <sqlite3.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <random>
#include <set>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "daemon/convert.h"
#include "daemon/core/coordinator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sdc::daemon {
namespace {

const Principal kRootPrincipal{"root", Role::kAdmin, /*person=*/false, /*pending=*/false};

// A caller proven to be the node its Hello names (a node certificate).
core::Caller Proven(const core::Hello& h) { return {h.placement.node, "certificate", {}}; }

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::SizeIs;

std::string TempDb(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path = absl::StrCat(dir ? dir : "/tmp", "/", name, "-", getpid(), ".db");
  unlink(path.c_str());
  unlink((path + "-wal").c_str());
  unlink((path + "-shm").c_str());
  return path;
}

// Runs `sql` on the database at `path` through a connection of its own.
void Exec(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* error = nullptr;
  EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error), SQLITE_OK) << error;
  sqlite3_free(error);
  sqlite3_close(db);
}

// The single integer `sql` selects from the database at `path`.
int64_t Count(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  int64_t n = -1;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK &&
      sqlite3_step(stmt) == SQLITE_ROW) {
    n = sqlite3_column_int64(stmt, 0);
  }
  EXPECT_NE(n, -1) << sql << ": " << sqlite3_errmsg(db);
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return n;
}

// Loads `store` every 5 ms until `done` holds of the snapshot (the
// writer removes decided reports while idle), for at most 30 s; returns
// the last snapshot.
core::Snapshot LoadWhen(SqliteStore& store, const std::function<bool(const core::Snapshot&)>& done) {
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  core::Snapshot snap;
  do {
    absl::SleepFor(absl::Milliseconds(5));
    absl::StatusOr<core::Snapshot> loaded = store.Load();
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    if (!loaded.ok()) break;
    snap = *std::move(loaded);
  } while (!done(snap) && absl::Now() < give_up);
  return snap;
}

// Applies `m` and waits until it is durable.
void ApplyDurably(SqliteStore& store, core::Mutation m) {
  auto ticket = store.Apply(std::move(m));
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  ASSERT_TRUE(store.WaitDurable(*ticket).ok());
}

// A report of job "job" at step 10 (a step report; callers may change
// its body).
core::Report StepReportOf(core::Rank rank, uint64_t sequence) {
  core::Report r;
  r.job_id = "job";
  r.rank = rank;
  r.incarnation = 1;
  r.sequence = sequence;
  r.step = 10;
  r.body = core::StepReport{};
  return r;
}

// Rank `r` of job "job": 6 ranks, 2 per node, tensors "a" and "b", every
// 10th step checked.
core::Hello HelloOf(core::Rank r) {
  core::Hello h;
  h.job_id = "job";
  h.placement = {r, absl::StrCat("node-", r / 2), r % 2, absl::StrCat("GPU-", r), 0};
  h.world_size = 6;
  h.incarnation = 1;
  h.weight_tensors = {"a", "b"};
  h.parameter_count = 2;
  h.audit_every = 10;
  h.weight_check_every = 10;
  return h;
}

// Rank `r`'s weights at step 10, tensor "b" differing when `bad`.
core::Report WeightsOf(core::Rank r, bool bad) {
  core::Report rep = StepReportOf(r, 1);
  core::WeightReport w;
  w.tensors = {{8, 1, 1}, {8, 2, bad ? 9u : 2u}};
  w.digest = bad ? 2 : 1;
  rep.body = w;
  return rep;
}

// Restores a coordinator from the store at `path`, attaches the six ranks
// of HelloOf and ingests WeightsOf ranks [first, end) (rank 3's differ),
// each durable; `incidents` gets the coordinator's incidents after.
void IngestWeights(const std::string& path, core::FakeClock* clock, core::Rank first,
                   core::Rank end, std::vector<core::Incident>* incidents = nullptr) {
  auto store = SqliteStore::Open(path);
  ASSERT_TRUE(store.ok());
  core::Coordinator c({}, clock, store->get());
  ASSERT_TRUE(c.Restore().ok());
  for (core::Rank r = 0; r < 6; ++r) ASSERT_TRUE(c.Attach(HelloOf(r), Proven(HelloOf(r))).ok());
  for (core::Rank r = first; r < end; ++r) {
    auto e = c.Ingest(WeightsOf(r, r == 3));
    ASSERT_TRUE(e.ok());
    ASSERT_TRUE((*store)->WaitDurable(e->ticket).ok());
  }
  if (incidents != nullptr) *incidents = c.ListIncidents("job");
}

core::Mutation Everything() {
  core::Mutation m;
  const absl::Time t = absl::FromUnixMillis(1'800'000'000'123);
  m.jobs.push_back({"job", 6, 10, 5, t, 3});
  m.ranks.push_back({"job", {2, "node-b", 1, "GPU-2", 0}, 4, 17, true, 99, true});
  m.groups.push_back({"job", 0, {"w", "b\nwith newline"}, 1, 0xfeedULL});
  core::Report r;
  r.job_id = "job";
  r.rank = 2;
  r.incarnation = 4;
  r.sequence = 17;
  r.step = 99;
  core::WeightReport w;
  w.digest = 5;
  w.tensors = {{8, 1, 2}, {16, 3, 4}};
  r.body = w;
  m.pending_added.push_back(r);
  core::Incident inc;
  inc.id = 7;
  inc.job_id = "job";
  inc.step = 99;
  inc.check = core::CheckKind::kWeights;
  inc.outcome = "faulty";
  inc.ranks = {2};
  inc.nodes = {"node-b"};
  inc.gpus = {"GPU-2"};
  inc.confirmed = true;
  inc.explanation = "rank 2 differs";
  inc.differing_tensors = {"w"};
  inc.created = t;
  inc.request_id = 1;
  m.incidents.push_back(inc);
  core::ReplacementRequest req;
  req.id = 1;
  req.node = "node-b";
  req.state = core::RequestState::kApproved;
  req.gpus = {"GPU-2"};
  req.incident_ids = {7};
  req.reason = "weights";
  req.created = t;
  req.updated = t + absl::Seconds(5);
  req.transitions = {{core::RequestState::kPending, core::RequestState::kPending, t, "sdcd", "opened"},
                     {core::RequestState::kPending, core::RequestState::kApproved,
                      t + absl::Seconds(5), "alice", "confirmed by diagnostics"}};
  m.requests.push_back(req);
  m.suspects.push_back({"GPU-4", "node-c", "job", 4, "lone NaN", 2, 1, t});
  m.plans.push_back({"job", 0, 2, {{1, 4}, {4, 5}}, "targeted", 4, false});
  m.checkpoint_decisions.push_back({"job", 90, false, "weight check missing", t});
  m.step_verdicts.push_back({"job", 0, 99, core::CheckKind::kWeights, true, true, false,
                             "rank 2 differs", 7});
  return m;
}

TEST(SqliteStoreTest, EveryRecordRoundTripsThroughAReopen) {
  const std::string path = TempDb("roundtrip");
  {
    auto store = SqliteStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    auto ticket = (*store)->Apply(Everything());
    ASSERT_TRUE(ticket.ok());
    ASSERT_TRUE((*store)->WaitDurable(*ticket).ok());
  }
  auto store = SqliteStore::Open(path);
  ASSERT_TRUE(store.ok());
  auto snap = (*store)->Load();
  ASSERT_TRUE(snap.ok()) << snap.status();
  ASSERT_THAT(snap->jobs, SizeIs(1));
  EXPECT_EQ(snap->jobs[0].next_plan_id, 3u);
  EXPECT_EQ(snap->jobs[0].created, absl::FromUnixMillis(1'800'000'000'123));
  ASSERT_THAT(snap->ranks, SizeIs(1));
  EXPECT_EQ(snap->ranks[0].placement.gpu_uuid, "GPU-2");
  EXPECT_EQ(snap->ranks[0].acked_sequence, 17u);
  EXPECT_EQ(snap->ranks[0].last_step, 99u);
  ASSERT_THAT(snap->groups, SizeIs(1));
  EXPECT_THAT(snap->groups[0].weight_tensors, ElementsAre("w", "b\nwith newline"));
  ASSERT_THAT(snap->pending, SizeIs(1));
  const auto& w = std::get<core::WeightReport>(snap->pending[0].body);
  EXPECT_EQ(w.tensors[1], (core::Fingerprint{16, 3, 4}));
  ASSERT_THAT(snap->incidents, SizeIs(1));
  EXPECT_EQ(snap->incidents[0].explanation, "rank 2 differs");
  EXPECT_EQ(snap->incidents[0].check, core::CheckKind::kWeights);
  ASSERT_THAT(snap->requests, SizeIs(1));
  ASSERT_THAT(snap->requests[0].transitions, SizeIs(2));
  EXPECT_EQ(snap->requests[0].transitions[1].actor, "alice");
  EXPECT_EQ(snap->requests[0].state, core::RequestState::kApproved);
  ASSERT_THAT(snap->suspects, SizeIs(1));
  EXPECT_EQ(snap->suspects[0].targeted_audits_left, 1u);
  ASSERT_THAT(snap->plans, SizeIs(1));
  EXPECT_EQ(snap->plans[0].assignments[1], (core::Assignment{4, 5}));
  ASSERT_THAT(snap->step_verdicts, SizeIs(1));
  EXPECT_TRUE(snap->step_verdicts[0].failed);
  ASSERT_THAT(snap->checkpoint_decisions, SizeIs(1));
  EXPECT_EQ(snap->checkpoint_decisions[0].reason, "weight check missing");
}

TEST(SqliteStoreTest, RemovalsAndRollbacksApply) {
  const std::string path = TempDb("removals");
  auto store = SqliteStore::Open(path);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->Apply(Everything()).ok());
  core::Mutation m;
  m.pending_removed.push_back({"job", 2, 4, 17});
  m.suspects_removed.push_back("GPU-4");
  m.rollbacks.push_back({"job", 50});
  auto ticket = (*store)->Apply(m);
  ASSERT_TRUE(ticket.ok());
  ASSERT_TRUE((*store)->WaitDurable(*ticket).ok());
  auto snap = (*store)->Load();
  EXPECT_THAT(snap->pending, SizeIs(0));
  EXPECT_THAT(snap->suspects, SizeIs(0));
  EXPECT_THAT(snap->step_verdicts, SizeIs(0));
}

// An expired job leaves with its ranks, groups, plans, verdicts and
// checkpoint decisions, in the same batch as (and so despite) records an
// earlier mutation wrote for it; its incidents, requests and suspects stay,
// and the job may come back under its id.
TEST(SqliteStoreTest, AnExpiredJobLeavesItsHistoryStays) {
  const std::string path = TempDb("expired");
  {
    auto store = SqliteStore::Open(path);
    ASSERT_TRUE(store.ok());
    core::Mutation everything = Everything();
    everything.pending_added.clear();  // An expired job has no open check.
    ASSERT_TRUE((*store)->Apply(everything).ok());
    core::Mutation more;
    more.step_verdicts.push_back({"job", 0, 100, core::CheckKind::kReplay, false, true, true,
                                  "pass", 0});
    more.jobs.push_back({"other", 2, 10, 10, absl::FromUnixMillis(1), 1});
    ASSERT_TRUE((*store)->Apply(more).ok());
    core::Mutation drop;
    drop.jobs_removed.push_back("job");
    auto ticket = (*store)->Apply(drop);
    ASSERT_TRUE(ticket.ok());
    ASSERT_TRUE((*store)->WaitDurable(*ticket).ok());
  }
  auto store = SqliteStore::Open(path);
  ASSERT_TRUE(store.ok());
  auto snap = (*store)->Load();
  ASSERT_TRUE(snap.ok());
  ASSERT_THAT(snap->jobs, SizeIs(1));
  EXPECT_EQ(snap->jobs[0].job_id, "other");
  EXPECT_THAT(snap->ranks, IsEmpty());
  EXPECT_THAT(snap->groups, IsEmpty());
  EXPECT_THAT(snap->plans, IsEmpty());
  EXPECT_THAT(snap->step_verdicts, IsEmpty());
  EXPECT_THAT(snap->checkpoint_decisions, IsEmpty());
  EXPECT_THAT(snap->incidents, SizeIs(1));
  EXPECT_THAT(snap->requests, SizeIs(1));
  EXPECT_THAT(snap->suspects, SizeIs(1));
  // Back under the same id, in the batch that drops it.
  core::Mutation again;
  again.jobs_removed.push_back("other");
  again.jobs.push_back({"other", 4, 10, 10, absl::FromUnixMillis(2), 1});
  auto ticket = (*store)->Apply(again);
  ASSERT_TRUE(ticket.ok());
  ASSERT_TRUE((*store)->WaitDurable(*ticket).ok());
  snap = (*store)->Load();
  ASSERT_THAT(snap->jobs, SizeIs(1));
  EXPECT_EQ(snap->jobs[0].world_size, 4u);
}

// A decided check's reports leave after its commit, when the writer is
// idle, and with its mark; a store that stops removes what is left.
TEST(SqliteStoreTest, DecidedChecksReportsLeaveAfterTheirCommit) {
  for (bool stop_at_once : {false, true}) {
    SCOPED_TRACE(stop_at_once ? "stopped at once" : "idle");
    const std::string path = TempDb(stop_at_once ? "decided-stop" : "decided-idle");
    {
      auto store = SqliteStore::Open(path);
      ASSERT_TRUE(store.ok());
      core::Mutation other;
      other.pending_added.push_back(StepReportOf(7000, 1));  // Not of the check: stays.
      ASSERT_NO_FATAL_FAILURE(ApplyDurably(**store, std::move(other)));
      core::Mutation added;
      for (core::Rank r = 0; r < 3000; ++r) added.pending_added.push_back(StepReportOf(r, 1));
      ASSERT_NO_FATAL_FAILURE(ApplyDurably(**store, std::move(added)));
      core::Mutation decided;
      decided.decided.push_back({"job", 0, 10, core::CheckKind::kNonFinite, 0, {}});
      for (core::Rank r = 0; r < 3000; ++r) {
        decided.decided.back().reports.push_back({"job", r, 1, 1});
      }
      auto ticket = (*store)->Apply(std::move(decided));
      ASSERT_TRUE(ticket.ok());
      ASSERT_TRUE((*store)->WaitDurable(*ticket).ok());
      if (!stop_at_once) {
        // Their log row goes when the writer is idle.
        const core::Snapshot snap = LoadWhen(**store, [](const core::Snapshot& s) {
          return s.pending.size() <= 1 && s.decided.empty();
        });
        ASSERT_THAT(snap.pending, SizeIs(1));
        EXPECT_EQ(snap.pending[0].rank, 7000u);
        EXPECT_THAT(snap.decided, SizeIs(0));
        EXPECT_EQ((*store)->settling_reports(), 0u);
      }
    }
    auto store = SqliteStore::Open(path);
    ASSERT_TRUE(store.ok());
    auto snap = (*store)->Load();
    ASSERT_TRUE(snap.ok());
    ASSERT_THAT(snap->pending, SizeIs(1));
    EXPECT_EQ(snap->pending[0].rank, 7000u);
    EXPECT_THAT(snap->decided, SizeIs(0));
  }
}

// Progress waits (Mutation::progress) until a report that carries it
// leaves: removed, settled after its check's decision, or never written
// (added and removed within one commit).
TEST(SqliteStoreTest, ProgressIsWrittenBeforeTheReportsThatCarryItLeave) {
  const std::string path = TempDb("progress-written");
  auto store = SqliteStore::Open(path);
  ASSERT_TRUE(store.ok());
  core::RankRecord rank{"job", {0, "node-0", 0, "GPU-0", 0}, 1, 0, false, 0, false};
  auto stored = [&]() -> uint64_t {
    auto snap = (*store)->Load();
    EXPECT_TRUE(snap.ok());
    return snap.ok() && snap->ranks.size() == 1 ? snap->ranks[0].acked_sequence : 999;
  };
  auto report = [&](uint64_t sequence) {
    core::Mutation m;
    m.pending_added.push_back(StepReportOf(0, sequence));
    rank.acked_sequence = sequence;
    m.progress.push_back(rank);
    return m;
  };
  {
    core::Mutation hello;
    hello.ranks.push_back(rank);
    ASSERT_NO_FATAL_FAILURE(ApplyDurably(**store, std::move(hello)));
  }
  ASSERT_NO_FATAL_FAILURE(ApplyDurably(**store, report(1)));
  EXPECT_EQ(stored(), 0u) << "progress waits while its report is pending";
  {
    core::Mutation removal;
    removal.pending_removed.push_back({"job", 0, 1, 1});
    ASSERT_NO_FATAL_FAILURE(ApplyDurably(**store, std::move(removal)));
  }
  EXPECT_EQ(stored(), 1u) << "removed";

  ASSERT_NO_FATAL_FAILURE(ApplyDurably(**store, report(2)));
  {
    core::Mutation decided;
    decided.decided.push_back({"job", 0, 10, core::CheckKind::kNonFinite, 0, {{"job", 0, 1, 2}}});
    ASSERT_NO_FATAL_FAILURE(ApplyDurably(**store, std::move(decided)));
  }
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while ((*store)->settling_reports() > 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ((*store)->settling_reports(), 0u);
  EXPECT_EQ(stored(), 2u) << "settled";

  {
    core::Mutation voided = report(3);
    voided.pending_removed.push_back({"job", 0, 1, 3});
    ASSERT_NO_FATAL_FAILURE(ApplyDurably(**store, std::move(voided)));
  }
  EXPECT_EQ(stored(), 3u) << "never written";
  auto snap = (*store)->Load();
  ASSERT_TRUE(snap.ok());
  EXPECT_THAT(snap->pending, SizeIs(0));
}

TEST(SqliteStoreTest, ManyMutationsShareFewCommitsAndNotifyInOrder) {
  const std::string path = TempDb("group");
  auto store = SqliteStore::Open(path);
  ASSERT_TRUE(store.ok());
  std::atomic<uint64_t> last_notified{0};
  std::atomic<bool> in_order{true};
  std::atomic<int> notified{0};
  uint64_t last = 0;
  for (int i = 0; i < 2000; ++i) {
    core::Mutation m;
    m.checkpoint_decisions.push_back({"job", static_cast<uint64_t>(i), true, "ok", absl::Now()});
    auto ticket = (*store)->Apply(std::move(m));
    ASSERT_TRUE(ticket.ok());
    (*store)->NotifyDurable(*ticket, [&, t = *ticket](absl::Status s) {
      if (!s.ok() || t < last_notified.load()) in_order = false;
      last_notified = t;
      ++notified;
    });
    last = *ticket;
  }
  ASSERT_TRUE((*store)->WaitDurable(last).ok());
  // Callbacks run on the notifier thread; Drain waits for the last of them.
  (*store)->Drain();
  EXPECT_EQ(notified.load(), 2000);
  EXPECT_EQ(last_notified.load(), last);
  EXPECT_TRUE(in_order.load());
  EXPECT_LT((*store)->commits(), 2000u) << "group commit batches mutations";
  EXPECT_GT((*store)->file_bytes(), 0u);
  auto snap = (*store)->Load();
  EXPECT_THAT(snap->checkpoint_decisions, SizeIs(2000));
}

// Mutations applied back to back share commits, which coalesce them: the
// database must end as if each had been applied alone, however they were
// grouped. Two jobs use the same rank numbers; ranks are rewritten many
// times (in place, by upsert); most reports are removed by the next
// mutation, some within the same commit, some in a later one.
TEST(SqliteStoreTest, CoalescedCommitsLeaveWhatEachMutationWould) {
  const std::string path = TempDb("coalesce");
  auto store = SqliteStore::Open(path);
  ASSERT_TRUE(store.ok());
  auto report = [](uint64_t sequence) {
    core::Report r;
    r.job_id = "a";
    r.rank = static_cast<core::Rank>(sequence % 10);
    r.incarnation = 1;
    r.sequence = sequence;
    r.step = sequence;
    r.body = core::StepReport{};
    return r;
  };
  constexpr int kMutations = 1000;
  uint64_t last = 0;
  for (int i = 0; i < kMutations; ++i) {
    const core::Rank rank = static_cast<core::Rank>(i % 10);
    core::Mutation m;
    for (const std::string job : {"a", "b"}) {
      const uint64_t acked = (job == "a" ? 0 : 10'000) + i;
      m.ranks.push_back({job, {rank, "node-" + job, rank, "GPU-" + job, 0}, 1, acked, true,
                         static_cast<core::Step>(i), false});
    }
    m.pending_added.push_back(report(i));
    // Every report but each 7th is finalized by the next mutation.
    if (i > 0 && (i - 1) % 7 != 0) {
      const core::Report prev = report(i - 1);
      m.pending_removed.push_back({prev.job_id, prev.rank, prev.incarnation, prev.sequence});
    }
    auto ticket = (*store)->Apply(std::move(m));
    ASSERT_TRUE(ticket.ok());
    last = *ticket;
  }
  ASSERT_TRUE((*store)->WaitDurable(last).ok());
  EXPECT_LT((*store)->commits(), static_cast<uint64_t>(kMutations)) << "nothing was coalesced";
  auto snap = (*store)->Load();
  ASSERT_TRUE(snap.ok());
  ASSERT_THAT(snap->ranks, SizeIs(20));
  for (const core::RankRecord& r : snap->ranks) {
    const uint64_t newest = kMutations - 10 + r.placement.rank;  // Last i with i % 10 == rank.
    EXPECT_EQ(r.acked_sequence, (r.job_id == "a" ? 0 : 10'000) + newest)
        << r.job_id << " rank " << r.placement.rank;
    EXPECT_EQ(r.last_step, newest);
    EXPECT_EQ(r.placement.node, "node-" + r.job_id);
  }
  std::vector<uint64_t> kept;
  for (const core::Report& r : snap->pending) kept.push_back(r.sequence);
  std::vector<uint64_t> expected;
  for (int i = 0; i < kMutations; ++i) {
    if (i % 7 == 0 || i == kMutations - 1) expected.push_back(i);
  }
  EXPECT_EQ(kept, expected);
}

std::vector<core::Rank> RanksOf(const std::vector<core::Report>& reports) {
  std::vector<core::Rank> ranks;
  for (const core::Report& r : reports) ranks.push_back(r.rank);
  return ranks;
}

// Pending reports are a log (schema 5): the reports of one commit share
// one row, which goes once none of them is pending. One removed before
// that has a tombstone: a reopened store does not return it, and its
// rank's progress was written first.
TEST(SqliteStoreTest, ACommitsReportsShareOneLogRow) {
  const std::string path = TempDb("log");
  {
    auto store = SqliteStore::Open(path);
    ASSERT_TRUE(store.ok());
    core::RankRecord rank{"job", {1, "node-0", 1, "GPU-1", 0}, 1, 0, false, 0, false};
    core::Mutation hello;
    hello.ranks.push_back(rank);
    ASSERT_NO_FATAL_FAILURE(ApplyDurably(**store, std::move(hello)));
    core::Mutation added;
    for (core::Rank r = 0; r < 100; ++r) added.pending_added.push_back(StepReportOf(r, 1));
    rank.acked_sequence = 1;
    added.progress.push_back(rank);
    ASSERT_NO_FATAL_FAILURE(ApplyDurably(**store, std::move(added)));
    EXPECT_EQ(Count(path, "SELECT COUNT(*) FROM report_log"), 1);
    EXPECT_EQ(Count(path, "SELECT COUNT(*) FROM pending_reports"), 0);

    core::Mutation removal;
    removal.pending_removed.push_back({"job", 1, 1, 1});
    ASSERT_NO_FATAL_FAILURE(ApplyDurably(**store, std::move(removal)));
    EXPECT_EQ(Count(path, "SELECT COUNT(*) FROM report_log"), 1);
    EXPECT_EQ(Count(path, "SELECT COUNT(*) FROM dropped_reports"), 1);
    EXPECT_EQ((*store)->settling_reports(), 1u);
    auto snap = (*store)->Load();
    ASSERT_TRUE(snap.ok());
    EXPECT_THAT(snap->pending, SizeIs(99));
    ASSERT_THAT(snap->ranks, SizeIs(1));
    EXPECT_EQ(snap->ranks[0].acked_sequence, 1u);
  }
  auto store = SqliteStore::Open(path);
  ASSERT_TRUE(store.ok());
  {
    auto snap = (*store)->Load();
    ASSERT_TRUE(snap.ok());
    ASSERT_THAT(snap->pending, SizeIs(99));
    for (const core::Report& r : snap->pending) EXPECT_NE(r.rank, 1u);
    EXPECT_EQ((*store)->settling_reports(), 1u);
  }
  core::Mutation decided;
  decided.decided.push_back({"job", 0, 10, core::CheckKind::kNonFinite, 0, {}});
  for (core::Rank r = 0; r < 100; ++r) {
    if (r != 1) decided.decided.back().reports.push_back({"job", r, 1, 1});
  }
  ASSERT_NO_FATAL_FAILURE(ApplyDurably(**store, std::move(decided)));
  const core::Snapshot snap = LoadWhen(**store, [](const core::Snapshot& s) {
    return s.pending.empty() && s.decided.empty();
  });
  EXPECT_THAT(snap.pending, SizeIs(0));
  EXPECT_THAT(snap.decided, SizeIs(0));
  EXPECT_EQ(Count(path, "SELECT COUNT(*) FROM report_log"), 0);
  EXPECT_EQ(Count(path, "SELECT COUNT(*) FROM dropped_reports"), 0);
  EXPECT_EQ((*store)->settling_reports(), 0u);
}

// A report added while one with its key is pending replaces it, whether
// that one is in an earlier commit or earlier in the same one (the
// coordinator adds neither; a row per report behaved so).
TEST(SqliteStoreTest, AReportAddedAgainReplacesThePendingOne) {
  const std::string path = TempDb("replaced");
  auto at_step = [](core::Rank rank, core::Step step) {
    core::Report r = StepReportOf(rank, 1);
    r.step = step;
    return r;
  };
  {
    auto store = SqliteStore::Open(path);
    ASSERT_TRUE(store.ok());
    core::Mutation first;
    first.pending_added = {at_step(0, 10), at_step(1, 10)};
    ASSERT_NO_FATAL_FAILURE(ApplyDurably(**store, std::move(first)));
    core::Mutation second;
    second.pending_added = {at_step(2, 10), at_step(0, 11), at_step(2, 12)};
    ASSERT_NO_FATAL_FAILURE(ApplyDurably(**store, std::move(second)));
  }
  auto store = SqliteStore::Open(path);
  ASSERT_TRUE(store.ok());
  auto snap = (*store)->Load();
  ASSERT_TRUE(snap.ok());
  std::vector<std::pair<core::Rank, core::Step>> pending;
  for (const core::Report& r : snap->pending) pending.emplace_back(r.rank, r.step);
  EXPECT_THAT(pending, ElementsAre(std::make_pair(1u, 10u), std::make_pair(0u, 11u),
                                   std::make_pair(2u, 12u)));
}

// A row that a few pending reports keep (their check waits for a late
// rank) while the rest of it is spent is compacted after a second: those
// reports move to a new row, in their arrival order still, and the old
// row goes, and with it the mark of the check decided meanwhile.
TEST(SqliteStoreTest, ARowThatAFewReportsKeepIsCompacted) {
  const std::string path = TempDb("compacted");
  {
    auto store = SqliteStore::Open(path);
    ASSERT_TRUE(store.ok());
    core::Mutation first;
    for (core::Rank r = 0; r < 50; ++r) first.pending_added.push_back(StepReportOf(r, 1));
    first.pending_added.push_back(StepReportOf(100, 1));  // Of a check still open.
    ASSERT_NO_FATAL_FAILURE(ApplyDurably(**store, std::move(first)));
    core::Mutation second;
    second.pending_added.push_back(StepReportOf(101, 1));
    ASSERT_NO_FATAL_FAILURE(ApplyDurably(**store, std::move(second)));
    core::Mutation decided;
    decided.decided.push_back({"job", 0, 10, core::CheckKind::kNonFinite, 0, {}});
    for (core::Rank r = 0; r < 50; ++r) decided.decided.back().reports.push_back({"job", r, 1, 1});
    ASSERT_NO_FATAL_FAILURE(ApplyDurably(**store, std::move(decided)));
    {
      auto snap = (*store)->Load();
      ASSERT_TRUE(snap.ok());
      EXPECT_THAT(snap->pending, SizeIs(52)) << "the row stays for rank 100's report";
      EXPECT_THAT(snap->decided, SizeIs(1));
      EXPECT_EQ((*store)->settling_reports(), 50u);
    }
    const absl::Time decided_at = absl::Now();
    const core::Snapshot snap = LoadWhen(**store, [](const core::Snapshot& s) {
      return s.pending.size() == 2 && s.decided.empty();
    });
    EXPECT_GE(absl::Now() - decided_at, absl::Milliseconds(500));
    EXPECT_THAT(RanksOf(snap.pending), ElementsAre(100, 101));
    EXPECT_THAT(snap.decided, SizeIs(0));
    EXPECT_EQ((*store)->settling_reports(), 0u);
    EXPECT_EQ(Count(path, "SELECT COUNT(*) FROM report_log"), 2);
    EXPECT_EQ(Count(path, "SELECT MIN(id) FROM report_log"), 2) << "the first row went";
  }
  auto store = SqliteStore::Open(path);
  ASSERT_TRUE(store.ok());
  auto snap = (*store)->Load();
  ASSERT_TRUE(snap.ok());
  EXPECT_THAT(RanksOf(snap->pending), ElementsAre(100, 101));
  // Removable where they moved to.
  core::Mutation removal;
  removal.pending_removed.push_back({"job", 100, 1, 1});
  ASSERT_NO_FATAL_FAILURE(ApplyDurably(**store, std::move(removal)));
  auto after = (*store)->Load();
  ASSERT_TRUE(after.ok());
  EXPECT_THAT(RanksOf(after->pending), ElementsAre(101));
}

// The log's bookkeeping (rows, tombstones, marks, compaction) against the
// in-memory store, over random adds, re-adds, removals, decisions,
// reopens and crashes (a copy of the live database), with compaction
// after 1 ms so that it runs often. After each change the pending reports
// a restore would see (those of a marked check skipped, as Restore skips
// them) are the model's, in the model's order.
TEST(SqliteStoreTest, TheLogKeepsWhatTheMemoryStoreKeeps) {
  std::string path = TempDb("log-model");
  SqliteStoreOptions options;
  options.compact_after = absl::Milliseconds(1);
  auto store = SqliteStore::Open(path, options);
  ASSERT_TRUE(store.ok());
  core::MemoryStore model;
  std::mt19937 random(20261203);
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(random); };
  std::vector<uint64_t> next_sequence(24, 1);
  core::Step next_step = 1;  // A report's step names its check here.
  std::vector<core::Step> open_steps;
  auto pending_of = [](const core::Snapshot& s) {
    std::vector<std::tuple<core::Rank, uint64_t, core::Step>> keys;
    for (const core::Report& r : s.pending) keys.emplace_back(r.rank, r.sequence, r.step);
    return keys;
  };
  auto restorable = [](core::Snapshot s) {
    std::set<core::Step> marked;
    for (const core::DecidedCheck& d : s.decided) marked.insert(d.step);
    s.pending.erase(std::remove_if(s.pending.begin(), s.pending.end(),
                                   [&](const core::Report& r) { return marked.count(r.step) > 0; }),
                    s.pending.end());
    return s;
  };
  auto both = [&](const core::Mutation& m) {
    ASSERT_NO_FATAL_FAILURE(ApplyDurably(**store, m));
    ASSERT_TRUE(model.Apply(m).ok());
  };
  for (int round = 0; round < 600; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    auto expected = model.Load();
    ASSERT_TRUE(expected.ok());
    const size_t op = pick(100);
    core::Mutation m;
    if (op < 40 || expected->pending.empty()) {
      // A commit of 1 - 6 reports, some of a new check; sometimes one
      // again with the key of a pending one (it replaces it).
      if (open_steps.empty() || pick(4) == 0) open_steps.push_back(next_step++);
      for (size_t n = 1 + pick(6); n > 0; --n) {
        const core::Rank rank = static_cast<core::Rank>(pick(next_sequence.size()));
        core::Report r = StepReportOf(rank, next_sequence[rank]++);
        r.step = open_steps[pick(open_steps.size())];
        m.pending_added.push_back(r);
      }
      if (!expected->pending.empty() && pick(8) == 0) {
        core::Report again = expected->pending[pick(expected->pending.size())];
        m.pending_added.push_back(again);
      }
    } else if (op < 60) {
      for (size_t n = 1 + pick(3); n > 0 && !expected->pending.empty(); --n) {
        const core::Report& r = expected->pending[pick(expected->pending.size())];
        m.pending_removed.push_back({r.job_id, r.rank, r.incarnation, r.sequence});
      }
    } else if (op < 85) {
      // A check decided: every pending report of one step.
      const core::Step step = open_steps.empty() ? expected->pending[0].step
                                                 : open_steps[pick(open_steps.size())];
      open_steps.erase(std::remove(open_steps.begin(), open_steps.end(), step), open_steps.end());
      m.decided.push_back({"job", 0, step, core::CheckKind::kNonFinite, 0, {}});
      for (const core::Report& r : expected->pending) {
        if (r.step == step) m.decided.back().reports.push_back({"job", r.rank, 1, r.sequence});
      }
    } else if (op < 92) {
      absl::SleepFor(absl::Milliseconds(3));  // Idle: rows go, rows compact.
    } else {
      // sdcd stops (cleanly), or is killed: a copy of the database as it
      // is; the restore removes the reports of marked checks and clears
      // the marks, as Coordinator::Restore does.
      const bool killed = op >= 96;
      const std::string copy = TempDb(absl::StrCat("log-model-", round));
      if (killed) Exec(path, absl::StrCat("VACUUM INTO '", copy, "';"));
      store->reset();
      store = SqliteStore::Open(killed ? copy : path, options);
      ASSERT_TRUE(store.ok());
      auto loaded = (*store)->Load();
      ASSERT_TRUE(loaded.ok());
      core::Mutation settle;
      settle.decided_cleared = loaded->decided;
      std::set<core::Step> marked;
      for (const core::DecidedCheck& d : loaded->decided) marked.insert(d.step);
      for (const core::Report& r : loaded->pending) {
        if (marked.count(r.step) > 0) settle.pending_removed.push_back({"job", r.rank, 1, r.sequence});
      }
      ASSERT_NO_FATAL_FAILURE(ApplyDurably(**store, std::move(settle)));
      if (killed) path = copy;
    }
    if (!m.empty()) ASSERT_NO_FATAL_FAILURE(both(m));
    auto want = model.Load();
    auto got = (*store)->Load();
    ASSERT_TRUE(want.ok());
    ASSERT_TRUE(got.ok());
    ASSERT_EQ(pending_of(restorable(*std::move(got))), pending_of(*want));
  }
  // Everything decided: nothing is left once the writer was idle.
  auto last = model.Load();
  ASSERT_TRUE(last.ok());
  core::Mutation all;
  for (const core::Report& r : last->pending) {
    all.pending_removed.push_back({r.job_id, r.rank, r.incarnation, r.sequence});
  }
  ASSERT_NO_FATAL_FAILURE(both(all));
  const core::Snapshot snap = LoadWhen(**store, [&](const core::Snapshot& s) {
    return s.pending.empty() && s.decided.empty() && (*store)->settling_reports() == 0;
  });
  EXPECT_THAT(snap.pending, SizeIs(0));
  EXPECT_THAT(snap.decided, SizeIs(0));
  EXPECT_EQ((*store)->settling_reports(), 0u);
  store->reset();
  EXPECT_EQ(Count(path, "SELECT COUNT(*) FROM report_log"), 0);
  EXPECT_EQ(Count(path, "SELECT COUNT(*) FROM dropped_reports"), 0);
}

// Schema 2 kept pending reports in a rowid table numbered by arrival,
// schemas 3 and 4 in a table keyed by report with `arrival` a column, and
// schema 5 in a log (report_log). A database of schema 2 with pending
// reports migrates; its reports are restored first, in their order, and
// leave one by one: removed, or consumed by a decided check.
TEST(SqliteStoreTest, PendingReportsOfAnOlderSchemaKeepTheirOrder) {
  const std::string path = TempDb("migration");
  { ASSERT_TRUE(SqliteStore::Open(path).ok()); }
  // The database as schema 2 had it, with three pending reports whose
  // arrival order is not their key order.
  std::string sql = R"sql(
ALTER TABLE jobs DROP COLUMN attempt;
ALTER TABLE jobs DROP COLUMN resume_step;
DROP TABLE attempts;
ALTER TABLE checkpoint_decisions DROP COLUMN abandoned;
ALTER TABLE ranks DROP COLUMN identity;
ALTER TABLE ranks DROP COLUMN proof;
ALTER TABLE ranks DROP COLUMN unproven;
DROP TABLE operators;
DROP TABLE report_log;
DROP TABLE dropped_reports;
DROP TABLE decided_checks;
DROP TABLE pending_reports;
CREATE TABLE pending_reports (
  arrival INTEGER PRIMARY KEY AUTOINCREMENT,
  job_id TEXT NOT NULL,
  rank INTEGER NOT NULL,
  incarnation INTEGER NOT NULL,
  sequence INTEGER NOT NULL,
  report BLOB NOT NULL,
  UNIQUE (job_id, rank, incarnation, sequence)
);
UPDATE schema_version SET version = 2;
)sql";
  int arrival = 41;
  for (core::Rank rank : {5u, 1u, 3u}) {
    absl::StrAppend(&sql, "INSERT INTO pending_reports VALUES (", arrival++, ", 'job', ", rank,
                    ", 1, 1, X'",
                    absl::BytesToHexString(ToProto(StepReportOf(rank, 1)).SerializeAsString()),
                    "');");
  }
  Exec(path, sql);

  auto store = SqliteStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  // A report added after the migration comes after the migrated ones.
  core::Mutation m;
  m.pending_added.push_back(StepReportOf(0, 1));
  m.pending_removed.push_back({"job", 1, 1, 1});
  ASSERT_NO_FATAL_FAILURE(ApplyDurably(**store, std::move(m)));
  auto snap = (*store)->Load();
  ASSERT_TRUE(snap.ok()) << snap.status();
  EXPECT_THAT(RanksOf(snap->pending), ElementsAre(5, 3, 0));
  EXPECT_EQ(Count(path, "SELECT COUNT(*) FROM pending_reports"), 2);

  core::Mutation decided;
  decided.decided.push_back({"job", 0, 10, core::CheckKind::kNonFinite, 0, {{"job", 5, 1, 1}}});
  ASSERT_NO_FATAL_FAILURE(ApplyDurably(**store, std::move(decided)));
  const core::Snapshot after = LoadWhen(**store, [](const core::Snapshot& s) {
    return s.pending.size() == 2 && s.decided.empty();
  });
  EXPECT_THAT(RanksOf(after.pending), ElementsAre(3, 0));
  EXPECT_THAT(after.decided, SizeIs(0));
  EXPECT_EQ(Count(path, "SELECT COUNT(*) FROM pending_reports"), 1);
}

TEST(SqliteStoreTest, RefusesADatabaseFromANewerSdcd) {
  const std::string path = TempDb("newer");
  { ASSERT_TRUE(SqliteStore::Open(path).ok()); }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "UPDATE schema_version SET version = 9", nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  auto store = SqliteStore::Open(path);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("schema version 9 is newer"));
}

TEST(SqliteStoreTest, UnwritablePathIsUnavailable) {
  auto store = SqliteStore::Open("/nonexistent-dir/x/sdc.db");
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("/nonexistent-dir/x/sdc.db"));
}

// The coordinator over the real store: a restart mid-vote loses nothing.
TEST(SqliteStoreTest, CoordinatorRestartsFromTheDatabase) {
  const std::string path = TempDb("coordinator");
  core::FakeClock clock;
  ASSERT_NO_FATAL_FAILURE(IngestWeights(path, &clock, 0, 4));
  auto store = SqliteStore::Open(path);
  ASSERT_TRUE(store.ok());
  core::Coordinator c({}, &clock, store->get());
  ASSERT_TRUE(c.Restore().ok());
  for (core::Rank r = 0; r < 6; ++r) ASSERT_TRUE(c.Attach(HelloOf(r), Proven(HelloOf(r))).ok());
  auto dup = c.Ingest(WeightsOf(2, false));
  ASSERT_TRUE(dup.ok());
  EXPECT_TRUE(dup->duplicate);
  for (core::Rank r = 4; r < 6; ++r) ASSERT_TRUE(c.Ingest(WeightsOf(r, false)).ok());
  auto incidents = c.ListIncidents("job");
  ASSERT_THAT(incidents, SizeIs(1));
  EXPECT_THAT(incidents[0].ranks, ElementsAre(3));
  EXPECT_THAT(incidents[0].differing_tensors, ElementsAre("b"));
}

// sdcd stopped after a check's decision was durable but before its
// reports were removed: the restore neither decides it again nor keeps
// them.
TEST(SqliteStoreTest, RestoreRemovesTheReportsOfADecidedCheck) {
  const std::string path = TempDb("decided-crash");
  const std::string before = TempDb("decided-crash-before");
  core::FakeClock clock;
  ASSERT_NO_FATAL_FAILURE(IngestWeights(path, &clock, 0, 5));
  // The five reports, pending.
  Exec(path, absl::StrCat("VACUUM INTO '", before, "';"));
  std::vector<core::Incident> incidents;
  ASSERT_NO_FATAL_FAILURE(IngestWeights(path, &clock, 5, 6, &incidents));
  ASSERT_THAT(incidents, SizeIs(1));
  // As if sdcd had stopped right after the decision's commit: its mark is
  // there, and so are the reports it consumed, and the ranks' rows do not
  // have the progress those reports carry yet (Mutation::progress).
  Exec(path, absl::StrCat("ATTACH '", before, "' AS before;"
                          "INSERT INTO report_log SELECT * FROM before.report_log;"
                          "INSERT INTO decided_checks VALUES ('job', 0, 10, 'weights', 0);"
                          "UPDATE ranks SET acked_sequence = 0 WHERE rank < 5;"));
  auto store = SqliteStore::Open(path);
  ASSERT_TRUE(store.ok());
  {
    auto snap = (*store)->Load();
    ASSERT_TRUE(snap.ok());
    ASSERT_THAT(snap->pending, SizeIs(5));
    ASSERT_THAT(snap->decided, SizeIs(1));
  }
  core::Coordinator c({}, &clock, store->get());
  ASSERT_TRUE(c.Restore().ok());
  EXPECT_THAT(c.ListIncidents("job"), SizeIs(1));
  for (core::Rank r = 0; r < 6; ++r) ASSERT_TRUE(c.Attach(HelloOf(r), Proven(HelloOf(r))).ok());
  // The check stays decided: a late report of it is taken without opening
  // it again (as a report, not as one that skips a sequence: rank 4's
  // progress came from its marked report).
  core::Report late = WeightsOf(4, false);
  late.sequence = 2;
  auto taken = c.Ingest(late);
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_THAT(taken->notes, Contains(HasSubstr("taken after its check was decided")));
  EXPECT_THAT(c.ListIncidents("job"), SizeIs(1));
  (*store)->Drain();
  auto snap = (*store)->Load();
  ASSERT_TRUE(snap.ok());
  EXPECT_THAT(snap->pending, SizeIs(0));
  EXPECT_THAT(snap->decided, SizeIs(0));
  // Written before the reports that carried it left.
  ASSERT_THAT(snap->ranks, SizeIs(6));
  for (const core::RankRecord& r : snap->ranks) {
    EXPECT_EQ(r.acked_sequence, r.placement.rank == 4 ? 2u : 1u) << "rank " << r.placement.rank;
  }
}

// A report's commit does not rewrite its rank's row (the progress waits,
// Mutation::progress). sdcd stopping before that row is written (a copy
// of the database as it was then) loses nothing: the restore takes the
// progress from the pending reports, so a resent report is a duplicate
// and the next sequence is the one expected; the rows get the progress
// before the reports leave.
TEST(SqliteStoreTest, RestoreTakesRankProgressFromPendingReports) {
  const std::string path = TempDb("progress");
  const std::string crashed = TempDb("progress-crashed");
  core::FakeClock clock;
  {
    auto store = SqliteStore::Open(path);
    ASSERT_TRUE(store.ok());
    core::Coordinator c({}, &clock, store->get());
    ASSERT_TRUE(c.Restore().ok());
    for (core::Rank r = 0; r < 6; ++r) ASSERT_TRUE(c.Attach(HelloOf(r), Proven(HelloOf(r))).ok());
    // Apart from the reports: a rank record that shares their commit is
    // written with it.
    (*store)->Drain();
    for (core::Rank r = 0; r < 4; ++r) {
      auto e = c.Ingest(WeightsOf(r, r == 3));
      ASSERT_TRUE(e.ok());
      ASSERT_TRUE((*store)->WaitDurable(e->ticket).ok());
    }
    Exec(path, absl::StrCat("VACUUM INTO '", crashed, "';"));
  }
  auto store = SqliteStore::Open(crashed);
  ASSERT_TRUE(store.ok());
  {
    auto snap = (*store)->Load();
    ASSERT_TRUE(snap.ok());
    ASSERT_THAT(snap->pending, SizeIs(4));
    ASSERT_THAT(snap->ranks, SizeIs(6));
    for (const core::RankRecord& r : snap->ranks) EXPECT_EQ(r.acked_sequence, 0u);
  }
  core::Coordinator c({}, &clock, store->get());
  ASSERT_TRUE(c.Restore().ok());
  for (core::Rank r = 0; r < 6; ++r) {
    auto attached = c.Attach(HelloOf(r), Proven(HelloOf(r)));
    ASSERT_TRUE(attached.ok());
    EXPECT_EQ(attached->acked_sequence, r < 4 ? 1u : 0u) << "rank " << r;
  }
  auto dup = c.Ingest(WeightsOf(2, false));
  ASSERT_TRUE(dup.ok());
  EXPECT_TRUE(dup->duplicate);
  core::Report skips = WeightsOf(1, false);
  skips.sequence = 3;
  EXPECT_EQ(c.Ingest(skips).status().code(), absl::StatusCode::kOutOfRange);
  for (core::Rank r = 4; r < 6; ++r) ASSERT_TRUE(c.Ingest(WeightsOf(r, false)).ok());
  auto incidents = c.ListIncidents("job");
  ASSERT_THAT(incidents, SizeIs(1));
  EXPECT_THAT(incidents[0].ranks, ElementsAre(3));
  // Once the check's reports are gone, its ranks' rows hold their progress.
  const core::Snapshot snap =
      LoadWhen(**store, [](const core::Snapshot& s) { return s.pending.empty(); });
  ASSERT_THAT(snap.pending, SizeIs(0));
  ASSERT_THAT(snap.ranks, SizeIs(6));
  for (const core::RankRecord& r : snap.ranks) {
    EXPECT_EQ(r.acked_sequence, 1u) << "rank " << r.placement.rank;
  }
}

// Operators (schema 6): digests survive a reopen, names are unique, and an
// approval round (two-person approval) is kept with its request.
// Issue 42: a job restarted as a new attempt (elastic: 6 ranks, then 4),
// then sdcd restarted: the attempt, its ranks, the checkpoint ledger (the
// final checkpoint kept, the old attempt's provisional one abandoned) come
// back from the file.
TEST(SqliteStoreTest, AnAttemptSurvivesARestartOfSdcd) {
  const std::string path = TempDb("attempts");
  core::FakeClock clock;
  auto report = [](core::Rank r, uint64_t incarnation, uint64_t seq, core::Step step,
                   bool weights) {
    core::Report rep = StepReportOf(r, seq);
    rep.incarnation = incarnation;
    rep.step = step;
    if (weights) rep.body = WeightsOf(r, false).body;
    return rep;
  };
  auto attempt_hello = [](core::Rank r) {
    core::Hello h = HelloOf(r);
    h.world_size = 4;
    h.incarnation = 2;
    h.attempt = 1;
    h.resume_step = 10;
    return h;
  };
  {
    auto store = SqliteStore::Open(path);
    ASSERT_TRUE(store.ok());
    core::Coordinator c({}, &clock, store->get());
    ASSERT_TRUE(c.Restore().ok());
    for (core::Rank r = 0; r < 6; ++r) ASSERT_TRUE(c.Attach(HelloOf(r), Proven(HelloOf(r))).ok());
    uint64_t seq[6] = {};
    for (core::Step step : {10u, 20u}) {
      for (core::Rank r = 0; r < 6; ++r) {
        ASSERT_TRUE(c.Ingest(report(r, 1, ++seq[r], step, false)).ok());
        ASSERT_TRUE(c.Ingest(report(r, 1, ++seq[r], step, true)).ok());
      }
      ASSERT_TRUE(c.MayCheckpoint("job", step)->allowed);
    }
    for (core::Rank r = 0; r < 3; ++r) ASSERT_TRUE(c.Ingest(report(r, 1, ++seq[r], 30, false)).ok());
    for (core::Rank r = 0; r < 4; ++r) {
      auto a = c.Attach(attempt_hello(r), Proven(attempt_hello(r)));
      ASSERT_TRUE(a.ok()) << a.status();
    }
    (*store)->Drain();
  }
  EXPECT_EQ(Count(path, "SELECT COUNT(*) FROM ranks"), 4);
  EXPECT_EQ(Count(path, "SELECT closed_checks FROM attempts WHERE attempt = 1"), 1);
  EXPECT_EQ(Count(path, "SELECT step FROM checkpoint_decisions WHERE abandoned = 1"), 20);

  auto store = SqliteStore::Open(path);
  ASSERT_TRUE(store.ok());
  EXPECT_THAT((*store)->Load()->pending, IsEmpty()) << "attempt 0's open check of step 30 was closed";
  core::Coordinator c({}, &clock, store->get());
  ASSERT_TRUE(c.Restore().ok());
  ASSERT_THAT(c.ListJobs(), SizeIs(1));
  EXPECT_EQ(c.ListJobs()[0].attempt, 1u);
  EXPECT_EQ(c.ListJobs()[0].world_size, 4u);
  EXPECT_EQ(c.CheckpointStatus("job")->confirmed_through, 10u);
  auto stale = c.Attach(HelloOf(5), Proven(HelloOf(5)));
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition) << "attempt 0 is over";
  for (core::Rank r = 0; r < 4; ++r) ASSERT_TRUE(c.Attach(attempt_hello(r), Proven(attempt_hello(r))).ok());
  uint64_t seq[4] = {};
  for (core::Step step : {20u, 30u}) {
    for (core::Rank r = 0; r < 4; ++r) {
      ASSERT_TRUE(c.Ingest(report(r, 2, ++seq[r], step, false)).ok()) << r << " " << step;
      ASSERT_TRUE(c.Ingest(report(r, 2, ++seq[r], step, true)).ok());
    }
    auto d = c.MayCheckpoint("job", step);
    ASSERT_TRUE(d->allowed) << d->reason;
    // 20 is attempt 1's own: attempt 0's abandoned 20 confirmed nothing.
    EXPECT_EQ(d->confirmed_through, step == 20 ? 10u : 20u);
  }
  EXPECT_THAT(c.ListIncidents("job"), IsEmpty());
}

TEST(SqliteStoreTest, OperatorsAndApprovalsSurviveAReopen) {
  const std::string path = TempDb("operators");
  std::string alice_token;
  {
    auto store = SqliteStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    auto ops = Operators::Load(store->get(), "root-token");
    ASSERT_TRUE(ops.ok()) << ops.status();
    auto alice = (*ops)->Add("alice", Role::kOperator, kRootPrincipal, absl::FromUnixSeconds(1000));
    ASSERT_TRUE(alice.ok()) << alice.status();
    alice_token = alice->second;
    ASSERT_TRUE((*ops)->Add("bob", Role::kViewer, Principal{"alice", Role::kAdmin, true, false}, absl::FromUnixSeconds(1001)).ok());
    OperatorRecord dup{"bob", Role::kAdmin, std::string(32, 'x'), absl::FromUnixSeconds(1), "x"};
    EXPECT_EQ((*store)->InsertOperator(dup).code(), absl::StatusCode::kAlreadyExists);
    EXPECT_EQ((*store)->DeleteOperator("nobody").code(), absl::StatusCode::kNotFound);

    core::ReplacementRequest req;
    req.id = 1;
    req.node = "node-a";
    req.approvals_required = 2;
    req.approvals = {{"alice", "replay blames GPU-1", absl::FromUnixSeconds(1002)}};
    core::Mutation m;
    m.requests.push_back(req);
    auto ticket = (*store)->Apply(m);
    ASSERT_TRUE(ticket.ok());
    ASSERT_TRUE((*store)->WaitDurable(*ticket).ok());
  }
  auto store = SqliteStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto ops = Operators::Load(store->get(), "root-token");
  ASSERT_TRUE(ops.ok());
  std::optional<Principal> alice = (*ops)->ByToken(alice_token);
  ASSERT_TRUE(alice.has_value());
  EXPECT_EQ(alice->name, "alice");
  EXPECT_EQ(alice->role, Role::kOperator);
  std::vector<OperatorRecord> list = (*ops)->List();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[1].name, "bob");
  EXPECT_EQ(list[1].role, Role::kViewer);
  EXPECT_EQ(list[1].created_by, "alice");
  EXPECT_EQ(list[1].created, absl::FromUnixSeconds(1001));
  auto snap = (*store)->Load();
  ASSERT_TRUE(snap.ok());
  ASSERT_EQ(snap->requests.size(), 1u);
  EXPECT_EQ(snap->requests[0].approvals_required, 2u);
  ASSERT_EQ(snap->requests[0].approvals.size(), 1u);
  EXPECT_EQ(snap->requests[0].approvals[0].op, "alice");
  EXPECT_EQ(snap->requests[0].approvals[0].at, absl::FromUnixSeconds(1002));
}

}  // namespace
}  // namespace sdc::daemon
