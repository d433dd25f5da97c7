// The one doctest main shared by every test binary. On top of doctest's own verdict it refuses a
// pass that proves nothing (skip.h states the rules):
//   - a test case that passed with zero assertions fails the binary, unless it called
//     cohort::test::skip_test_case();
//   - a run in which no test case ran fails too: no test cases registered, or filters (-tc, -sf,
//     ...) that match none. A filter that matches nothing is usually a renamed test case, and a
//     typo should not read as a pass;
//   - a run in which every test case that ran skipped, or every test case is disabled by its
//     doctest::skip() decorator, exits with kSkipExitCode (CTest: "Skipped").
// Queries (--count, --list-test-cases, --help, --version, --no-run) keep doctest's behaviour.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "skip.h"

namespace cohort::test {
namespace {

// What one run did, as seen by RunRecorder. Written from doctest's reporter callbacks and from
// skip_test_case(); doctest runs test cases one at a time, on the main thread.
struct RunRecord {
  bool started = false;              // a real run, not a query
  unsigned registered = 0;           // test cases in the binary
  unsigned executed = 0;             // test cases whose body ran
  unsigned selected = 0;             // test cases a --count query selected
  std::string current;               // name of the running test case
  std::string skip_reason;           // set by skip_test_case() during the running test case
  std::vector<std::string> skipped;  // the quoted name, then ": reason"
  std::vector<std::string> asserted_nothing;
};

RunRecord& record() {
  static RunRecord r;
  return r;
}

// A listener (it runs alongside whichever reporter is chosen) that records, per test case, its
// assertion count and whether it skipped.
class RunRecorder : public doctest::IReporter {
 public:
  explicit RunRecorder(const doctest::ContextOptions&) {}

  void test_run_start() override { record().started = true; }
  void test_run_end(const doctest::TestRunStats& stats) override {
    record().registered = stats.numTestCases;
  }
  void test_case_start(const doctest::TestCaseData& tc) override {
    RunRecord& r = record();
    ++r.executed;
    r.current = tc.m_name;
    r.skip_reason.clear();
  }
  void test_case_end(const doctest::CurrentTestCaseStats& stats) override {
    RunRecord& r = record();
    if (!r.skip_reason.empty()) {
      r.skipped.push_back('"' + r.current + "\": " + r.skip_reason);
    } else if (stats.numAssertsCurrentTest == 0 &&
               stats.failure_flags == doctest::TestCaseFailureReason::None) {
      r.asserted_nothing.push_back(r.current);
    }
  }
  void test_case_skipped(const doctest::TestCaseData&) override {}
  void report_query(const doctest::QueryData& query) override {
    if (query.run_stats != nullptr) record().selected = query.run_stats->numTestCasesPassingFilters;
  }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
};

// How many test cases the command line's filters select, counting those that doctest::skip()
// disables: doctest's own --count query, with --no-skip, printing nothing.
unsigned count_selected(int argc, char** argv) {
  std::vector<const char*> args(argv, argv + argc);
  for (const char* extra : {"--count", "--no-skip", "--quiet"}) args.push_back(extra);
  doctest::Context query(static_cast<int>(args.size()), args.data());
  record().selected = 0;
  query.run();
  return record().selected;
}

// The exit status for a run that doctest judged `doctest_status`; explains any change on stderr.
int judge(int doctest_status, int argc, char** argv) {
  std::string_view binary = argc > 0 ? argv[0] : "test";
  if (const auto slash = binary.rfind('/'); slash != std::string_view::npos) {
    binary.remove_prefix(slash + 1);
  }
  const RunRecord& r = record();
  if (!r.started || doctest_status != EXIT_SUCCESS) return doctest_status;
  if (!r.asserted_nothing.empty()) {
    for (const auto& name : r.asserted_nothing) {
      std::cerr << binary << ": test case \"" << name
                << "\" passed with 0 assertions; a test that asserts nothing is a defect (assert "
                   "what it checks, or call cohort::test::skip_test_case() when it cannot run)\n";
    }
    return EXIT_FAILURE;
  }
  if (r.executed == 0) {
    // Every selected test case is disabled by its decorator (e.g. under a sanitizer), or the
    // filters select none.
    if (const unsigned disabled = count_selected(argc, argv); disabled > 0) {
      std::cerr << binary << ": skipped: the " << disabled
                << " selected test case(s) are disabled by doctest::skip(); none ran\n";
      return kSkipExitCode;
    }
    std::cerr << binary << ": 0 test cases ran (" << r.registered
              << " registered, none selected); a run that checks nothing is not a pass\n";
    return EXIT_FAILURE;
  }
  for (const auto& s : r.skipped) std::cerr << binary << ": skipped " << s << '\n';
  if (r.skipped.size() == r.executed) {
    std::cerr << binary << ": skipped: all " << r.executed
              << " test case(s) that ran skipped; nothing was checked\n";
    return kSkipExitCode;
  }
  return EXIT_SUCCESS;
}

}  // namespace

void skip_test_case(std::string_view reason) {
  record().skip_reason = reason.empty() ? std::string("(no reason given)") : std::string(reason);
}

}  // namespace cohort::test

DOCTEST_REGISTER_LISTENER("cohort_run_recorder", 1, cohort::test::RunRecorder);

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  return cohort::test::judge(context.run(), argc, argv);
}
