"""cohort.Client in real federations: a cohort-server shard and stock cohort-client processes over
mutual TLS on loopback (conftest.py), with a Python client in this process."""

import json
import math
import os
import signal
import time

import numpy as np
import pytest

import cohort
from conftest import ClientThread, small_mlp_args

MLP_SMALL = 784 * 32 + 32 + 32 * 10 + 10  # mlp:784-32-10, PyTorch's state_dict order


def test_python_and_cpp_clients_train_one_model(federation):
    # The C++ client trains with lr = 0, so the global model moves by the Python client's update
    # alone, weighted by its num_samples against the C++ client's 30,000 (part 0/2): what the
    # Python client sees in round 2 tells whether the protocol carried its update exactly.
    f = federation(["client-0", "py-0"], small_mlp_args(2, 2, 2, ["--train.lr=0"]))
    f.start_server()
    f.start_cpp_client("client-0", "0/2")
    seen, rounds = [], []
    step = np.linspace(-0.5, 0.5, MLP_SMALL, dtype=np.float32)

    def train(params, rnd):
        assert params.dtype == np.float32 and params.shape == (MLP_SMALL,)
        seen.append(params.copy())
        rounds.append((rnd.id, rnd.model_spec, rnd.batch_size, rnd.steps, rnd.lr, rnd.loss))
        return params + step, 10000, {"loss": 1.5, "steps": 2, "samples": 64}

    c = ClientThread(cohort.Client(options=f.client_options("py-0")), train, 10000)
    assert c.join(120) is None
    assert f.wait_server(60) == 0
    assert [r[0] for r in rounds] == [1, 2]
    assert rounds[0][1:] == ("mlp:784-32-10", 64, 2, 0.0, "cross_entropy")
    expected = seen[0] + step * (10000 / 40000)
    np.testing.assert_allclose(seen[1], expected, rtol=0, atol=1e-6)
    records = f.records("client")
    assert sorted((r["round_id"], r["client"]) for r in records if r["trained"]) == [
        (1, "client-0"), (1, "py-0"), (2, "client-0"), (2, "py-0")]
    for r in records:  # the round's time as each client measured it, and its parts
        assert r["round_seconds"] > 0 and r["round_seconds"] >= r["comm_seconds"]


def test_compression_and_dp_clip_through_the_config_keys(federation, tmp_path):
    # The same exact check through compressor.name = fp16 and client.dp_clip = 1 set in a TOML
    # file, as for cohort-client: the step the server takes is the clipped update (L2 norm 1),
    # rounded to half precision, times the Python client's weight 1/4.
    f = federation(["client-0", "py-0"], small_mlp_args(2, 2, 2, ["--train.lr=0"]))
    f.start_server()
    f.start_cpp_client("client-0", "0/2")
    config = tmp_path / "client.toml"
    config.write_text('[client]\ndp_clip = 1.0\n[compressor]\nname = "fp16"\n')
    seen = []
    step = np.full(MLP_SMALL, 0.5, np.float32)

    def train(params, rnd):
        seen.append(params.copy())
        return params + step, 10000

    c = ClientThread(cohort.Client(str(config), f.client_options("py-0")), train, 10000)
    assert c.join(120) is None
    assert f.wait_server(60) == 0
    clipped = step / np.linalg.norm(step)
    np.testing.assert_allclose(seen[1] - seen[0], clipped / 4, rtol=2e-3, atol=1e-7)


@pytest.mark.parametrize("bad, message", [
    (lambda p: p[:-1], "values; the coordinator's model"),
    (lambda p: np.where(np.arange(p.size) == 7, np.nan, p), "non-finite value (nan) at element 7"),
    (lambda p: "not an array", "not an array of numbers"),
])
def test_a_bad_update_raises_and_the_federation_goes_on(federation, bad, message):
    f = federation(["client-0", "py-0"], small_mlp_args(3, 2, 1))
    f.start_server()
    cpp = f.start_cpp_client("client-0", "0/2")
    calls = []

    def train(params, rnd):
        calls.append(rnd.id)
        return bad(params), 100

    c = ClientThread(cohort.Client(options=f.client_options("py-0")), train, 100)
    err = c.join(120)
    assert isinstance(err, cohort.DataError), repr(err)
    assert message in str(err)
    assert calls == [calls[0]]  # it stopped at its first round
    # The coordinator heard why and dropped it: the stock client finishes the 3 rounds alone.
    assert f.wait_server(120) == 0
    assert cpp.wait(30) == 0
    assert len([r for r in f.records("round") if r.get("committed", True)]) >= 3
    assert "py-0 stopped with an error" in f.log("server") or "py-0" in f.log("server")


def test_an_exception_in_train_comes_up_as_itself(federation):
    f = federation(["client-0", "py-0"], small_mlp_args(2, 2, 1))
    f.start_server()
    f.start_cpp_client("client-0", "0/2")

    def train(params, rnd):
        raise ValueError("my model diverged")

    c = ClientThread(cohort.Client(options=f.client_options("py-0")), train, 100)
    err = c.join(120)
    assert type(err) is ValueError and str(err) == "my model diverged"
    assert f.wait_server(120) == 0
    assert "my model diverged" in f.log("server")  # the coordinator was told


def test_a_wrong_certificate_is_refused(federation, tmp_path):
    f = federation(["client-0", "py-0"], small_mlp_args(1, 1, 1))
    other = tmp_path / "other"
    cohort.keygen_ca(str(other / "ca"), "someone-else")
    files = cohort.keygen_node(str(other / "ca"), "py-0", str(other / "certs"))
    f.start_server()
    options = f.client_options("py-0", **{"tls.cert_file": files["cert_file"],
                                          "tls.key_file": files["key_file"],
                                          "client.connect_timeout_ms": 5000})
    c = ClientThread(cohort.Client(options=options), lambda p, r: (p, 1), 100)
    err = c.join(60)
    assert isinstance(err, cohort.TransportError), repr(err)
    # The federation is unharmed: a client with a good certificate trains the round.
    cpp = f.start_cpp_client("client-0", "0/2")
    assert f.wait_server(120) == 0
    assert cpp.wait(30) == 0


def test_a_server_that_goes_away_raises_transport_error(federation):
    # Two clients are needed and only the Python one comes: it waits, joined, until the shard
    # is killed; then it gives up after client.connect_timeout_ms.
    f = federation(["py-0"], small_mlp_args(5, 2, 2))
    f.start_server()
    client = cohort.Client(options=f.client_options("py-0", **{"client.connect_timeout_ms": 3000}))
    c = ClientThread(client, lambda p, r: (p, 1), 100)
    time.sleep(2)  # registered and idle by now (the join takes milliseconds on loopback)
    os.killpg(f.server.pid, signal.SIGKILL)
    t0 = time.monotonic()
    err = c.join(60)
    assert isinstance(err, cohort.TransportError), repr(err)
    assert "lost the coordinator" in str(err)
    assert time.monotonic() - t0 < 30


def test_options_a_python_client_cannot_honour_are_refused():
    for key, value in [("data.dir", "/tmp"), ("client.device", "cuda:0"),
                       ("client.memory_budget", 1000000), ("data.partition", "iid")]:
        with pytest.raises(cohort.ConfigError, match=key.replace(".", r"\.")):
            cohort.Client(options={key: value})
    with pytest.raises(cohort.ConfigError, match="client.sever"):
        cohort.Client(options={"client.sever": "tcp://x:1"})  # a typo: unknown key
    c = cohort.Client(options={"client.name": "alice", "data.seed": 7})
    assert c.name == "alice"
    with pytest.raises(cohort.ConfigError, match="num_samples"):
        c.run(lambda p, r: (p, 1), num_samples=0)
    with pytest.raises(TypeError):
        c.run("not callable", num_samples=1)


def test_the_round_tells_the_coordinators_training_options(federation):
    f = federation(["py-0"], ["--model.spec=mlp:784-16-10", "--server.rounds=1",
                              "--server.clients_per_round=1", "--server.min_clients=1",
                              "--server.work=fixed", "--train.steps=3", "--train.batch_size=16",
                              "--train.lr=0.125", "--train.optimizer=adam", "--train.loss=cross_entropy"])
    f.start_server()
    got = []

    def train(params, rnd):
        got.append(dict(batch_size=rnd.batch_size, steps=rnd.steps, lr=rnd.lr, optimizer=rnd.optimizer,
                        count=rnd.parameter_count, local_steps=rnd.local_steps))
        return params, 5, {"steps": 3}

    c = ClientThread(cohort.Client(options=f.client_options("py-0")), train, 5)
    assert c.join(60) is None
    assert f.wait_server(60) == 0
    assert got == [dict(batch_size=16, steps=3, lr=0.125, optimizer="adam",
                        count=784 * 16 + 16 + 16 * 10 + 10, local_steps=3)]  # server.work = fixed
    rec = [r for r in f.records("client") if r["client"] == "py-0"]
    assert rec and rec[0]["trained"] and rec[0]["local_steps"] == 3
    assert math.isfinite(json.loads(json.dumps(rec[0]))["round_seconds"])


def test_steps_other_than_the_round_asked_for_are_refused(federation):
    # server.work = fixed with train.steps = 2: a function that says it took 5 stops the client.
    f = federation(["client-0", "py-0"], small_mlp_args(2, 2, 1))
    f.start_server()
    f.start_cpp_client("client-0", "0/2")
    c = ClientThread(cohort.Client(options=f.client_options("py-0")),
                     lambda p, r: (p, 10, {"steps": 5}), 10)
    err = c.join(120)
    assert isinstance(err, cohort.DataError), repr(err)
    assert "the train function took 5 steps where round" in str(err)
    assert f.wait_server(120) == 0


def test_two_python_clients_shuffle_differently(federation):
    f = federation(["py-0", "py-1"], small_mlp_args(1, 2, 2))
    f.start_server()
    seeds = {}

    def train_as(name):
        def train(params, rnd):
            seeds[name] = rnd.seed
            return params, 10
        return train

    threads = [ClientThread(cohort.Client(options=f.client_options(n)), train_as(n), 10)
               for n in ("py-0", "py-1")]
    for t in threads:
        assert t.join(60) is None
    assert f.wait_server(60) == 0
    assert len(seeds) == 2 and seeds["py-0"] != seeds["py-1"]


def test_a_torch_trainer_is_pulled_into_and_pushed_from_without_copies(federation):
    torch = pytest.importorskip("torch")
    import cohort.torch

    f = federation(["py-0"], small_mlp_args(2, 1, 1))
    f.start_server()
    model = torch.nn.Sequential(torch.nn.Linear(784, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    rng = np.random.default_rng(0)
    trainer = cohort.torch.Trainer(model, (rng.random((256, 784), np.float32),
                                           rng.integers(0, 10, 256)))
    shared = []

    def train(params, rnd):
        shared.append(np.shares_memory(params, trainer.cohort_parameters))
        return trainer(params, rnd)

    train.cohort_parameters = trainer.cohort_parameters  # what Client.run looks for
    c = ClientThread(cohort.Client(options=f.client_options("py-0")), train, 256)
    assert c.join(60) is None
    assert f.wait_server(60) == 0
    assert shared == [True, True]
    # The module's tensors are the array: what was trained is what the client pushed from.
    np.testing.assert_array_equal(cohort.torch.to_vector(model), trainer.cohort_parameters)
    assert [r["trained"] for r in f.records("client")] == [True, True]


def test_fedbuff_takes_python_updates(federation):
    f = federation(["client-0", "py-0"], [
        "--model.spec=mlp:784-32-10", "--server.mode=fedbuff", "--server.rounds=4",
        "--server.min_clients=2", "--train.steps=2", "--server.buffer_size=2",
        "--server.concurrency=2"])
    f.start_server()
    f.start_cpp_client("client-0", "0/2")
    tasks = []

    def train(params, rnd):
        tasks.append(rnd.id)
        return params + 0.001, 100

    c = ClientThread(cohort.Client(options=f.client_options("py-0")), train, 100)
    assert c.join(120) is None
    assert f.wait_server(60) == 0
    assert tasks and len(set(tasks)) == len(tasks)  # each task once


def test_data_parallel_refuses_a_python_client(federation):
    f = federation(["client-0", "py-0"], [
        "--model.spec=mlp:784-32-10", "--server.mode=dataparallel", "--server.steps=5",
        "--server.min_clients=2", "--server.clients_per_round=2"])
    f.start_server()
    f.start_cpp_client("client-0", "0/2")
    c = ClientThread(cohort.Client(options=f.client_options("py-0")), lambda p, r: (p, 1), 100)
    err = c.join(60)
    assert isinstance(err, cohort.ConfigError), repr(err)
    assert "trains federated rounds only" in str(err)
