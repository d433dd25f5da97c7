// train.loss = mse end to end: a regression CSV made here from a known linear function with noise,
// trained by cohort-sim and by a federation of real cohort-server / cohort-client processes over
// TLS. The final test MSE must be far below the variance of the test targets, and no program may
// report an accuracy (a regression has none). Every process is bounded in time and killed by its
// handle's destructor.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "federation.h"
#include "process.h"

namespace {

using namespace std::chrono_literals;

// y = 2 x1 - x2 + 0.5 x3 + x4 + 1 + N(0, 0.1^2), x ~ U(-1, 1)^4: rows to `path` with a header;
// returns the variance of the targets written (about 2.1; the noise's is 0.01).
double write_linear_csv(const std::string& path, std::size_t rows, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::normal_distribution<double> noise(0.0, 0.1);
  std::ofstream out(path);
  out << "x1,x2,x3,x4,y\n";
  double sum = 0, sq = 0;
  for (std::size_t i = 0; i < rows; ++i) {
    const double x1 = u(gen), x2 = u(gen), x3 = u(gen), x4 = u(gen);
    const double y = 2 * x1 - x2 + 0.5 * x3 + x4 + 1 + noise(gen);
    out << x1 << ',' << x2 << ',' << x3 << ',' << x4 << ',' << y << '\n';
    sum += y;
    sq += y * y;
  }
  const double mean = sum / static_cast<double>(rows);
  return sq / static_cast<double>(rows) - mean * mean;
}

std::vector<nlohmann::json> events(const std::string& path, const std::string& event) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("event", "") == event) out.push_back(j);
  }
  return out;
}

// The last line of a process's stderr.
std::string last_line(const std::string& text) {
  std::string t = text;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  return t.substr(t.rfind('\n') == std::string::npos ? 0 : t.rfind('\n') + 1);
}

}  // namespace

TEST_CASE(
    "cohort-sim trains a regression with train.loss = mse to well below the target variance") {
  cohort::test::TempDir dir;
  (void)write_linear_csv(dir.file("train.csv"), 1000, 1);
  const double variance = write_linear_csv(dir.file("test.csv"), 200, 2);
  const std::vector<std::string> common{"--model.spec=mlp:4-16-1",
                                        "--train.loss=mse",
                                        "--data.train=" + dir.file("train.csv"),
                                        "--data.test=" + dir.file("test.csv"),
                                        "--sim.csv_file=",
                                        "--sim.progress=false",
                                        "--sim.threads=2",
                                        "--server.metrics_file=" + dir.file("server.jsonl"),
                                        "--sim.metrics_file=" + dir.file("sim.jsonl")};
  std::vector<std::string> args = common;
  args.insert(args.end(), {"--sim.clients=10", "--server.clients_per_round=5", "--server.rounds=10",
                           "--train.epochs=2", "--train.batch_size=16", "--train.lr=0.05"});
  auto sim = cohort::test::Process::spawn(COHORT_SIM_BIN, args);
  const auto code = sim.wait_for(120s);
  const std::string out = sim.stdout_text();
  INFO(out << sim.stderr_text().substr(0, 4000));
  REQUIRE(code == 0);
  const auto at = out.find("final test mse ");
  REQUIRE(at != std::string::npos);
  const double mse = std::stod(out.substr(at + 15));
  MESSAGE("cohort-sim, 10 virtual clients: final test MSE " << mse << ", target variance "
                                                            << variance);
  CHECK(mse < variance / 20);
  CHECK(out.find("accuracy") == std::string::npos);
  const auto rounds = events(dir.file("sim.jsonl"), "sim_round");
  REQUIRE(rounds.size() == 10);
  for (const auto& r : rounds) {
    CHECK(r.contains("test_loss"));
    CHECK_FALSE(r.contains("test_accuracy"));
  }
  const auto summary = events(dir.file("sim.jsonl"), "sim_summary");
  REQUIRE(summary.size() == 1);
  CHECK(summary[0]["final_loss"].get<double>() == doctest::Approx(mse).epsilon(1e-4));
  CHECK_FALSE(summary[0].contains("final_accuracy"));
  for (const auto& r : events(dir.file("server.jsonl"), "round"))
    CHECK_FALSE(r.contains("test_accuracy"));
  const auto done = events(dir.file("server.jsonl"), "done");
  REQUIRE(done.size() == 1);
  CHECK(done[0].contains("final_test_loss"));
  CHECK_FALSE(done[0].contains("final_accuracy"));

  // What mse cannot honour is refused at start-up, in one line: a split by class label, and
  // Fashion-MNIST's class labels (the default data).
  args = common;
  args.insert(args.end(),
              {"--sim.clients=4", "--server.rounds=1", "--data.partition=dirichlet:0.5"});
  auto dirichlet = cohort::test::Process::spawn(COHORT_SIM_BIN, args);
  REQUIRE(dirichlet.wait_for(60s) == 1);
  CHECK(last_line(dirichlet.stderr_text())
            .starts_with("cohort-sim: data.partition = dirichlet:0.5 splits the examples by class "
                         "label"));
  auto idx = cohort::test::Process::spawn(
      COHORT_SIM_BIN, {"--train.loss=mse", "--sim.clients=2", "--server.rounds=1",
                       "--sim.csv_file=", "--sim.metrics_file=", "--sim.progress=false",
                       "--server.metrics_file=" + dir.file("idx.jsonl")});
  REQUIRE(idx.wait_for(60s) == 1);
  CHECK(
      last_line(idx.stderr_text()).starts_with("cohort-sim: train.loss = mse needs float targets"));
  auto unknown = cohort::test::Process::spawn(COHORT_SIM_BIN, {"--train.loss=l1"});
  REQUIRE(unknown.wait_for(60s) == 1);
  CHECK(last_line(unknown.stderr_text()) ==
        "cohort-sim: train.loss must be cross_entropy or mse, got 'l1'");
}

TEST_CASE("a federation of real processes trains a regression with train.loss = mse") {
  cohort::test::TempDir dir;
  (void)write_linear_csv(dir.file("train.csv"), 1000, 3);
  const double variance = write_linear_csv(dir.file("test.csv"), 200, 4);
  cohort::test::Federation f(
      1, 2,
      {"--server.rounds=8", "--server.clients_per_round=2", "--server.min_clients=2",
       "--model.spec=mlp:4-16-1", "--train.loss=mse", "--train.epochs=2", "--train.batch_size=16",
       "--train.lr=0.05", "--server.work=fixed"});
  // Each client takes its iid half of the file; the targets are floats, so the clients read
  // them as regression targets before they learn the loss from the coordinator.
  for (int i = 0; i < 2; ++i) {
    f.client_extra[i] = {"--data.train=" + dir.file("train.csv"),
                         "--data.test=" + dir.file("test.csv")};
  }
  f.start();
  REQUIRE(f.wait(120s) == 0);
  for (auto& c : f.clients) CHECK(c.wait_for(20s) == 0);
  const auto rounds = f.records("round");
  REQUIRE(rounds.size() == 8);
  for (const auto& r : rounds) CHECK_FALSE(r.contains("test_accuracy"));
  REQUIRE(rounds.back().contains("test_loss"));
  const double mse = rounds.back()["test_loss"].get<double>();
  MESSAGE("2 clients over TLS: final test MSE " << mse << ", target variance " << variance);
  CHECK(mse < variance / 20);
  const auto done = f.records("done");
  REQUIRE(done.size() == 1);
  CHECK(done[0]["final_test_loss"].get<double>() == doctest::Approx(mse));
  CHECK_FALSE(done[0].contains("final_accuracy"));
  const std::string lines = f.server(0).stdout_text();
  CHECK(lines.find("test mse ") != std::string::npos);
  CHECK(lines.find("accuracy") == std::string::npos);
}
