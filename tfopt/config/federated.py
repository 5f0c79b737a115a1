"""The ``federated`` section: how ``tfopt federated`` trains over clients with Flower (see
docs/federated.md)."""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass

from tfopt.config.fields import flag
from tfopt.core.errors import ConfigError

#: federated.algorithm: how the server combines the clients' models.
ALGORITHMS = ("fedavg", "fedprox")
#: federated.partition: how the training split is dealt out to the clients.
PARTITIONS = ("iid", "shards", "dirichlet")
#: federated.client_runtime: what a client trains with.
CLIENT_RUNTIMES = ("keras", "litert")
#: federated.engine: how Flower runs the clients.
ENGINES = ("deployment", "simulation")


@dataclass(frozen=True)
class FederatedConfig:
    """Federated averaging on Flower: clients, rounds, local training, partitions, client-level DP."""

    #: The fields whose values decide which of the others are read (:attr:`Flag.read_by`).
    CHOSEN_BY: typing.ClassVar[tuple[str, ...]] = ("algorithm", "partition")

    clients: int = flag(
        3,
        "--clients",
        "clients (Flower SuperNodes: processes, or virtual ones under --engine simulation), each "
        "holding one partition of the training split",
        metavar="N",
    )
    rounds: int = flag(5, "--rounds", "federated rounds", metavar="N")
    fraction: float = flag(
        1.0, "--fraction", "share of the clients sampled each round (C)", metavar="C"
    )
    local_epochs: int = flag(
        1,
        "--local-epochs",
        "passes each sampled client makes over its partition per round (E); its batch is "
        "--batch-size (B)",
        metavar="E",
    )
    client_lr: float = flag(
        0.01, "--client-lr", "the clients' SGD learning rate (constant)", metavar="RATE"
    )
    client_runtime: str = flag(
        "keras",
        "--client-runtime",
        "keras (every layer trains) or litert (the model's last Dense layer trains in LiteRT "
        "through the .tflite training signature, as on a phone; the layers before it stay "
        "frozen: start from a trained --model)",
        choices=CLIENT_RUNTIMES,
    )
    algorithm: str = flag(
        "fedavg",
        "--algorithm",
        "fedavg (McMahan et al.), or fedprox (each client's loss gains mu/2 ||w - w_global||^2)",
        choices=ALGORITHMS,
    )
    proximal_mu: float = flag(
        0.01, "--proximal-mu", "FedProx's mu", metavar="MU", read_by=("fedprox",)
    )
    partition: str = flag(
        "iid",
        "--partition",
        "iid (shuffled, equal parts), shards (label-sorted shards, --shards-per-client each: "
        "McMahan et al.'s pathological non-IID) or dirichlet (each class dealt out in "
        "Dirichlet(--dirichlet-alpha) shares)",
        choices=PARTITIONS,
    )
    shards_per_client: int = flag(
        2, "--shards-per-client", "shards: shards per client", metavar="N", read_by=("shards",)
    )
    dirichlet_alpha: float = flag(
        0.5,
        "--dirichlet-alpha",
        "dirichlet: concentration (small = few classes per client)",
        metavar="ALPHA",
        read_by=("dirichlet",),
    )
    round_timeout: float = flag(
        600.0,
        "--round-timeout",
        "seconds a round waits for its clients; a client not back by then, or lost (Flower "
        "notices within about 60 s), is left out of the round",
        metavar="SECONDS",
    )
    engine: str = flag(
        "deployment",
        "--engine",
        "deployment (a SuperLink and one SuperNode process per client, as on real devices) or "
        "simulation (Flower's simulation engine, flwr[simulation]: the SuperLink runs every "
        "client's ClientApp in Ray actors, one CPU each; for many clients on one machine)",
        choices=ENGINES,
    )
    superlink: str = flag(
        "",
        "--superlink",
        "a running Flower SuperLink to run on, whose SuperNodes were started with --node-config "
        "'partition-id=I num-partitions=N' (e.g. what --render kubernetes prints); default: "
        "tfopt starts a SuperLink and the SuperNodes as processes",
        metavar="HOST:PORT",
    )
    dp_clip: float = flag(
        0.0,
        "--fed-dp-clip",
        "client-level DP: clip each client's update to this L2 norm and add Gaussian noise to "
        "their sum at the server (0 = off)",
        metavar="C",
    )
    dp_noise: float = flag(
        0.0,
        "--fed-dp-noise",
        "client-level DP noise multiplier: the noise's std over --fed-dp-clip",
        metavar="SIGMA",
    )
    dp_delta: float = flag(
        1e-5, "--fed-dp-delta", "client-level DP: the delta epsilon is reported at", metavar="DELTA"
    )


def check_federated(f: FederatedConfig) -> None:
    """The federated settings in range.

    Raises:
        ConfigError: one line naming the value and the fix.
    """
    bad = None
    if f.clients < 1:
        bad = "clients", "must be >= 1"
    elif f.rounds < 1:
        bad = "rounds", "must be >= 1"
    elif not 0.0 < f.fraction <= 1.0:
        bad = "fraction", "must be in (0, 1] (the share of clients sampled each round)"
    elif f.local_epochs < 1:
        bad = "local_epochs", "must be >= 1"
    elif not f.client_lr > 0:
        bad = "client_lr", "must be > 0, e.g. 0.01"
    elif not f.proximal_mu >= 0:
        bad = "proximal_mu", "must be >= 0"
    elif f.shards_per_client < 1:
        bad = "shards_per_client", "must be >= 1"
    elif not f.dirichlet_alpha > 0:
        bad = "dirichlet_alpha", "must be > 0, e.g. 0.5"
    elif not f.round_timeout > 0:
        bad = "round_timeout", "must be > 0 seconds"
    elif not f.dp_clip >= 0 or not f.dp_noise >= 0:
        bad = ("dp_clip", "must be >= 0") if f.dp_clip < 0 else ("dp_noise", "must be >= 0")
    elif not 0 < f.dp_delta < 1:
        bad = "dp_delta", "must be in (0, 1)"
    if f.superlink and not re.fullmatch(
        r"[A-Za-z0-9.\-]+:\d{1,5}|\[[0-9a-fA-F:]+\]:\d{1,5}", f.superlink
    ):
        bad = "superlink", "must be HOST:PORT, e.g. fed-superlink:8000"
    if bad:
        key, rule = bad
        raise ConfigError(f"federated.{key}={getattr(f, key)!r} {rule}")
    if f.client_runtime == "litert" and f.algorithm == "fedprox":
        raise ConfigError(
            "--algorithm fedprox adds a proximal term to the clients' loss, and the .tflite "
            "training signature of --client-runtime litert takes plain SGD steps; use "
            "--algorithm fedavg, or --client-runtime keras"
        )
    if f.engine == "simulation" and f.superlink:
        raise ConfigError(
            f"--engine simulation runs Flower's SuperLink here, and --superlink {f.superlink} "
            "names one running elsewhere; drop one of them"
        )
    if bool(f.dp_clip) != bool(f.dp_noise):
        raise ConfigError(
            "client-level DP needs both --fed-dp-clip C and --fed-dp-noise SIGMA "
            f"(got clip {f.dp_clip:g}, noise {f.dp_noise:g}); give both, or neither"
        )
