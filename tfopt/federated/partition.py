"""Dealing the training split out to federated clients: IID, label shards, Dirichlet.

Every function is plain NumPy on the split's labels and a seed, so the chief and a test compute
the same partition. Each returns one index array per client; together they hold every index of
the split exactly once.
"""

from __future__ import annotations

import numpy as np

from tfopt.core.errors import ConfigError

#: Draws of a Dirichlet partition tried before giving up on one with no empty client.
DIRICHLET_TRIES = 100


def iid(n: int, clients: int, seed: int) -> list[np.ndarray]:
    """The ``n`` indices shuffled and cut into ``clients`` parts whose sizes differ by at most one."""
    order = np.random.default_rng(seed).permutation(n)
    return [np.sort(part) for part in np.array_split(order, clients)]


def shards(labels: np.ndarray, clients: int, per_client: int, seed: int) -> list[np.ndarray]:
    """McMahan et al.'s pathological non-IID split: the indices sorted by label, cut into
    ``clients * per_client`` shards of equal size (within one), and each client dealt
    ``per_client`` shards at random, so that most clients see ``per_client`` classes at most."""
    rng = np.random.default_rng(seed)
    shuffled = rng.permutation(len(labels))  # ties within a class in random order
    by_label = shuffled[np.argsort(labels[shuffled], kind="stable")]
    pieces = np.array_split(by_label, clients * per_client)
    dealt = rng.permutation(len(pieces)).reshape(clients, per_client)
    return [np.sort(np.concatenate([pieces[i] for i in row])) for row in dealt]


def dirichlet(labels: np.ndarray, clients: int, alpha: float, seed: int) -> list[np.ndarray]:
    """Each class's indices dealt out in shares drawn from Dirichlet(``alpha``) over the clients
    (Hsu et al., 2019): small ``alpha`` gives each client few classes, large ``alpha`` tends to
    IID. Draws again while a client is left empty.

    Raises:
        ConfigError: no draw of :data:`DIRICHLET_TRIES` leaves every client an example.
    """
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    for _ in range(DIRICHLET_TRIES):
        parts: list[list[np.ndarray]] = [[] for _ in range(clients)]
        for c in classes:
            members = rng.permutation(np.flatnonzero(labels == c))
            shares = rng.dirichlet(np.full(clients, alpha))
            cuts = (np.cumsum(shares)[:-1] * len(members)).astype(int)
            for part, piece in zip(parts, np.split(members, cuts)):
                part.append(piece)
        out = [np.sort(np.concatenate(p)) for p in parts]
        if all(len(p) for p in out):
            return out
    raise ConfigError(
        f"--dirichlet-alpha {alpha:g} leaves some of the {clients} clients without an example "
        f"in {DIRICHLET_TRIES} draws of {len(labels)} examples; give a larger alpha, fewer "
        "--clients, or more data"
    )


def partition(labels: np.ndarray, fed, seed: int) -> list[np.ndarray]:
    """The clients' index arrays into a split with ``labels``, as ``fed`` (a
    :class:`~tfopt.config.FederatedConfig`) says.

    Raises:
        ConfigError: fewer examples than clients (or than shards), or an empty Dirichlet client.
    """
    n, clients = len(labels), fed.clients
    least = clients * (fed.shards_per_client if fed.partition == "shards" else 1)
    if n < least:
        unit = "shards" if fed.partition == "shards" else "clients"
        raise ConfigError(
            f"the training split has {n} examples, fewer than the {least} {unit} of "
            f"--clients {clients}; give fewer --clients or more data (--limit)"
        )
    if fed.partition == "iid":
        return iid(n, clients, seed)
    if fed.partition == "shards":
        return shards(labels, clients, fed.shards_per_client, seed)
    return dirichlet(labels, clients, fed.dirichlet_alpha, seed)


def describe(parts: list[np.ndarray], labels: np.ndarray, num_classes: int) -> dict:
    """What each client holds, for ``run.json``: its example count and class counts, and the
    mean number of classes a client sees."""
    counts = [np.bincount(labels[p], minlength=num_classes).tolist() for p in parts]
    seen = [sum(1 for c in row if c) for row in counts]
    return {
        "examples": [int(len(p)) for p in parts],
        "class_counts": counts,
        "classes_per_client": round(float(np.mean(seen)), 3),
    }
