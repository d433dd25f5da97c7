"""Cohort from Python: join a federation with your own (PyTorch, NumPy) training, aggregate
updates with Cohort's rules, make keys, and run the simulator.

    import cohort, cohort.torch
    client = cohort.Client("client.toml")
    client.run(cohort.torch.Trainer(model, train_set), num_samples=len(train_set))

The C++ core is cohort._cohort; Cohort's errors are raised as cohort.Error and its subclasses
(ConfigError, DataError, TransportError, TimeoutError, ProtocolError, ...) with the C++ message.
"""

from ._cohort import (  # noqa: F401
    Client,
    ConfigError,
    DataError,
    Error,
    InternalError,
    KernelError,
    ProtocolError,
    Round,
    TimeoutError,
    TrainingError,
    TransportError,
)
from ._cohort import FederatedStep, aggregate, keygen_ca, keygen_node, set_log_level  # noqa: F401
from ._cohort import simulate as _simulate


def simulate(config=None, options=None):
    """Runs cohort-sim in this process (the GIL released; Ctrl-C stops it).

    config: a simulation TOML file (examples/sim/*.toml); options: a dict of its dotted keys
    overriding the file, e.g. {"server.rounds": 5, "sim.clients": 100}. Returns the summary
    (rounds, committed, sim_seconds, final_accuracy, final_loss, wall_seconds, participation,
    metrics_file, csv_file, ...) with "metrics": the records of sim.metrics_file (one dict per
    JSON line: "round" records per round, ...)."""
    import json
    import os

    summary = _simulate(None if config is None else os.fspath(config), options or {})
    records = []
    path = summary.get("metrics_file")
    if path and os.path.exists(path):
        with open(path) as f:
            records = [json.loads(line) for line in f if line.strip()]
    summary["metrics"] = records
    return summary


__all__ = [
    "Client", "Round", "FederatedStep", "aggregate", "keygen_ca", "keygen_node", "simulate", "set_log_level",
    "Error", "ConfigError", "DataError", "TransportError", "TimeoutError", "ProtocolError",
    "KernelError", "InternalError", "TrainingError",
]
