// Your own data: a CSV data set that is not Fashion-MNIST (scikit-learn's handwritten digits,
// shipped by Debian's python3-sklearn: 1797 rows of 64 pixel values and a label), trained by a
// federation of real processes over TLS with flags only; each client holds its own file (no
// partitioning); the same data as .npy gives the same result.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "federation.h"
#include "process.h"

namespace {

using namespace std::chrono_literals;
constexpr const char* kDigits =
    "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";

// Runs a shell command line (bounded in time); REQUIRE it succeeded.
void sh(const std::string& command) {
  auto p = cohort::test::Process::spawn("/bin/sh", {"-c", command});
  const auto code = p.wait_for(120s);
  INFO(command << ": " << p.stderr_text());
  REQUIRE(code.has_value());
  REQUIRE(*code == 0);
}

// Three clients, each with its own training file (every fifth row is the shared test file),
// 30 rounds of FedAvg with an MLP; the final test accuracy.
double federate(const std::string& dir, const std::string& ext,
                const std::vector<std::string>& data_flags) {
  cohort::test::Federation f(
      1, 3,
      {"--server.rounds=30", "--server.clients_per_round=3", "--server.min_clients=3",
       "--model.spec=mlp:64-64-10", "--train.epochs=1", "--train.batch_size=32", "--train.lr=0.05",
       "--train.momentum=0.9", "--server.work=fixed"});
  f.own_data = true;
  for (int i = 0; i < 3; ++i) {
    std::vector<std::string> flags{"--data.train=" + dir + "/train-" + std::to_string(i) + ext,
                                   "--data.test=" + dir + "/test" + ext,
                                   "--data.scale=standardize"};
    flags.insert(flags.end(), data_flags.begin(), data_flags.end());
    if (!data_flags.empty() && data_flags[0] == "labels") {
      flags = {"--data.train=" + dir + "/x-" + std::to_string(i) + ".npy",
               "--data.train_labels=" + dir + "/y-" + std::to_string(i) + ".npy",
               "--data.test=" + dir + "/x-test.npy", "--data.test_labels=" + dir + "/y-test.npy",
               "--data.scale=standardize"};
    }
    f.client_extra[i] = flags;
  }
  f.start();
  REQUIRE(f.wait(300s) == 0);
  const auto rounds = f.records("round");
  REQUIRE(rounds.size() == 30);
  for (auto& c : f.clients) CHECK(c.wait_for(20s) == 0);
  // Each client trained on all of its own file: 1438 training rows over three files.
  std::size_t samples = 0;
  for (auto& c : f.clients) {
    const std::string log = c.stderr_text();
    const auto at = log.find(" training samples (");
    REQUIRE(at != std::string::npos);
    samples += std::stoul(log.substr(log.rfind(' ', at - 1) + 1, at));
    CHECK(log.find("iid 0/1) of") != std::string::npos);
  }
  CHECK(samples == 1438);
  return rounds.back()["test_accuracy"].get<double>();
}

}  // namespace

TEST_CASE("own CSV and NumPy files: each client trains on its own file, over TLS, to 0.95") {
  INFO("needs Debian's python3-sklearn and python3-numpy (scripts/install-deps.sh installs them)");
  REQUIRE(std::filesystem::exists(kDigits));
  cohort::test::TempDir dir;
  const std::string d = dir.path().string();
  // Every fifth row is the test set; the rest dealt to three clients by row.
  sh("zcat " + std::string(kDigits) + " | awk -v d=" + d +
     " 'NR % 5 == 0 { print > d \"/test.csv\"; next } { print > (d \"/train-\" (NR % 3) \".csv\") "
     "}'");
  const double csv = federate(d, ".csv", {});
  MESSAGE("digits, CSV, 3 clients with their own files: final test accuracy " << csv);
  CHECK(csv >= 0.95);

  // The same files as .npy, one array with the label in its last column...
  sh("cd " + d +
     " && /usr/bin/python3 -c \"import numpy as np\nfor n in "
     "['train-0','train-1','train-2','test']: "
     "np.save(n + '.npy', np.loadtxt(n + '.csv', delimiter=',', dtype=np.float32))\"");
  const double npy = federate(d, ".npy", {});
  MESSAGE("the same as .npy: " << npy);
  // The same values and the same training; FedAvg sums updates in arrival order, so rounding
  // (not the data) may move the last digit.
  CHECK(std::abs(npy - csv) <= 0.01);

  // ...as .npz archives (np.savez_compressed: deflated ZIP64 members x and y)...
  sh("cd " + d +
     " && /usr/bin/python3 -c \"import numpy as np\nfor n in "
     "['train-0','train-1','train-2','test']:\n"
     "  a = np.loadtxt(n + '.csv', delimiter=',', dtype=np.float32)\n"
     "  np.savez_compressed(n + '.npz', x=a[:, :64], y=a[:, 64].astype(np.int64))\"");
  const double npz = federate(d, ".npz", {});
  MESSAGE("the same as .npz: " << npz);
  CHECK(std::abs(npz - csv) <= 0.01);

  // ...and as features (N, 8, 8) uint8 beside labels (N,) int64.
  sh("cd " + d +
     " && /usr/bin/python3 -c \"import numpy as np\nfor n, o in "
     "[('train-0','0'),('train-1','1'),('train-2','2'),('test','test')]:\n"
     "  a = np.loadtxt(n + '.csv', delimiter=',').astype(np.int64)\n"
     "  np.save('x-' + o + '.npy', a[:, :64].reshape(-1, 8, 8).astype(np.uint8)); np.save('y-' + o "
     "+ '.npy', a[:, 64])\"");
  const double apart = federate(d, "", {"labels"});
  MESSAGE("features and labels apart: " << apart);
  CHECK(std::abs(apart - csv) <= 0.01);
}

TEST_CASE(
    "own CSV files in cohort-sim and cohort-decentralized-sim, and a model that does not fit") {
  REQUIRE(std::filesystem::exists(kDigits));
  cohort::test::TempDir dir;
  const std::string d = dir.path().string();
  sh("zcat " + std::string(kDigits) + " | awk -v d=" + d +
     " 'NR % 5 == 0 { print > d \"/test.csv\"; next } { print > d \"/train.csv\" }'");
  const std::vector<std::string> data{"--data.train=" + d + "/train.csv",
                                      "--data.test=" + d + "/test.csv", "--data.scale=standardize"};
  // 20 virtual clients partition the file (iid), about 72 rows each; 10 a round, 5 epochs each.
  std::vector<std::string> sim{"--model.spec=mlp:64-64-10",
                               "--sim.clients=20",
                               "--server.clients_per_round=10",
                               "--server.rounds=20",
                               "--train.epochs=5",
                               "--train.lr=0.05",
                               "--train.momentum=0.9",
                               "--sim.metrics_file=" + d + "/sim.jsonl",
                               "--sim.csv_file=",
                               "--sim.progress=false"};
  sim.insert(sim.end(), data.begin(), data.end());
  auto s = cohort::test::Process::spawn(COHORT_SIM_BIN, sim);
  REQUIRE(s.wait_for(300s) == 0);
  const std::string summary = s.stdout_text();
  INFO(summary << s.stderr_text());
  const auto at = summary.find("final accuracy ");
  REQUIRE(at != std::string::npos);
  const double sim_accuracy = std::stod(summary.substr(at + 15)) / 100;
  MESSAGE("cohort-sim, digits CSV, 20 virtual clients: final accuracy " << sim_accuracy);
  CHECK(sim_accuracy >= 0.9);

  auto p = cohort::test::Process::spawn(
      COHORT_DECENTRALIZED_SIM_BIN,
      {"--nodes", "4", "--steps", "300", "--algos", "dpsgd", "--partition", "iid", "--model",
       "mlp:64-64-10", "--data-train", d + "/train.csv", "--data-test", d + "/test.csv"});
  REQUIRE(p.wait_for(300s) == 0);
  const std::string out = p.stdout_text();
  const auto acc = out.find("\"avg_model_test_accuracy\":");
  REQUIRE(acc != std::string::npos);
  const double decentralized = std::stod(out.substr(acc + 27));
  MESSAGE("cohort-decentralized-sim, 4 peers on a ring: " << decentralized);
  CHECK(decentralized >= 0.9);

  // The default model takes 784 inputs: refused at once, naming both, not a hang.
  auto bad = cohort::test::Process::spawn(
      COHORT_DECENTRALIZED_SIM_BIN,
      {"--nodes", "2", "--steps", "1", "--algos", "dpsgd", "--data-train", d + "/train.csv",
       "--data-test", d + "/test.csv"});
  REQUIRE(bad.wait_for(60s) == 1);
  CHECK(bad.stderr_text().find("takes 784 inputs per example (784x1x1), but the data has 64 "
                               "features per example") != std::string::npos);
}
