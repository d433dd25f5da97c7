"""cohort.FederatedStep / aggregate, keygen, simulate, and the module as installed."""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import cohort

BUILD = pathlib.Path(os.environ.get("COHORT_BUILD_DIR", pathlib.Path(__file__).parents[2] / "build"))


def test_the_rules_on_numpy_arrays():
    updates = [np.array([1, 2, 3, 100], np.float32), np.array([2, 2, 2, 2], np.float64),
               [3, 3, 3, 3]]
    np.testing.assert_allclose(cohort.aggregate(updates), [2, 7 / 3, 8 / 3, 35], rtol=1e-6)
    np.testing.assert_allclose(cohort.aggregate(updates, weights=[2, 1, 1]),
                               [1.75, 2.25, 2.75, 51.25], rtol=1e-6)
    np.testing.assert_allclose(cohort.aggregate(updates, rule="median"), [2, 2, 3, 3])
    np.testing.assert_allclose(
        cohort.aggregate(updates, rule="trimmed_mean", rule_options={"beta": 0.34}),
        [2, 2, 3, 3])


def test_a_federated_step_keeps_its_optimizer_state():
    params = np.zeros(3, np.float32)
    step = cohort.FederatedStep(3, rule="fedavg", optimizer="fedavgm",
                                optimizer_options={"lr": 1.0, "beta": 0.5})
    assert step.size == 3 and step.min_updates == 1
    d = np.ones(3, np.float32)
    step.apply(params, [d])
    np.testing.assert_allclose(params, [1, 1, 1])
    step.apply(params, [d])  # velocity 0.5 * 1 + 1
    np.testing.assert_allclose(params, [2.5, 2.5, 2.5])
    assert step.rounds == 2


def test_what_a_shard_would_refuse_is_refused():
    with pytest.raises(cohort.DataError, match="update 1 has 2 values"):
        cohort.aggregate([np.ones(3), np.ones(2)])
    with pytest.raises(cohort.DataError, match="non-finite"):
        cohort.aggregate([np.array([1, np.nan, 0], np.float32)])
    with pytest.raises(cohort.DataError):
        cohort.aggregate([np.ones(3)], weights=[-1])
    with pytest.raises(cohort.DataError, match="no update"):
        cohort.aggregate([])
    with pytest.raises(cohort.ConfigError, match="krumm"):
        cohort.FederatedStep(3, rule="krumm")
    with pytest.raises(TypeError):  # params must be float32, writable: it is updated in place
        cohort.FederatedStep(3).apply(np.zeros(3, np.float64), [np.ones(3)])
    params = np.zeros(3, np.float32)
    with pytest.raises(cohort.DataError):
        cohort.FederatedStep(3).apply(params, [np.ones(3), np.full(3, np.inf)])
    assert not params.any()  # untouched when it throws


def test_keys_from_python_are_what_cohort_keygen_makes(tmp_path):
    cohort.keygen_ca(str(tmp_path / "ca"))
    files = cohort.keygen_node(str(tmp_path / "ca"), "alice", str(tmp_path / "certs"))
    assert pathlib.Path(files["cert_file"]).name == "alice.pem"
    for f in files.values():
        assert pathlib.Path(f).stat().st_size > 0
    assert oct(pathlib.Path(files["key_file"]).stat().st_mode & 0o777) == "0o600"
    with pytest.raises(cohort.Error, match="exist"):  # never replaces a CA by accident
        cohort.keygen_ca(str(tmp_path / "ca"))
    cohort.keygen_ca(str(tmp_path / "ca"), overwrite=True)
    out = subprocess.run(["openssl", "x509", "-noout", "-subject", "-in", files["cert_file"]],
                         capture_output=True, text=True, check=True).stdout
    assert "CN = alice" in out


def test_simulate_runs_cohort_sim_in_process(tmp_path):
    cohort.set_log_level("warn")  # as cohort-sim: no line per registered client
    metrics = tmp_path / "sim.jsonl"
    summary = cohort.simulate(options={
        "model.spec": "mlp:784-32-10", "server.rounds": 3, "sim.clients": 20,
        "server.clients_per_round": 5, "train.steps": 20, "train.lr": 0.1, "sim.metrics_file": str(metrics),
        "sim.csv_file": str(tmp_path / "sim.csv")})
    assert summary["rounds"] == 3 and summary["committed"] == 3
    assert 0.5 < summary["final_accuracy"] <= 1
    assert summary["metrics_file"] == str(metrics)
    assert metrics.stat().st_size > 0
    rounds = [r for r in summary["metrics"] if r["event"] == "sim_round"]
    assert [r["round"] for r in rounds] == [1, 2, 3]
    assert rounds[-1]["test_accuracy"] == pytest.approx(summary["final_accuracy"], abs=1e-6)
    with pytest.raises(cohort.ConfigError, match="sim.cliens"):
        cohort.simulate(options={"sim.cliens": 3})


def test_the_module_imports_from_an_installed_prefix(tmp_path):
    prefix = tmp_path / "prefix"
    subprocess.run(["cmake", "--install", str(BUILD), "--prefix", str(prefix)], check=True,
                   capture_output=True)
    site = next(prefix.glob("lib*/python3*/dist-packages"))
    env = dict(os.environ, PYTHONPATH=str(site))
    out = subprocess.run(
        [sys.executable, "-c", "import cohort, cohort.torch; print(cohort.__file__); "
         "print(cohort.aggregate([[1.0, 2.0]]))"],
        capture_output=True, text=True, env=env, cwd=tmp_path, check=True).stdout
    assert out.splitlines()[0].startswith(str(site))
    assert "[1. 2.]" in out
