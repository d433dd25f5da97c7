// Device profiles and the deadline planner (profiles.h): moving averages, transfer estimates,
// the clamp at both ends, and the "client" metrics record's fields.
#include "profiles.h"

#include <doctest/doctest.h>

#include <map>

namespace cohort::server {
namespace {

using transport::ClientReport;
using transport::LinkSample;

// A report of `sps` samples/s and, per shard, a pull and a push of `bytes` taking `down_s`/`up_s`.
ClientReport report(float sps, std::uint32_t shards, std::uint64_t bytes, float down_s,
                    float up_s) {
  ClientReport r;
  r.trained = true;
  r.samples_per_second = sps;
  for (std::uint32_t k = 0; k < shards; ++k) {
    r.links.push_back(LinkSample{.shard = k,
                                 .down_bytes = bytes,
                                 .down_seconds = down_s,
                                 .up_bytes = bytes,
                                 .up_seconds = up_s});
  }
  return r;
}

// A profile measured once: `sps` samples/s, every shard 1 MB each way at the given times.
ClientProfile measured(float sps, std::uint32_t shards, float down_s, float up_s) {
  ClientProfile p;
  update_profile(p, report(sps, shards, 1'000'000, down_s, up_s), shards);
  return p;
}

std::uint32_t planned(const ClientProfile& p, const WorkBounds& b) {
  return plan_local_steps(&p, b);
}

std::map<std::string, MetricValue> as_map(const std::vector<MetricField>& fields) {
  return {fields.begin(), fields.end()};
}

TEST_CASE("profiles: moving averages with alpha 0.3, the first measurement taken as is") {
  CHECK(ema(0, 10) == 10);
  CHECK(ema(10, 20) == doctest::Approx(13));
  ClientProfile p;
  update_profile(p, report(100, 2, 1000, 0.5f, 0.25f), 2);
  CHECK(p.samples_per_s == doctest::Approx(100));
  REQUIRE(p.links.size() == 2);
  CHECK(p.links[1].down_rate == doctest::Approx(2000));
  CHECK(p.links[1].up_rate == doctest::Approx(4000));
  CHECK(p.reports == 1);
  update_profile(p, report(200, 2, 1000, 1.0f, 0.25f), 2);
  CHECK(p.samples_per_s == doctest::Approx(0.3 * 200 + 0.7 * 100));
  CHECK(p.links[0].down_rate == doctest::Approx(0.3 * 1000 + 0.7 * 2000));
  CHECK(p.links[0].up_rate == doctest::Approx(4000));
  CHECK(p.reports == 2);
  // Unmeasured fields keep the averages: a report without training (a failed pull), a link
  // sample with zero seconds, a shard this federation does not have.
  ClientReport partial;
  partial.links.push_back(LinkSample{.shard = 0, .down_bytes = 1000, .down_seconds = 0});
  partial.links.push_back(LinkSample{.shard = 9, .down_bytes = 1000, .down_seconds = 1});
  update_profile(p, partial, 2);
  CHECK(p.samples_per_s == doctest::Approx(130));
  CHECK(p.links[0].down_rate == doctest::Approx(1700));
  CHECK(p.reports == 2);
  // A round whose work did not fit replaces the averages (kMissAlpha).
  update_profile(p, report(20, 2, 1000, 0.1f, 0.1f), 2, kMissAlpha);
  CHECK(p.samples_per_s == doctest::Approx(20));
  CHECK(p.links[0].down_rate == doctest::Approx(10000));
  CHECK(p.links[1].up_rate == doctest::Approx(10000));
  CHECK(p.reports == 3);
}

TEST_CASE("profiles: the transfer time is the slowest shard's pull plus the slowest push") {
  ClientProfile p = measured(100, 2, 1.0f, 2.0f);
  CHECK(expected_transfer_seconds(p) == doctest::Approx(3.0));
  // Shard 1 is slower both ways: its times count, not the sum over shards.
  update_profile(p,
                 ClientReport{.links = {LinkSample{.shard = 1,
                                                   .down_bytes = 1'000'000,
                                                   .down_seconds = 11.0f,
                                                   .up_bytes = 1'000'000,
                                                   .up_seconds = 12.0f}}},
                 2);
  // Rates: 1e6 / (0.3 * 1e6/11 + 0.7 * 1e6) and likewise up.
  const double down1 = 1 / (0.3 / 11 + 0.7), up1 = 1 / (0.3 / 12 + 0.7 / 2);
  CHECK(expected_transfer_seconds(p) == doctest::Approx(down1 + up1));
  CHECK(expected_transfer_seconds(ClientProfile{}) < 0);
  ClientProfile no_push;
  update_profile(no_push, report(100, 1, 1000, 1.0f, 0), 1);
  CHECK(expected_transfer_seconds(no_push) < 0);
}

TEST_CASE("deadline planner: no profile gets the minimum, slower clients fewer steps, clamped") {
  // D = 10 s, margin 0.2, B = 10: a client with 100 samples/s and 1 s of transfers has
  // (10 - 1 - 2) s x 100 / 10 = 70 steps.
  const WorkBounds b{
      .deadline_s = 10, .margin = 0.2, .batch_size = 10, .min_steps = 2, .max_steps = 1000};
  CHECK(plan_local_steps(nullptr, b) == 2);
  CHECK(planned(measured(0, 1, 0.5f, 0.5f), b) == 2);  // no throughput yet
  ClientProfile no_links;
  no_links.samples_per_s = 100;
  CHECK(plan_local_steps(&no_links, b) == 2);  // no link measured yet
  const auto fast = measured(100, 1, 0.5f, 0.5f);
  const auto slow = measured(10, 1, 0.5f, 0.5f);
  CHECK(plan_local_steps(&fast, b) == 70);
  CHECK(plan_local_steps(&slow, b) == 7);
  // Clamped at both ends.
  CHECK(planned(measured(1, 1, 0.5f, 0.5f), b) == 2);  // floor(0.7) = 0 -> 2
  CHECK(planned(measured(1e6f, 1, 0.5f, 0.5f), b) == 1000);
  CHECK(planned(measured(1e30f, 1, 0.5f, 0.5f), b) == 1000);  // past uint32
  WorkBounds low = b;
  low.max_steps = 1;  // below min_steps: min_steps wins
  CHECK(plan_local_steps(&fast, low) == 2);
  // Transfer time eats into the budget: 4 s of transfers leave (10 - 4 - 2) s = 40 steps, and
  // transfers past D - margin leave the minimum.
  CHECK(planned(measured(100, 1, 2.0f, 2.0f), b) == 40);
  CHECK(planned(measured(100, 1, 4.0f, 5.0f), b) == 2);
  // The slowest of several shards counts.
  auto two = measured(100, 2, 0.5f, 0.5f);
  update_profile(two,
                 ClientReport{.links = {LinkSample{.shard = 1,
                                                   .down_bytes = 1'000'000,
                                                   .down_seconds = 0.5f,
                                                   .up_bytes = 1'000'000,
                                                   .up_seconds = 0.5f}}},
                 2);
  CHECK(plan_local_steps(&two, b) == 70);
  WorkBounds no_margin = b;
  no_margin.margin = 0;
  CHECK(plan_local_steps(&fast, no_margin) == 90);
}

TEST_CASE("deadline planner: the fixed work, and the derived bound four times it") {
  CHECK(fixed_work_steps(0, 1, 64, 600, 1) == 10);  // ceil(600 / 64)
  CHECK(fixed_work_steps(0, 3, 64, 640, 1) == 30);
  CHECK(fixed_work_steps(25, 3, 64, 640, 1) == 25);  // train.steps wins over epochs
  CHECK(fixed_work_steps(0, 1, 64, 0, 4) == 4);      // never below min_steps
  CHECK(derived_max_steps(0, 1, 64, 600, 1) == 40);
  CHECK(derived_max_steps(25, 3, 64, 640, 1) == 100);
  CHECK(derived_max_steps(0, 1, 64, 0, 4) == 16);
  CHECK(derived_max_steps(0, 1, 64, 0, 0) == 0);
  CHECK(derived_max_steps(2'000'000'000, 1, 64, 0, 1) == 4'294'967'295U);  // saturates
}

TEST_CASE(
    "deadline planner: the round is planned to the latest fixed-work finish, at most (1 - m) D") {
  const auto fast = measured(100, 1, 0.5f, 0.5f);  // 1 s of transfers
  const auto slow = measured(10, 1, 0.5f, 0.5f);
  // 10 steps of 10 samples: 1 s + 1 s for the fast client, 1 s + 10 s for the slow one.
  CHECK(expected_work_seconds(fast, 10, 10) == doctest::Approx(2.0));
  CHECK(expected_work_seconds(slow, 10, 10) == doctest::Approx(11.0));
  ClientProfile unknown;
  CHECK(expected_work_seconds(unknown, 10, 10) < 0);
  const std::vector<double> both{2.0, 11.0}, quick{2.0, 3.0}, none{-1.0, -1.0};
  CHECK(planned_round_seconds(both, 10, 0.2) == doctest::Approx(8.0));  // the slow one does not fit
  CHECK(planned_round_seconds(quick, 10, 0.2) == doctest::Approx(3.0));  // everyone fits: 3 s
  CHECK(planned_round_seconds(none, 10, 0.2) == doctest::Approx(8.0));   // nobody measured
  CHECK(planned_round_seconds({}, 10, 0.2) == doctest::Approx(8.0));
  const std::vector<double> mixed{-1.0, 3.0};  // an unmeasured client does not set T
  CHECK(planned_round_seconds(mixed, 10, 0.2) == doctest::Approx(3.0));
  // In a round of T = 3 s the fast client fills 2 s of compute: 20 steps, twice its fixed 10; the
  // client that set T (1 s of transfers + 2 s for its 20 steps at 100 samples/s) gets exactly its
  // fixed work, not one step less to rounding.
  const WorkBounds b{.deadline_s = 10,
                     .margin = 0.2,
                     .round_s = 3.0,
                     .batch_size = 10,
                     .min_steps = 1,
                     .max_steps = 1000};
  CHECK(plan_local_steps(&fast, b) == 20);
  for (float sps : {3.0f, 7.0f, 10.0f, 30.0f, 70.0f, 100.0f, 333.0f}) {
    ClientProfile p = measured(sps, 1, 0.1f, 0.2f);
    const double t = expected_work_seconds(p, 10, 10);
    WorkBounds own = b;
    own.round_s = planned_round_seconds(std::vector<double>{t}, 1000, 0.2);
    CHECK(plan_local_steps(&p, own) == 10);
  }
}

TEST_CASE("deadline planner: a client not measured yet is planned with the fleet's slow end") {
  std::vector<ClientProfile> fleet;
  for (int k = 1; k <= 11; ++k) fleet.push_back(measured(10.0f * k, 2, 0.1f * k, 0.2f * k));
  fleet.push_back(ClientProfile{});       // never measured: left out
  fleet.push_back(measured(5, 1, 1, 1));  // another layout (one shard): left out
  std::vector<const ClientProfile*> ptrs;
  for (const auto& p : fleet) ptrs.push_back(&p);
  CHECK(usable_profile(fleet[0], 2));
  CHECK_FALSE(usable_profile(fleet[11], 2));
  CHECK_FALSE(usable_profile(fleet[12], 2));
  const ClientProfile prior = fleet_prior(ptrs, 2);
  REQUIRE(usable_profile(prior, 2));
  // The 10% quantile of 11 values is the second smallest: 20 samples/s; the rates likewise come
  // from the second slowest link (1 MB in 0.9 s down, 1.8 s up: the 10th and 11th are slower).
  CHECK(prior.samples_per_s == doctest::Approx(20));
  CHECK(prior.links[1].down_rate == doctest::Approx(1e6 / 1.0));
  CHECK(prior.links[1].up_rate == doctest::Approx(1e6 / 2.0));
  CHECK(prior.links[0].down_bytes == 1'000'000);
  const std::vector<const ClientProfile*> nobody{&fleet[11]};
  CHECK_FALSE(usable_profile(fleet_prior(nobody, 2), 2));
  CHECK_FALSE(usable_profile(fleet_prior({}, 2), 2));
}

TEST_CASE("deadline planner: what a client has not measured comes from the prior") {
  const ClientProfile prior = measured(20, 2, 1.0f, 2.0f);
  // A client that missed every deadline: its throughput and pulls measured, never a push.
  ClientProfile straggler;
  update_profile(
      straggler,
      ClientReport{.samples_per_second = 3,
                   .links = {LinkSample{.shard = 0, .down_bytes = 500, .down_seconds = 1},
                             LinkSample{.shard = 1, .down_bytes = 500, .down_seconds = 1}}},
      2);
  CHECK_FALSE(usable_profile(straggler, 2));
  const ClientProfile p = filled_from(straggler, prior);
  REQUIRE(usable_profile(p, 2));
  CHECK(p.samples_per_s == doctest::Approx(3));         // its own
  CHECK(p.links[1].down_rate == doctest::Approx(500));  // its own
  CHECK(p.links[1].up_rate == doctest::Approx(5e5));    // the prior's
  CHECK(p.links[1].up_bytes == 1'000'000);
  const ClientProfile fresh = filled_from(ClientProfile{}, prior);
  CHECK(fresh.samples_per_s == doctest::Approx(20));
  CHECK(fresh.links.size() == 2);
}

TEST_CASE("profiles: the client record names every field, one rate pair per shard") {
  ClientRoundRecord r{.round_id = 7,
                      .client = "c-1",
                      .trained = true,
                      .assigned_steps = 12,
                      .local_steps = 12,
                      .measured_samples_per_s = 250,
                      .peak_training_bytes = 4096,
                      .micro_batch = 16,
                      .accumulation = 4,
                      .recompute = true,
                      .train_seconds = 1.5,
                      .comm_seconds = 0.25,
                      .round_seconds = 2,
                      .participations = 3,
                      .profile = measured(250, 2, 0.5f, 0.25f)};
  const auto f = as_map(client_record_fields(r));
  CHECK(f.size() == 20);
  CHECK(std::get<double>(f.at("train_seconds")) == 1.5);
  CHECK(std::get<double>(f.at("comm_seconds")) == 0.25);
  CHECK(std::get<double>(f.at("round_seconds")) == 2);
  CHECK(std::get<bool>(f.at("recompute")));
  CHECK(std::get<std::uint64_t>(f.at("peak_training_bytes")) == 4096);
  CHECK(std::get<std::uint64_t>(f.at("micro_batch")) == 16);
  CHECK(std::get<std::uint64_t>(f.at("accumulation")) == 4);
  CHECK(std::get<std::uint64_t>(f.at("round_id")) == 7);
  CHECK(std::get<std::string>(f.at("client")) == "c-1");
  CHECK(std::get<bool>(f.at("trained")));
  CHECK(std::get<std::uint64_t>(f.at("assigned_steps")) == 12);
  CHECK(std::get<std::uint64_t>(f.at("local_steps")) == 12);
  CHECK(std::get<double>(f.at("measured_samples_per_s")) == 250);
  CHECK(std::get<double>(f.at("samples_per_s")) == doctest::Approx(250));
  CHECK(std::get<std::uint64_t>(f.at("profile_reports")) == 1);
  CHECK(std::get<std::uint64_t>(f.at("participations")) == 3);
  CHECK(std::get<double>(f.at("down_bytes_per_s_1")) == doctest::Approx(2e6));
  CHECK(std::get<double>(f.at("up_bytes_per_s_0")) == doctest::Approx(4e6));
}

}  // namespace
}  // namespace cohort::server
