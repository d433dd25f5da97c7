"""cohort.torch: the Cohort vector layout of a PyTorch module, and the local Trainer, with a fake
cohort.Round (no federation)."""
import types

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

import cohort  # noqa: E402
import cohort.torch as ct  # noqa: E402

nn = torch.nn
torch.set_num_threads(1)


def make_round(**kw):
    """The attributes of cohort.Round, with the stock trainer's defaults."""
    r = dict(id=1, model_version=1, local_steps=0, seed=7, model_spec="", parameter_count=0,
             train_toml="", batch_size=16, epochs=1, steps=0, drop_last=False, lr=0.1,
             optimizer="sgd", momentum=0.0, nesterov=False, weight_decay=0.0, prox_mu=0.0,
             loss="cross_entropy")
    r.update(kw)
    return types.SimpleNamespace(**r)


def mlp(widths=(784, 256, 128, 10)):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def cnn_bn():
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 4 * 4, 3))


def blobs(n=240, dim=8, classes=3, seed=0, spread=0.6):
    """Gaussian clusters: a problem a small MLP learns in a few dozen steps."""
    g = np.random.default_rng(seed)
    centers = g.normal(size=(classes, dim)).astype(np.float32) * 2
    y = g.integers(0, classes, size=n)
    x = centers[y] + spread * g.normal(size=(n, dim)).astype(np.float32)
    return x.astype(np.float32), y.astype(np.int64)


# --- layout -------------------------------------------------------------------------------


def test_mlp_matches_cohorts_mlp_spec():
    assert cohort.torch is ct  # the submodule of the package, not PyTorch
    assert ct.torch is torch and ct.torch.__name__ == "torch"
    model = mlp()
    assert ct.parameter_count(model) == 235146
    assert ct.to_vector(model).shape == (235146,)
    assert ct.state_names(model) == ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight",
                                     "4.bias"]


def test_vector_is_the_state_dict_flattened_in_order_without_num_batches_tracked():
    model = cnn_bn()
    model.train()
    model(torch.randn(5, 1, 8, 8))  # moves the running statistics off their defaults
    names = ct.state_names(model)
    assert "1.num_batches_tracked" in model.state_dict()
    assert not any(k.endswith("num_batches_tracked") for k in names)
    assert names == ["0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean",
                     "1.running_var", "5.weight", "5.bias"]
    sd = model.state_dict()
    expected = np.concatenate([sd[k].reshape(-1).numpy() for k in names])
    v = ct.to_vector(model)
    assert v.dtype == np.float32 and v.flags.c_contiguous
    assert ct.parameter_count(model) == v.size == 4 * 9 + 4 + 4 * 4 + 64 * 3 + 3
    np.testing.assert_array_equal(v, expected)


def test_round_trip_into_another_module_including_running_statistics():
    a, b = cnn_bn(), cnn_bn()
    a(torch.randn(6, 1, 8, 8))
    counter = b.state_dict()["1.num_batches_tracked"].clone()
    v = ct.to_vector(a)
    ct.from_vector(b, v)
    np.testing.assert_array_equal(ct.to_vector(b), v)
    for k, t in a.state_dict().items():
        if not k.endswith("num_batches_tracked"):
            assert torch.equal(b.state_dict()[k], t), k
    assert torch.equal(b.state_dict()["1.num_batches_tracked"], counter)  # left alone
    # In place, the module's own tensors, no autograd history.
    w = b[0].weight
    ct.from_vector(b, np.zeros_like(v))
    assert b[0].weight is w and w.grad_fn is None and w.requires_grad
    assert float(b[1].running_var.abs().sum()) == 0.0
    # A list and a float64 array are converted.
    ct.from_vector(b, v.astype(np.float64).tolist())
    np.testing.assert_array_equal(ct.to_vector(b), v)


def test_to_vector_is_a_copy():
    model = mlp((4, 3, 2))
    v = ct.to_vector(model)
    v[:] = 5
    assert not np.any(ct.to_vector(model) == 5)


def test_wrong_length_names_both():
    model = mlp((4, 3, 2))
    n = ct.parameter_count(model)
    assert n == 4 * 3 + 3 + 3 * 2 + 2
    before = ct.to_vector(model)
    for bad in (n - 1, n + 1, 0):
        with pytest.raises(ValueError) as e:
            ct.from_vector(model, np.zeros(bad, dtype=np.float32))
        assert str(bad) in str(e.value) and str(n) in str(e.value)
    np.testing.assert_array_equal(ct.to_vector(model), before)  # nothing was copied


# --- Trainer ------------------------------------------------------------------------------


def test_local_steps_are_taken_exactly_and_reported():
    x, y = blobs(n=100)
    trainer = ct.Trainer(mlp((8, 16, 3)), (x, y))
    start = ct.to_vector(trainer.model)
    # 100 examples in batches of 16: 7 batches an epoch (the last of 4); 9 steps reshuffle once.
    update, n, m = trainer(start, make_round(local_steps=9, epochs=5))
    assert n == 100
    assert m["steps"] == 9 and m["samples"] == 100 + 2 * 16
    assert np.isfinite(m["loss"]) and m["loss"] > 0
    assert 0 < m["train_seconds"] < 10
    assert update.shape == start.shape and update.dtype == np.float32
    assert not np.array_equal(update, start)
    # drop_last: 6 full batches an epoch.
    _, _, m = trainer(start, make_round(local_steps=9, drop_last=True))
    assert m["steps"] == 9 and m["samples"] == 9 * 16


def test_steps_then_epochs_when_no_local_steps():
    x, y = blobs(n=100)
    trainer = ct.Trainer(mlp((8, 16, 3)), (x, y))
    start = ct.to_vector(trainer.model)
    _, _, m = trainer(start, make_round(steps=10, epochs=3))
    assert m["steps"] == 10 and m["samples"] == 100 + 3 * 16
    _, _, m = trainer(start, make_round(epochs=2))
    assert m["steps"] == 14 and m["samples"] == 200
    _, _, m = trainer(start, make_round(epochs=2, drop_last=True))
    assert m["steps"] == 12 and m["samples"] == 192


def test_training_starts_from_params_and_is_seeded():
    x, y = blobs(n=64)
    trainer = ct.Trainer(mlp((8, 16, 3)), (x, y))
    start = ct.to_vector(trainer.model)
    a, _, ma = trainer(start, make_round(local_steps=5, seed=3))
    b, _, mb = trainer(start, make_round(local_steps=5, seed=3))  # model was moved by the first
    np.testing.assert_array_equal(a, b)
    assert ma["loss"] == mb["loss"]
    c, _, _ = trainer(start, make_round(local_steps=5, seed=4))
    assert not np.array_equal(a, c)


def test_a_round_lowers_the_loss():
    x, y = blobs(n=240, seed=1)
    trainer = ct.Trainer(mlp((8, 32, 3)), (x, y), test_data=(x, y))
    torch.manual_seed(0)
    start = ct.to_vector(trainer.model)
    loss0, count, m0 = trainer.evaluate(start, make_round())
    update, _, m = trainer(start, make_round(epochs=3, batch_size=16, lr=0.1, momentum=0.9))
    loss1, _, m1 = trainer.evaluate(update, make_round())
    assert count == 240
    assert loss1 < 0.5 * loss0
    assert m1["accuracy"] > max(0.9, m0["accuracy"])
    assert m["loss"] < loss0


def test_evaluate_reports_accuracy_in_0_1():
    x, y = blobs(n=50)
    xt, yt = blobs(n=30, seed=5)
    trainer = ct.Trainer(mlp((8, 16, 3)), (x, y), test_data=(torch.from_numpy(xt),
                                                             torch.from_numpy(yt)))
    trainer.eval_batch_size = 7  # several batches, the last partial
    loss, count, m = trainer.evaluate(ct.to_vector(trainer.model), make_round())
    assert count == 30 and np.isfinite(loss) and loss > 0
    assert 0.0 <= m["accuracy"] <= 1.0
    # The same as computing it directly.
    with torch.no_grad():
        out = trainer.model(torch.from_numpy(xt))
    assert m["accuracy"] == pytest.approx(float((out.argmax(1) == torch.from_numpy(yt)).float()
                                                .mean()))
    assert loss == pytest.approx(float(nn.functional.cross_entropy(out, torch.from_numpy(yt))),
                                 rel=1e-5)
    with pytest.raises(ValueError):
        ct.Trainer(mlp((8, 16, 3)), (x, y)).evaluate(ct.to_vector(trainer.model), make_round())


def test_a_dataset_trains_like_the_same_tensors():
    x, y = blobs(n=70)

    class Items(torch.utils.data.Dataset):
        def __len__(self):
            return len(y)

        def __getitem__(self, i):
            return torch.from_numpy(x[i]), int(y[i])

    model = mlp((8, 16, 3))
    start = ct.to_vector(model)
    r = make_round(local_steps=6, seed=11)
    a, n_a, ma = ct.Trainer(model, (x, y))(start, r)
    b, n_b, mb = ct.Trainer(model, Items())(start, r)
    assert n_a == n_b == 70 and ma["samples"] == mb["samples"]
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_fedprox_pulls_towards_the_global_model():
    x, y = blobs(n=128)
    trainer = ct.Trainer(mlp((8, 16, 3)), (x, y))
    start = ct.to_vector(trainer.model)
    free, _, _ = trainer(start, make_round(local_steps=20, lr=0.2))
    prox, _, _ = trainer(start, make_round(local_steps=20, lr=0.2, prox_mu=2.0))
    assert np.linalg.norm(prox - start) < 0.8 * np.linalg.norm(free - start)


def test_optimizers_and_a_users_optimizer():
    x, y = blobs(n=64)
    trainer = ct.Trainer(mlp((8, 16, 3)), (x, y))
    start = ct.to_vector(trainer.model)
    sgd, _, _ = trainer(start, make_round(local_steps=3))
    adam, _, _ = trainer(start, make_round(local_steps=3, optimizer="adam", lr=0.01))
    # Adam's first step moves every weight with a gradient by about lr.
    assert np.median(np.abs(adam - start)) > 0.005
    assert not np.allclose(sgd, adam)
    with pytest.raises(ValueError):
        trainer(start, make_round(local_steps=1, optimizer="lamb"))

    made = []

    def mine(params, round):
        made.append(round.id)
        return torch.optim.SGD(params, lr=0.0)

    frozen = ct.Trainer(trainer.model, (x, y), optimizer=mine)
    out, _, m = frozen(start, make_round(local_steps=4, id=42))
    assert made == [42] and m["steps"] == 4
    np.testing.assert_array_equal(out, start)  # lr 0: nothing moved


def test_mse_follows_the_round():
    g = np.random.default_rng(0)
    x = g.normal(size=(96, 4)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], dtype=np.float32)).astype(np.float32)
    model = nn.Linear(4, 1)
    trainer = ct.Trainer(model, (x, y), test_data=(x, y))
    start = ct.to_vector(model)
    r = make_round(loss="mse", epochs=20, lr=0.05)
    loss0, count, m0 = trainer.evaluate(start, r)
    update, _, _ = trainer(start, r)
    loss1, _, m1 = trainer.evaluate(update, r)
    assert count == 96 and m0 == {} and m1 == {}
    assert loss1 < 0.05 * loss0


def test_train_seconds_exclude_the_conversions():
    x, y = blobs(n=32)
    model = mlp((8, 2000, 2000, 3))  # 4M floats: from_vector/to_vector take measurable time
    trainer = ct.Trainer(model, (x, y))
    start = ct.to_vector(model)
    import time
    t0 = time.perf_counter()
    _, _, m = trainer(start, make_round(local_steps=1, lr=0.0))
    total = time.perf_counter() - t0
    assert 0 < m["train_seconds"] < total


def test_the_coordinators_lr_schedule_from_train_toml():
    x, y = blobs(n=64)
    trainer = ct.Trainer(mlp((8, 16, 3)), (x, y))
    start = ct.to_vector(trainer.model)
    one, _, _ = trainer(start, make_round(local_steps=1))
    # step:1:GAMMA: lr x GAMMA^step, so with a tiny GAMMA only the first step moves the model.
    decayed, _, m = trainer(start, make_round(local_steps=4,
                                              train_toml='lr_schedule = "step:1:1e-20"\n'))
    assert m["steps"] == 4
    np.testing.assert_allclose(decayed, one, rtol=0, atol=1e-6)
    plain, _, _ = trainer(start, make_round(local_steps=4))
    assert np.abs(plain - one).max() > 1e-3
