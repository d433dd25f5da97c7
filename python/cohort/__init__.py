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
from ._cohort import FederatedStep, aggregate, keygen_ca, keygen_node, set_log_level, simulate  # noqa: F401

__all__ = [
    "Client", "Round", "FederatedStep", "aggregate", "keygen_ca", "keygen_node", "simulate", "set_log_level",
    "Error", "ConfigError", "DataError", "TransportError", "TimeoutError", "ProtocolError",
    "KernelError", "InternalError", "TrainingError",
]
