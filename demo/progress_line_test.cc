#include "demo/progress_line.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <variant>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sdc::demo {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

StepRecord SomeStep() {
  StepRecord r;
  r.step = 15;
  r.rank = 3;
  r.loss = 2.25;
  r.apply = false;
  r.reason = "non-finite gradient on rank 3";
  r.audited = true;
  r.outcome = "mismatch";
  r.unverified = false;
  r.norm = 0.5;
  r.repaired = true;
  r.checkpoint = "vetoed";
  r.ms = 12.5;
  r.check1_ms = 0.25;
  r.agreement_ms = 0.125;
  r.audit_ms = 3.0;
  r.weight_ms = 1.5;
  r.end_unix_ms = 1764860000123.5;
  return r;
}

StepRecord ParseStep(const std::string& line) {
  absl::StatusOr<ProgressLine> p = ParseProgressLine(line);
  EXPECT_TRUE(p.ok()) << p.status() << "\n" << line;
  if (!p.ok() || !std::holds_alternative<StepRecord>(*p)) return StepRecord{};
  return std::get<StepRecord>(*p);
}

void ExpectSameStep(const StepRecord& a, const StepRecord& b) {
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.rank, b.rank);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.apply, b.apply);
  EXPECT_EQ(a.reason, b.reason);
  EXPECT_EQ(a.audited, b.audited);
  EXPECT_EQ(a.outcome, b.outcome);
  EXPECT_EQ(a.unverified, b.unverified);
  EXPECT_EQ(a.norm, b.norm);
  EXPECT_EQ(a.repaired, b.repaired);
  EXPECT_EQ(a.checkpoint, b.checkpoint);
  EXPECT_EQ(a.ms, b.ms);
  EXPECT_EQ(a.check1_ms, b.check1_ms);
  EXPECT_EQ(a.agreement_ms, b.agreement_ms);
  EXPECT_EQ(a.audit_ms, b.audit_ms);
  EXPECT_EQ(a.weight_ms, b.weight_ms);
  EXPECT_EQ(a.end_unix_ms, b.end_unix_ms);
  EXPECT_EQ(a.collectives, b.collectives);
}

TEST(ProgressLineTest, StepRoundTripsEveryField) {
  const StepRecord r = SomeStep();
  const std::string line = StepLine(r);
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  EXPECT_EQ(line.rfind(R"({"step":15,"rank":3,"loss":2.25,"apply":false,)", 0), 0u) << line;
  ExpectSameStep(ParseStep(line), r);
}

TEST(ProgressLineTest, CollectivesAreWrittenOnlyWhenCounted) {
  StepRecord r = SomeStep();
  EXPECT_THAT(StepLine(r), Not(HasSubstr("collectives"))) << "not counted: no key";
  EXPECT_EQ(ParseStep(StepLine(r)).collectives, -1);
  r.collectives = 7;
  const std::string line = StepLine(r);
  EXPECT_THAT(line, HasSubstr(R"("collectives":7)"));
  ExpectSameStep(ParseStep(line), r);
  std::string wrong = line;
  wrong.replace(wrong.find("7}"), 1, "\"seven\"");
  absl::StatusOr<ProgressLine> p = ParseProgressLine(wrong);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(), HasSubstr("\"collectives\" must be an integer"));
}

TEST(ProgressLineTest, ReasonsWithJsonSyntaxRoundTrip) {
  for (const std::string& reason : {
           std::string("quote \" inside"),
           std::string("backslash \\ and \\\" both"),
           std::string("two\nlines\r\nand a\ttab"),
           std::string("\"},\"apply\":true,\"x\":{\""),  // Looks like the end of the object.
           std::string("control \x01\x1f bytes"),
           std::string("nul \0 byte", 10),
           std::string("utf-8: d\xc3\xa9j\xc3\xa0 \xe2\x9c\x93"),
           std::string(""),
       }) {
    StepRecord r = SomeStep();
    r.reason = reason;
    r.outcome = reason;
    const std::string line = StepLine(r);
    EXPECT_EQ(line.find('\n'), std::string::npos) << line;
    const StepRecord back = ParseStep(line);
    EXPECT_EQ(back.reason, reason) << line;
    EXPECT_EQ(back.outcome, reason) << line;
    EXPECT_FALSE(back.apply) << line;  // The injected "apply":true did not take.
  }
}

TEST(ProgressLineTest, InvalidUtf8IsReplacedNotThrown) {
  StepRecord r = SomeStep();
  r.reason = "tensor \xff\xfe name";
  const std::string line = StepLine(r);
  EXPECT_EQ(ParseStep(line).reason, "tensor \xef\xbf\xbd\xef\xbf\xbd name");
}

TEST(ProgressLineTest, NonFiniteNumbersAreWrittenAsNullAndReadAsNaN) {
  StepRecord r = SomeStep();
  r.loss = kNaN;
  r.norm = kInf;
  r.ms = -kInf;
  const std::string line = StepLine(r);
  // Valid JSON for any reader (Python's json.loads included), with null.
  const nlohmann::json j = nlohmann::json::parse(line);
  EXPECT_TRUE(j.at("loss").is_null()) << line;
  EXPECT_TRUE(j.at("norm").is_null()) << line;
  EXPECT_TRUE(j.at("ms").is_null()) << line;
  EXPECT_THAT(line, Not(HasSubstr("nan")));
  EXPECT_THAT(line, Not(HasSubstr("inf")));
  const StepRecord back = ParseStep(line);
  EXPECT_TRUE(std::isnan(back.loss));
  EXPECT_TRUE(std::isnan(back.norm));
  EXPECT_TRUE(std::isnan(back.ms));
  EXPECT_EQ(back.step, 15);
}

// What examples/cluster_support.py writes (json.dumps, allow_nan=False):
// the same keys, integers where Python has ints, null for a NaN loss.
TEST(ProgressLineTest, ReadsThePythonTrainersLines) {
  const StepRecord s = ParseStep(
      R"({"step":7,"rank":1,"loss":null,"apply":false,"reason":"non-finite gradient","audited":false,)"
      R"("outcome":"","unverified":false,"norm":0.0,"repaired":false,"checkpoint":"none",)"
      R"("ms":41.2,"check1_ms":0.5,"agreement_ms":0.25,"audit_ms":0.0,"weight_ms":0,)"
      R"("end_unix_ms":1764860000123.456})");
  EXPECT_EQ(s.step, 7);
  EXPECT_EQ(s.rank, 1);
  EXPECT_TRUE(std::isnan(s.loss));
  EXPECT_FALSE(s.apply);
  EXPECT_EQ(s.reason, "non-finite gradient");
  EXPECT_EQ(s.weight_ms, 0);
  EXPECT_EQ(s.end_unix_ms, 1764860000123.456);

  absl::StatusOr<ProgressLine> f = ParseProgressLine(
      R"({"final":true,"rank":1,"weights_digest":"00ff00ff00ff00ff","guard":)"
      R"({"steps":24,"skipped":1,"audits_off":"put_ has no deterministic implementation"}})");
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE(std::holds_alternative<FinalRecord>(*f));
  const FinalRecord& fin = std::get<FinalRecord>(*f);
  EXPECT_EQ(fin.rank, 1);
  EXPECT_EQ(fin.weights_digest, "00ff00ff00ff00ff");
  EXPECT_EQ(fin.guard, (std::map<std::string, int64_t>{{"steps", 24}, {"skipped", 1}}));
}

TEST(ProgressLineTest, FinalRoundTrips) {
  FinalRecord r;
  r.rank = 5;
  r.weights_digest = "0123456789abcdef";
  r.guard = {{"steps", 150}, {"audits", 30}, {"reports_dropped", 0}};
  const std::string line = FinalLine(r);
  EXPECT_THAT(line, HasSubstr(R"("final":true)"));
  absl::StatusOr<ProgressLine> p = ParseProgressLine(line);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(std::holds_alternative<FinalRecord>(*p));
  EXPECT_EQ(std::get<FinalRecord>(*p).rank, 5);
  EXPECT_EQ(std::get<FinalRecord>(*p).weights_digest, "0123456789abcdef");
  EXPECT_EQ(std::get<FinalRecord>(*p).guard, r.guard);

  FinalRecord unguarded;
  unguarded.weights_digest = "0000000000000001";
  EXPECT_EQ(FinalLine(unguarded),
            R"({"final":true,"rank":0,"weights_digest":"0000000000000001","guard":{}})");
}

std::string StepWith(const std::string& key, const std::string& value) {
  nlohmann::json j = nlohmann::json::parse(StepLine(SomeStep()));
  if (value.empty()) {
    j.erase(key);
  } else {
    j[key] = nlohmann::json::parse(value);
  }
  return j.dump();
}

TEST(ProgressLineTest, MalformedLinesAreInvalidArgumentSayingWhy) {
  struct Case {
    std::string line;
    std::string error;
  };
  for (const Case& c : std::vector<Case>{
           {"", "not JSON: parse error at line 1, column 1"},
           {"step 3 done", "not JSON: parse error at line 1, column 1"},
           {R"({"step":1,"rank":0,"lo)", "not JSON: parse error at line 1, column 23"},
           {R"({"step":1} trailing)", "not JSON: parse error at line 1, column 14"},
           {R"({"step":1,"loss":nan})", "not JSON: parse error"},
           {R"({"step":1,"end_unix_ms":1e400})", "not JSON: number overflow parsing '1e400'"},
           {"[1,2]", "not a JSON object: [1,2]"},
           {"null", "not a JSON object: null"},
           {StepWith("rank", ""), "no \"rank\""},
           {StepWith("end_unix_ms", ""), "no \"end_unix_ms\""},
           {StepWith("step", "1.5"), "\"step\" must be an integer, got 1.5"},
           {StepWith("step", "-3000000000"), "\"step\" must be an integer, got -3000000000"},
           {StepWith("rank", "null"), "\"rank\" must be an integer, got null"},
           {StepWith("apply", "\"true\""), "\"apply\" must be true or false, got \"true\""},
           {StepWith("loss", "\"nan\""), "\"loss\" must be a number or null, got \"nan\""},
           {StepWith("reason", "{}"), "\"reason\" must be a string, got {}"},
           {StepWith("final", "false"), "\"final\" must be true, got false"},
           {R"({"final":true,"rank":2})", "no \"weights_digest\""},
           {R"({"final":true,"rank":2,"weights_digest":"ab","guard":[]})",
            "\"guard\" must be an object, got []"},
       }) {
    absl::StatusOr<ProgressLine> p = ParseProgressLine(c.line);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << c.line;
    EXPECT_THAT(p.status().message(), HasSubstr(c.error)) << c.line;
  }
}

// Every truncation of a line (a writer killed mid-line) and every byte of
// it replaced by each of a few troublemakers: the parser answers, OK or
// kInvalidArgument, and never throws or crashes.
TEST(ProgressLineTest, TruncatedAndMutatedLinesNeverCrash) {
  StepRecord r = SomeStep();
  r.reason = "a \"quoted\" reason";
  for (const std::string& valid : {StepLine(r), FinalLine(FinalRecord{2, "00ff", {{"steps", 3}}})}) {
    for (size_t n = 0; n < valid.size(); ++n) {
      absl::StatusOr<ProgressLine> p = ParseProgressLine(valid.substr(0, n));
      EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << valid.substr(0, n);
    }
    for (size_t i = 0; i < valid.size(); ++i) {
      for (const char c : {'"', '\\', '{', '}', ',', ':', '-', '9', 'e', '.', '\0', '\xff'}) {
        std::string mutated = valid;
        mutated[i] = c;
        absl::StatusOr<ProgressLine> p = ParseProgressLine(mutated);
        if (!p.ok()) EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << mutated;
      }
    }
  }
}

}  // namespace
}  // namespace sdc::demo
