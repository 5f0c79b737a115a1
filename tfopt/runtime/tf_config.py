"""TF_CONFIG parsing and validation, done before TensorFlow ever sees the variable.

TensorFlow's own errors for a malformed TF_CONFIG arrive late (at strategy creation or at the
first collective), are spread over several lines, or never come at all (a wrong address makes
start-up hang). This module checks the JSON once, at the edge, and raises a one-line
:class:`~tfopt.core.errors.ClusterError` that quotes the bad value, the valid choices and the fix.

It accepts TF_CONFIG as TensorFlow documents it and as the Kubeflow training operator
(``TFJob``, ``kubeflow.org/v1``) writes it::

    {"cluster": {"chief": ["job-chief-0.ns.svc:2222"], "worker": ["job-worker-0.ns.svc:2222"],
                 "ps": ["job-ps-0.ns.svc:2222"], "evaluator": ["job-evaluator-0.ns.svc:2222"]},
     "task": {"type": "worker", "index": 0}, "environment": "cloud"}

The evaluator is not part of the training: it runs beside it (side-car evaluation of the
checkpoints the chief writes), joins no collective and serves no variables. TensorFlow's own
convention leaves it out of ``cluster`` (its TF_CONFIG may even name no other task); the
operator (1.9) lists it there. Either way :attr:`ClusterInfo.training_cluster` is the cluster
without it, which is what a strategy, a resolver or a server must be given, and
:meth:`ClusterInfo.peers` never counts it.

It deliberately imports no TensorFlow, so the launcher and the CLIs can use it cheaply.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tfopt.core.children import ISOLATED_ENV, LOOPBACK
from tfopt.core.errors import ClusterError
from tfopt.core.specs import STRATEGIES

ROLES = ("chief", "worker", "ps", "evaluator")
EVALUATOR = "evaluator"
TRAINING_ROLES = ("chief", "worker", "ps")
TOP_LEVEL_KEYS = ("cluster", "task", "rpc_layer", "environment")
TASK_KEYS = ("type", "index", "trial")

_EXAMPLE = '{"cluster": {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}, "task": {"type": "worker", "index": 0}}'


@dataclass(frozen=True)
class ClusterInfo:
    """A validated TF_CONFIG: the cluster and this process's task in it.

    Attributes:
        cluster: Role (``chief``, ``worker``, ``ps``, ``evaluator``) -> task addresses, as
            TF_CONFIG gives it (an evaluator included when listed).
        task_type: This process's role.
        task_index: This process's index within its role.
        rpc_layer: The RPC protocol TensorFlow servers use.
        environment: TF_CONFIG's ``environment`` (the Kubeflow operator writes ``"cloud"``);
            "" when absent. Informational: tfopt does not act on it.
    """

    cluster: dict[str, tuple[str, ...]]
    task_type: str
    task_index: int
    rpc_layer: str = "grpc"
    environment: str = ""

    @property
    def is_chief(self) -> bool:
        """True for the chief task, or for worker 0 when the cluster has no chief."""
        if self.task_type == "chief":
            return True
        return self.task_type == "worker" and self.task_index == 0 and "chief" not in self.cluster

    @property
    def is_evaluator(self) -> bool:
        """True for the ``evaluator`` task, which evaluates beside the training, outside its cluster."""
        return self.task_type == EVALUATOR

    @property
    def training_cluster(self) -> dict[str, tuple[str, ...]]:
        """The cluster without the evaluator: what a strategy, a resolver or a server must see.

        The evaluator joins no collective and runs no server, while a ParameterServerStrategy
        coordinator connects to every task of the ``ClusterSpec`` it is given.
        """
        return {role: addresses for role, addresses in self.cluster.items() if role != EVALUATOR}

    @property
    def num_workers(self) -> int:
        """The number of ``worker`` tasks (the chief, ps and evaluator are not counted)."""
        return len(self.cluster.get("worker", ()))

    @property
    def address(self) -> str:
        """This task's own ``host:port``; "" for an evaluator that TF_CONFIG leaves out of ``cluster``."""
        addresses = self.cluster.get(self.task_type, ())
        return addresses[self.task_index] if self.task_index < len(addresses) else ""

    @property
    def num_tasks(self) -> int:
        """The number of tasks in the whole cluster, all roles (the evaluator too) included."""
        return sum(len(addresses) for addresses in self.cluster.values())

    @property
    def num_training_tasks(self) -> int:
        """The number of tasks that take part in the training: every role but the evaluator."""
        return sum(len(addresses) for addresses in self.training_cluster.values())

    def peers(self, roles: Iterable[str] | None = None) -> list[str]:
        """Returns the addresses of the other tasks this task works with.

        Args:
            roles: Only list tasks of these roles (e.g. ``("chief", "worker")`` for the peers
                a MultiWorkerMirroredStrategy start-up waits for). None lists every training
                role (chief, worker, ps): the evaluator listens on nothing and nobody waits
                for it, and the evaluator itself has no peers.

        Returns:
            ``host:port`` strings in role order chief, worker, ps, evaluator, without this
            task's own.
        """
        if roles is None:
            if self.is_evaluator:
                return []
            roles = TRAINING_ROLES
        own = self.address
        wanted = tuple(roles)
        return [
            a for role in ROLES if role in wanted for a in self.cluster.get(role, ()) if a != own
        ]

    def to_dict(self) -> dict[str, Any]:
        """Returns the TF_CONFIG dict this info was parsed from (JSON-serializable)."""
        out: dict[str, Any] = {
            "cluster": {role: list(addresses) for role, addresses in self.cluster.items()},
            "task": {"type": self.task_type, "index": self.task_index},
        }
        if self.rpc_layer != "grpc":
            out["rpc_layer"] = self.rpc_layer
        if self.environment:
            out["environment"] = self.environment
        return out


_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]")
RPC_LAYERS = ("grpc",)  # what open-source TensorFlow servers speak


def _check_address(role: str, i: int, address: Any) -> str:
    where = f"TF_CONFIG cluster.{role}[{i}]"
    if not isinstance(address, str):
        raise ClusterError(
            f'{where}={address!r} is not a string; give "host:port" such as "127.0.0.1:2222"'
        )
    host, sep, port = address.rpartition(":")
    if not sep or not port:
        example = f"{address.rstrip(':') or 'localhost'}:2222"
        raise ClusterError(f'{where}={address!r} has no port; give "host:port" such as "{example}"')
    if not host:
        raise ClusterError(
            f'{where}={address!r} has no host; give "host:port" such as "localhost{address}"'
        )
    if not (
        port.isascii() and port.isdigit()
    ):  # int() would take " 2222" and "2_222"; gRPC does not
        raise ClusterError(
            f"{where}={address!r} has port {port!r}, which is not an integer; "
            "give a port number in 1..65535"
        )
    if not _HOST.fullmatch(host):
        raise ClusterError(
            f"{where}={address!r} has host {host!r}, which is not a host name or IP address; "
            'give e.g. "127.0.0.1:2222", "worker-0.svc:2222" or "[::1]:2222"'
        )
    number = int(port)
    if not 1 <= number <= 65535:
        raise ClusterError(
            f"{where}={address!r} has port {number}, outside 1..65535; give a valid port"
        )
    return address


def _check_cluster(cluster: Any) -> dict[str, tuple[str, ...]]:
    if not isinstance(cluster, dict):
        raise ClusterError(
            f"TF_CONFIG cluster={cluster!r} is not an object; give role -> address list, "
            f"e.g. {_EXAMPLE}"
        )
    if not cluster:
        raise ClusterError(
            f"TF_CONFIG cluster is empty; list at least one role ({', '.join(ROLES)}) "
            "with its addresses"
        )
    out: dict[str, tuple[str, ...]] = {}
    seen: dict[str, str] = {}
    for role, addresses in cluster.items():
        if role not in ROLES:
            hint = (
                "; 'master' is the TensorFlow 1.x name of 'chief': rename it (a TFJob: use a Chief replica, "
                "not Master)"
                if role == "master"
                else ""
            )
            raise ClusterError(
                f"TF_CONFIG cluster role {role!r} is unknown; valid roles: {', '.join(ROLES)}{hint}"
            )
        if not isinstance(addresses, list) or not addresses:
            raise ClusterError(
                f'TF_CONFIG cluster.{role}={addresses!r} must be a non-empty list of "host:port" '
                f'strings; give e.g. ["127.0.0.1:2222"] or remove the role'
            )
        for i, address in enumerate(addresses):
            _check_address(role, i, address)
            if address in seen:
                raise ClusterError(
                    f"TF_CONFIG address {address!r} is used twice ({seen[address]} and "
                    f"{role}[{i}]); give every task its own host:port"
                )
            seen[address] = f"{role}[{i}]"
        out[role] = tuple(addresses)
    if len(out.get("chief", ())) > 1:
        raise ClusterError(
            f"TF_CONFIG has {len(out['chief'])} chiefs {list(out['chief'])}; at most one chief "
            "is allowed: make the others workers"
        )
    if len(out.get(EVALUATOR, ())) > 1:
        raise ClusterError(
            f"TF_CONFIG has {len(out[EVALUATOR])} evaluators {list(out[EVALUATOR])}; TensorFlow "
            "allows at most one evaluator: remove the others"
        )
    return out


def _check_task(task: Any, cluster: dict[str, tuple[str, ...]]) -> tuple[str, int]:
    if not isinstance(task, dict):
        raise ClusterError(
            f'TF_CONFIG task={task!r} is not an object; give e.g. {{"type": "worker", "index": 0}}'
        )
    unknown = [k for k in task if k not in TASK_KEYS]
    if unknown:
        raise ClusterError(
            f"TF_CONFIG task key {unknown[0]!r} is unknown; valid keys: {', '.join(TASK_KEYS)}"
        )
    if "type" not in task:
        raise ClusterError(
            f'TF_CONFIG task={task!r} has no "type"; give one of the cluster\'s roles: '
            f"{', '.join(cluster)}"
        )
    task_type = task["type"]
    if task_type == EVALUATOR and EVALUATOR not in cluster:
        # TensorFlow's convention: the evaluator is not part of the cluster it evaluates.
        return task_type, _check_index(task, task_type, 1)
    if task_type not in cluster:
        raise ClusterError(
            f"TF_CONFIG task.type={task_type!r} is not a role of the cluster; "
            f"choose one of {', '.join(cluster)} or add it to cluster"
        )
    return task_type, _check_index(task, task_type, len(cluster[task_type]))


def _check_index(task: dict, task_type: str, n: int) -> int:
    if "index" not in task:
        raise ClusterError(f'TF_CONFIG task={task!r} has no "index"; give an index in 0..{n - 1}')
    index = task["index"]
    if isinstance(index, bool) or not isinstance(index, int):
        raise ClusterError(
            f"TF_CONFIG task.index={index!r} is not an integer; give an index in 0..{n - 1}"
        )
    if not 0 <= index < n:
        raise ClusterError(
            f"TF_CONFIG task.index={index} is out of range for {task_type!r} "
            f"({n} task{'s' if n != 1 else ''}: 0..{n - 1}); fix the index"
        )
    return index


def parse_tf_config(text: str | None) -> ClusterInfo | None:
    """Parses and validates a TF_CONFIG string.

    Args:
        text: The TF_CONFIG JSON, e.g. ``os.environ.get("TF_CONFIG")``.

    Returns:
        The validated cluster, or None when ``text`` is None or blank (single process).

    Raises:
        ClusterError: invalid JSON, not an object, missing or unknown keys, an unknown role,
            an empty role, a bad ``host:port``, a duplicate address, more than one chief, a
            task type not in the cluster or a task index out of range. One line, quoting the
            bad value.
    """
    if text is None or not text.strip():
        return None
    try:
        raw = json.loads(text)
    except ValueError as e:
        snippet = text if len(text) <= 60 else text[:57] + "..."
        raise ClusterError(
            f"TF_CONFIG={snippet!r} is not valid JSON ({e}); give a JSON object like {_EXAMPLE}"
        ) from None
    if not isinstance(raw, dict):
        raise ClusterError(
            f"TF_CONFIG={raw!r} is a JSON {type(raw).__name__}, not an object; "
            f"give an object like {_EXAMPLE}"
        )
    unknown = [k for k in raw if k not in TOP_LEVEL_KEYS]
    if unknown:
        hint = (
            '; it is what a TFJob with enableDynamicWorker writes, and tfopt needs the full "cluster": '
            "set enableDynamicWorker: false"
            if unknown[0] == "sparseCluster"
            else ""
        )
        raise ClusterError(
            f"TF_CONFIG key {unknown[0]!r} is unknown; valid keys: {', '.join(TOP_LEVEL_KEYS)}{hint}"
        )
    for key in ("cluster", "task"):
        if key not in raw:
            raise ClusterError(
                f'TF_CONFIG has no {key!r} key; it needs both "cluster" and "task", e.g. {_EXAMPLE}'
            )
    cluster = _check_cluster(raw["cluster"])
    task_type, task_index = _check_task(raw["task"], cluster)
    rpc_layer = raw.get("rpc_layer") or "grpc"
    if rpc_layer not in RPC_LAYERS:
        raise ClusterError(
            f"TF_CONFIG rpc_layer={rpc_layer!r} is not valid; choose one of {', '.join(RPC_LAYERS)} "
            "or remove it"
        )
    environment = raw.get("environment") or ""
    if not isinstance(environment, str):
        raise ClusterError(
            f'TF_CONFIG environment={environment!r} is not a string; give "cloud" (what the '
            "Kubeflow operator writes) or remove it"
        )
    return ClusterInfo(
        cluster=cluster,
        task_type=task_type,
        task_index=task_index,
        rpc_layer=rpc_layer,
        environment=environment,
    )


def cluster_from_env(environ: dict[str, str] | None = None) -> ClusterInfo | None:
    """Returns the validated ``TF_CONFIG`` of the environment, or None when it is unset."""
    return parse_tf_config((os.environ if environ is None else environ).get("TF_CONFIG"))


def _describe(info: ClusterInfo) -> str:
    return ", ".join(f"{role}:{len(a)}" for role, a in info.cluster.items())


def validate_for_strategy(info: ClusterInfo | None, strategy: str) -> None:
    """Checks that a cluster suits a strategy, before any TensorFlow work.

    * ``one_device`` / ``mirrored`` run in one process: a TF_CONFIG of more than one training
      task is refused (it would silently train N unsynchronised copies); an evaluator beside
      the one training task is fine.
    * ``multi_worker_mirrored`` needs ``worker`` tasks (plus an optional chief or evaluator)
      and no ``ps``. Without TF_CONFIG it runs as a single worker, as TensorFlow does.
    * ``parameter_server`` needs exactly one chief, at least one worker and at least one ps.
    * The ``evaluator`` task is accepted by every strategy. It is not a peer of the training
      tasks, so its TF_CONFIG need not list them (TensorFlow's convention gives it a cluster of
      itself alone); a role the strategy refuses (``ps`` under multi_worker_mirrored) is still
      refused.

    Args:
        info: The parsed TF_CONFIG, or None when unset.
        strategy: A strategy name (see :data:`tfopt.core.specs.STRATEGIES`).

    Raises:
        ConfigError: unknown strategy name.
        ClusterError: the cluster does not fit the strategy.
    """
    spec = STRATEGIES.get(strategy)
    if not spec.multi_process:
        if info is not None and info.num_training_tasks > 1:
            because = f" ({spec.one_process})" if spec.one_process else ""
            raise ClusterError(
                f"TF_CONFIG describes a {info.num_training_tasks}-task cluster ({_describe(info)}) but strategy "
                f"{strategy!r} runs in one process{because}; use multi_worker_mirrored or "
                "parameter_server, or unset TF_CONFIG"
            )
        return
    if info is None:
        if spec.needs_servers:
            raise ClusterError(
                f"strategy {strategy!r} needs TF_CONFIG with a chief, workers and ps tasks; "
                "set TF_CONFIG or start the job with "
                "`python -m tfopt.launch --chief --workers 2 --ps 1 -- ...`"
            )
        return  # a single worker, as TensorFlow runs it
    for role in spec.forbidden_roles:
        if role in info.cluster:
            users = [s for s in STRATEGIES.names() if role in STRATEGIES.get(s).required_roles]
            raise ClusterError(
                f"TF_CONFIG has {role} tasks ({_describe(info)}) but strategy {strategy!r} uses none; "
                f"remove the {role} role or use strategy {' or '.join(users) or 'another one'}"
            )
    if info.is_evaluator:
        return  # evaluates beside the training: the training roles need not be listed
    if not spec.required_roles and "worker" not in info.cluster and "chief" not in info.cluster:
        raise ClusterError(
            f"TF_CONFIG cluster ({_describe(info)}) has no worker or chief for strategy "
            f'{strategy!r}; add a "worker" list'
        )
    missing = [f"a {role}" for role in spec.required_roles if role not in info.cluster]
    if missing:
        raise ClusterError(
            f"TF_CONFIG cluster ({_describe(info)}) lacks {' and '.join(missing)} for strategy {strategy!r}; "
            "it needs one chief, >= 1 worker and >= 1 ps"
        )


def exposure_warning(cluster: ClusterInfo | None, environ: dict | None = None) -> str | None:
    """The start-up warning of a multi-process job whose servers the network can reach, or None.

    TensorFlow's gRPC servers (and the tf.data service's) listen on every network interface,
    whatever host TF_CONFIG names, and authenticate nobody (TensorFlow's SECURITY.md): a local
    cluster on 127.0.0.1 is reachable from the machine's other addresses too. Nothing to say
    inside ``tfopt.launch``'s private network namespace.
    """
    environ = os.environ if environ is None else environ
    if cluster is None or environ.get(ISOLATED_ENV):
        return None
    ports = sorted(
        {a.rpartition(":")[2] for addresses in cluster.cluster.values() for a in addresses}, key=int
    )
    local = all(
        a.rpartition(":")[0] in LOOPBACK
        for addresses in cluster.cluster.values()
        for a in addresses
    )
    fix = (
        "python -m tfopt.launch runs a local cluster in a private network namespace where the kernel allows "
        "it (--isolate says why it cannot)"
        if local
        else "run it on a private network (python -m tfopt.launch --render kubeflow adds a NetworkPolicy)"
    )
    return (
        f"TensorFlow's servers of this job listen on port(s) {', '.join(ports)} of every network "
        f"interface{' (not only 127.0.0.1)' if local else ''}, without authentication; {fix}"
    )
