"""Where a local cluster's tasks listen: free ports, the TF_CONFIG cluster, the tf.data service
tasks, and the private network namespace the tasks run in."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

from tfopt.core.children import ISOLATED_ENV, LOOPBACK
from tfopt.core.errors import ConfigError

SERVE = [sys.executable, "-m", "tfopt.data.serve"]  # runs a dispatcher or a worker


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """Returns ``n`` distinct TCP ports that are free on ``host`` right now.

    All sockets are held open until every port is chosen, so the ports differ; another
    program may still take one before the task binds it (rare on loopback).

    Raises:
        ConfigError: ``host`` is not an IPv4 address or name of this machine.
    """
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            try:
                s.bind((host, 0))
            except (OSError, UnicodeError) as e:
                raise ConfigError(
                    f"--host {host!r} is not an address of this machine ({e.strerror or e}); give "
                    "127.0.0.1 (the default) or one of this machine's IPv4 addresses "
                    "(hostname -I)"
                ) from None
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def make_cluster(
    workers: int, ps: int = 0, chief: bool = False, host: str = "127.0.0.1", evaluator: bool = False
) -> dict[str, list[str]]:
    """Builds a TF_CONFIG ``cluster`` dict on free ports of ``host``.

    Args:
        workers: Number of ``worker`` tasks.
        ps: Number of ``ps`` tasks.
        chief: Add one ``chief`` task.
        host: Address every task listens on.
        evaluator: Add one ``evaluator`` task (listed in ``cluster``, as the Kubeflow operator does;
            it takes no part in the training).

    Returns:
        ``{"chief": [...], "worker": [...], "ps": [...], "evaluator": [...]}`` with empty roles left out.

    Raises:
        ConfigError: negative counts, no task at all, or ps tasks without a chief and a worker.
    """
    if workers < 0 or ps < 0:
        raise ConfigError(f"--workers={workers} / --ps={ps} must be >= 0")
    if workers + int(chief) < 1:
        raise ConfigError(
            f"--workers={workers} without --chief starts no task; give --workers 1 or more"
        )
    if ps and (not chief or workers < 1):
        raise ConfigError(
            f"--ps={ps} needs --chief and --workers >= 1 (ParameterServerStrategy: one chief, "
            "workers and ps tasks); add --chief or drop --ps"
        )
    counts = {"chief": int(chief), "worker": workers, "ps": ps, "evaluator": int(evaluator)}
    ports = iter(free_ports(sum(counts.values()), host))
    return {role: [f"{host}:{next(ports)}" for _ in range(n)] for role, n in counts.items() if n}


def data_service_tasks(
    data_workers: int, host: str, taken: list[str], work_dir: str, bind: str | None = None
) -> dict[str, list[tuple[list[str], int]]]:
    """The commands and ports of a tf.data service beside a cluster: one dispatcher, N workers.

    Args:
        data_workers: Number of tf.data service workers (>= 1).
        host: Address the servers listen on and register (the cluster's host).
        taken: The cluster's ``HOST:PORT`` addresses; the service's ports differ from them.
        work_dir: The dispatcher's journal directory (fault-tolerant mode).
        bind: Where to look for free ports, when not ``host`` (a simulated host's address).

    Returns:
        ``{"dispatcher": [(command, port)], "data-worker": [(command, port), ...]}``; the trainers
        read from ``grpc://HOST:PORT`` of the dispatcher.
    """
    used = {int(address.rpartition(":")[2]) for address in taken}
    ports: list[int] = []
    while len(ports) < data_workers + 1:
        ports += [
            p for p in free_ports(data_workers + 1 - len(ports), bind or host) if p not in used
        ]
        used.update(ports)
    serve = list(SERVE)
    dispatcher, *workers = ports
    return {
        "dispatcher": [
            ([*serve, "dispatcher", "--port", str(dispatcher), "--work-dir", work_dir], dispatcher)
        ],
        "data-worker": [
            (
                [
                    *serve,
                    "worker",
                    "--dispatcher",
                    f"{host}:{dispatcher}",
                    "--host",
                    host,
                    "--port",
                    str(port),
                ],
                port,
            )
            for port in workers
        ],
    }


_NAMESPACE = ["sh", "-c", 'ip link set lo up && exec "$@"', "sh"]


def isolation_prefix() -> list[str]:
    """The command prefix that runs a program in a private network namespace with loopback up.

    Root gets a bare network namespace (``unshare -n``); other users get it inside a user
    namespace (``unshare -rn``: root there, themselves outside, files theirs).

    Raises:
        ConfigError: this kernel or user cannot create one (needs ``unshare`` and ``ip``, and
            root or unprivileged user namespaces).
    """
    missing = [tool for tool in ("unshare", "ip") if shutil.which(tool) is None]
    if missing:
        raise ConfigError(
            f"--isolate needs the {' and '.join(missing)} command(s); install util-linux and "
            "iproute2, or pass --no-isolate on a trusted machine"
        )
    reason = "unknown reason"
    for flags in (["-n"], ["-rn"]) if os.geteuid() == 0 else (["-rn"],):
        prefix = ["unshare", *flags, *_NAMESPACE]
        probe = subprocess.run([*prefix, "true"], capture_output=True, text=True)
        if probe.returncode == 0:
            return prefix
        reason = (probe.stderr.strip().splitlines() or [reason])[-1]
    raise ConfigError(
        f"--isolate cannot create a network namespace ({reason}); run as root or enable "
        "unprivileged user namespaces (sysctl user.max_user_namespaces), or pass --no-isolate "
        "on a trusted machine"
    )


def isolation(isolate: bool | None, host: str) -> list[str]:
    """The prefix this launch runs under: [] when off, unwanted, or (for the default) not possible."""
    if os.environ.get(ISOLATED_ENV) or isolate is False:
        return []
    if isolate is None:
        if host not in LOOPBACK:  # peers dial an address a private namespace does not have
            return []
        try:
            return isolation_prefix()
        except ConfigError:
            return []  # the chief warns that the ports are open (runtime.tf_config.exposure_warning)
    return isolation_prefix()
