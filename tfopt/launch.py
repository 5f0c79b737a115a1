"""Local multi-process launcher: run one command as every task of a TF_CONFIG cluster.

Like ``accelerate launch`` or ``torchrun``, but for tf.distribute: each task gets its own
``TF_CONFIG`` on free loopback ports, and its output lines are prefixed with ``[worker:0]`` etc.

    python -m tfopt.launch --workers 2 -- python -m tfopt.train --set runtime.strategy=multi_worker_mirrored
    python -m tfopt.launch --chief --workers 2 --ps 1 -- python -m tfopt.train --set runtime.strategy=parameter_server

Job semantics:

* A ``chief`` or ``worker`` task that exits non-zero fails the job: the other tasks are
  stopped. Under ParameterServerStrategy (ps tasks) a ``worker`` may die without failing the job
  (the ClusterCoordinator carries on with the others); a ``ps`` task that dies fails it.
* Without ps tasks the job succeeds when every training task has exited 0; with ps tasks when
  the chief has. The servers that never exit by themselves (worker, ps, evaluator) are then
  stopped.
* ``--max-restarts K``: a job that failed with a retryable code (128 or more: killed by a signal,
  143 preempted, 138 lost a peer) is started again, all tasks on fresh ports, up to K times; the
  stages resume from their last backup. TensorFlow restarts jobs, it does not replace a task in
  place (the elastic-agent model). Codes 1-127 (bad input, a crash) are final, as under
  Kubernetes' ``ExitCode`` restart policy.
* SIGTERM (or SIGHUP, the terminal closing) to the launcher is passed on to every task as SIGTERM
  (each writes a backup at its next step and exits 143); the launcher then exits 143. A launcher
  killed outright takes its tasks along: each gets SIGTERM from the kernel when it dies
  (:func:`tfopt.children.die_with_parent`).
* ``--timeout S`` stops everything after S seconds and returns 124.
* A local cluster (``--host`` on the loopback, the default) runs in a private network namespace
  whose only interface is its own loopback (``unshare -n`` as root, ``unshare -rn`` for other
  users): TensorFlow servers listen on every interface, unauthenticated, whatever TF_CONFIG
  names, and this keeps them off the network. Where the kernel refuses a namespace the job runs
  as it is and its chief warns once. ``--isolate`` makes the namespace a requirement (an error
  where it cannot be made); ``--no-isolate`` leaves the servers on the host's network.
* ``--data-workers N`` starts a tf.data service beside the cluster: a dispatcher and N workers
  (``python -m tfopt.data.serve``) on free ports of ``--host``, up before the trainers, which
  read their training input through it (``$TFOPT_DATA_SERVICE``, ``data.service=launched``).
  A service task that exits is started again on its port (a dispatcher from its journal, losing
  nothing; a worker losing at most the rest of its split under ``distributed_epoch``), up to 5
  times; one that does not accept connections within 60 s stops the job with code 1.
* ``--hosts N --link RATE[,DELAY]`` runs the tasks on N simulated hosts (:mod:`tfopt.hosts`):
  network namespaces with addresses of their own, joined by a ``tc``-shaped link, so TF_CONFIG
  names N machines; tasks are placed round-robin. Where namespaces cannot be made the job runs
  on the loopback, said in one line.
* ``--render kubeflow`` prints a Kubeflow ``TFJob`` for the same cluster and command instead of
  running it (see :mod:`tfopt.kube` and docs/kubernetes.md).

Tasks are stopped with SIGTERM, then SIGKILL after ``--grace`` seconds, or at once on a second Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import IO

from tfopt import hosts as hosts_lib
from tfopt import kube
from tfopt.children import ISOLATED_ENV, LOOPBACK, die_with_parent
from tfopt.config import DATA_SERVICE_ENV
from tfopt.errors import ConfigError

TIMEOUT_EXIT = 124
INTERRUPT_EXIT = 130
PREEMPTED_EXIT = 143
RETRYABLE_FROM = 128  # exit codes from here on: signals, preemption (143), a lost peer (138)
NOT_UP_EXIT = 1  # a tf.data service task never came up: final, like bad input
DATA_ROLES = ("dispatcher", "data-worker")  # tf.data service tasks (python -m tfopt.data.serve)
DATA_READY_TIMEOUT = 60.0  # seconds a tf.data service task has to accept connections
DATA_RESTARTS = 5  # times one tf.data service task is started again within one attempt
SERVE = [sys.executable, "-m", "tfopt.data.serve"]  # runs a dispatcher or a worker
_POLL = 0.05


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


class _Task:
    """One child process and the thread that copies its output with a prefix."""

    def __init__(
        self,
        role: str,
        index: int,
        command: list[str],
        env: dict[str, str],
        out: IO[str],
        lock: threading.Lock,
    ):
        self.role, self.index = role, index
        self.name = f"{role}:{index}"
        self.host, self.port = "", 0  # a data-service task's address: it is up once that accepts
        self.probe: list[str] = []  # the prefix that enters its network namespace, if any
        self.restarts = 0
        self._args = (command, env, out, lock)
        self.start()

    def start(self) -> None:
        """Starts (or starts again) the process, with the same command and environment."""
        command, env, out, lock = self._args
        self.proc = subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )
        self._thread = threading.Thread(target=self._pump, args=(out, lock), daemon=True)
        self._thread.start()

    def _pump(self, out: IO[str], lock: threading.Lock) -> None:
        prefix = f"[{self.name}] "
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            with lock:
                out.write(prefix + line + "\n")
                out.flush()

    def signal(self, sig: int) -> None:
        # Each task leads its own process group, so helpers it spawned are signalled too.
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def join_output(self, timeout: float = 2.0) -> None:
        self._thread.join(timeout)


def _exit_code(returncode: int) -> int:
    """Maps a Popen return code to a shell-style exit code (killed by signal N -> 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def _stop(tasks: list[_Task], grace: float) -> None:
    """SIGTERM, ``grace`` seconds, then SIGKILL; a second Ctrl-C during the grace period kills at once."""
    alive = [t for t in tasks if t.proc.poll() is None]
    for t in alive:
        t.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    try:
        while any(t.proc.poll() is None for t in alive) and time.monotonic() < deadline:
            time.sleep(_POLL)
    except KeyboardInterrupt:
        _say(f"interrupted again; killing {sum(t.proc.poll() is None for t in alive)} task(s) now")
    try:
        previous = signal.signal(
            signal.SIGINT, signal.SIG_IGN
        )  # nothing may interrupt the last waits
    except ValueError:  # not the main thread: no Ctrl-C arrives here
        previous = None
    try:
        for t in alive:
            if t.proc.poll() is None:
                t.signal(signal.SIGKILL)
        for t in tasks:
            t.proc.wait()
            t.join_output()
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _say(message: str) -> None:
    print(f"tfopt launch: {message}", file=sys.stderr, flush=True)


def _check(
    command: list[str],
    workers: int,
    ps: int,
    chief: bool,
    timeout: float | None,
    host: str,
    max_restarts: int,
    data_workers: int = 0,
) -> None:
    """Raises ConfigError on arguments no job can start with, before anything starts."""
    if data_workers < 0:
        raise ConfigError(
            f"--data-workers={data_workers} must be >= 0; 0 starts no tf.data service"
        )
    if not command:
        raise ConfigError(
            "no command to launch; put it after `--`, e.g. "
            "`python -m tfopt.launch --workers 2 -- python -m tfopt.train`"
        )
    if timeout is not None and timeout <= 0:
        raise ConfigError(f"--timeout={timeout} must be > 0 seconds; omit it to wait forever")
    if max_restarts < 0:
        raise ConfigError(f"--max-restarts={max_restarts} must be >= 0; 0 never restarts")
    make_cluster(
        workers, ps=ps, chief=chief, host=host
    )  # check the counts before starting anything


def launch(
    command: list[str],
    workers: int,
    ps: int = 0,
    chief: bool = False,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    host: str = "127.0.0.1",
    grace: float = 10.0,
    out: IO[str] | None = None,
    max_restarts: int = 0,
    evaluator: bool = False,
    data_workers: int = 0,
    hosts: hosts_lib.SimulatedHosts | None = None,
) -> int:
    """Runs ``command`` once per cluster task, each with its own TF_CONFIG, and waits for the job.

    Args:
        command: The program and its arguments, e.g. ``["python", "-m", "tfopt.train"]``.
        workers: Number of ``worker`` tasks.
        ps: Number of ``ps`` tasks (ParameterServerStrategy; needs ``chief``).
        chief: Add one ``chief`` task.
        timeout: Seconds before every task is stopped and 124 returned; None waits forever.
        env: Base environment of the tasks (default: this process's). ``TF_CONFIG`` is set
            per task and ``PYTHONUNBUFFERED=1`` so output lines arrive promptly.
        host: Address the tasks listen on.
        grace: Seconds between SIGTERM and SIGKILL when stopping tasks.
        out: Where prefixed output lines go (default ``sys.stdout``).
        max_restarts: Start a job that failed with a retryable code (>= 128) again, this many times.
        evaluator: Add an ``evaluator`` task (it evaluates the chief's backups while training runs).
        data_workers: Start a tf.data service beside the cluster: a dispatcher and this many
            workers (``python -m tfopt.data.serve``), up before the trainers, which get its
            address in ``$TFOPT_DATA_SERVICE`` (``data.service=launched``). A service task
            that exits is started again on its port; one that does not come up stops the job.
        hosts: Run the tasks on these simulated hosts (:mod:`tfopt.hosts`), round-robin in
            the order chief, workers, ps, evaluator; the tf.data service on the first. TF_CONFIG
            names each task by its host's address; ``host`` is then unused.

    Returns:
        The job's exit code: 0 on success, the failing task's code (128 + N when killed by
        signal N), 124 on timeout, 130 on Ctrl-C, 143 when the launcher got SIGTERM, 1 when a
        tf.data service task did not come up.

    Raises:
        ConfigError: an empty command or impossible task counts.
    """
    _check(command, workers, ps, chief, timeout, host, max_restarts, data_workers)
    base = dict(os.environ if env is None else env)
    base.setdefault("PYTHONUNBUFFERED", "1")
    if hosts is not None:  # the simulated hosts' only interfaces are their loopback and the link
        base[ISOLATED_ENV] = "1"
    out = out or sys.stdout
    deadline = None if timeout is None else time.monotonic() + timeout
    terminated = threading.Event()
    previous = _on_sigterm(terminated)
    try:
        for attempt in range(max_restarts + 1):
            cluster = make_cluster(workers, ps=ps, chief=chief, host=host, evaluator=evaluator)
            taken = [a for addresses in cluster.values() for a in addresses]
            cluster, prefixes = _placed(cluster, hosts)
            with tempfile.TemporaryDirectory(prefix="tfopt-dispatcher-") as work_dir:
                first = hosts_lib.address(0) if hosts else host  # where the service runs
                service = (
                    data_service_tasks(data_workers, first, taken, work_dir, bind=host)
                    if data_workers
                    else {}
                )
                code, failed = _run_once(
                    command,
                    cluster,
                    service,
                    base,
                    out,
                    grace,
                    deadline,
                    timeout,
                    terminated,
                    prefixes,
                    first,
                )
            if (
                code == 0
                or code < RETRYABLE_FROM
                or code in (TIMEOUT_EXIT, INTERRUPT_EXIT)
                or terminated.is_set()
            ):
                return code
            if attempt == max_restarts:
                if max_restarts:
                    _say(
                        f"{failed} exited with code {code}; no restart left (--max-restarts={max_restarts})"
                    )
                return code
            _say(
                f"{failed} exited with code {code} ({_meaning(code)}); restart {attempt + 1}/{max_restarts}: "
                "every task starts again and resumes from the last backup"
            )
        return code  # pragma: no cover - the loop always returns
    finally:
        for sig, handler in (previous or {}).items():
            signal.signal(sig, handler)


def _meaning(code: int) -> str:
    if code == PREEMPTED_EXIT:
        return "preempted: it wrote a backup"
    if code == 138:
        return "it lost a peer task"
    if code > 128:
        try:
            return f"killed by {signal.Signals(code - 128).name}"
        except ValueError:
            pass
    return "retryable"


def _on_sigterm(event: threading.Event):
    """Makes SIGTERM and SIGHUP (the terminal closed) set ``event``: the wait loop passes it on to the tasks."""
    try:
        return {
            sig: signal.signal(sig, lambda signum, frame: event.set())
            for sig in (signal.SIGTERM, signal.SIGHUP)
        }
    except ValueError:  # not the main thread
        return None


def _placed(
    cluster: dict[str, list[str]], hosts: hosts_lib.SimulatedHosts | None
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """The cluster with its tasks on the simulated hosts, round-robin, and each task's command prefix.

    Without hosts: the cluster as it is, no prefix. The service's tasks ("dispatcher:0", ...)
    run on the first host.
    """
    if hosts is None:
        return cluster, {}
    placed: dict[str, list[str]] = {}
    prefixes = {role: hosts.prefix(0) for role in DATA_ROLES}
    number = 0
    for role, addresses in cluster.items():
        placed[role] = []
        for index, address in enumerate(addresses):
            on = number % len(hosts.names)
            placed[role].append(f"{hosts_lib.address(on)}:{address.rpartition(':')[2]}")
            prefixes[f"{role}:{index}"] = hosts.prefix(on)
            number += 1
    return placed, prefixes


def _run_once(
    command,
    cluster,
    service,
    base,
    out,
    grace,
    deadline,
    timeout,
    terminated,
    prefixes=None,
    service_host="",
) -> tuple[int, str]:
    lock = threading.Lock()
    tasks: list[_Task] = []
    prefixes = prefixes or {}
    try:
        for role, entries in service.items():  # the tf.data service is up before the trainers
            for index, (serve, port) in enumerate(entries):
                task = _Task(role, index, [*prefixes.get(role, []), *serve], base, out, lock)
                task.host, task.port = service_host, port
                task.probe = prefixes.get(role, [])
                tasks.append(task)
                if not _came_up(task):
                    _stop(tasks, grace)
                    return NOT_UP_EXIT, task.name
        if service:
            target = f"grpc://{service_host}:{tasks[0].port}"
            base = dict(base, **{DATA_SERVICE_ENV: target})
        for role, addresses in cluster.items():
            for index in range(len(addresses)):
                tf_config = {"cluster": cluster, "task": {"type": role, "index": index}}
                task_env = dict(base, TF_CONFIG=json.dumps(tf_config))
                run = [*prefixes.get(f"{role}:{index}", []), *command]
                try:
                    tasks.append(_Task(role, index, run, task_env, out, lock))
                except OSError as e:
                    _stop(tasks, grace)
                    raise ConfigError(
                        f"cannot start command {command[0]!r} ({e.strerror or e}); "
                        "check the program name after `--`"
                    ) from None
        return _wait(tasks, "ps" in cluster, deadline, timeout, grace, terminated)
    except KeyboardInterrupt:
        _say(f"interrupted; stopping {len(tasks)} task(s)")
        _stop(tasks, grace)
        return INTERRUPT_EXIT, "launcher"


def _accepts(host: str, port: int, probe: list[str]) -> bool:
    """Whether ``host:port`` accepts a TCP connection, dialled from the namespace ``probe`` enters."""
    if not probe:
        try:
            socket.create_connection((host, port), timeout=1.0).close()
            return True
        except OSError:
            return False
    dial = (
        "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 1).close()"
    )
    return (
        subprocess.run(
            [*probe, sys.executable, "-c", dial, host, str(port)], capture_output=True
        ).returncode
        == 0
    )


def _came_up(task: _Task) -> bool:
    """Waits until a tf.data service task accepts connections on its port; False (said) if it never does."""
    timeout = DATA_READY_TIMEOUT
    deadline = time.monotonic() + timeout
    while task.proc.poll() is None and time.monotonic() < deadline:
        if _accepts(task.host, task.port, task.probe):
            return True
        time.sleep(0.2)
    code = task.proc.poll()
    why = (
        f"exited with code {_exit_code(code)}"
        if code is not None
        else f"did not accept connections on port {task.port} within {timeout:g} s"
    )
    _say(
        f"{task.name} (tf.data service) {why} before it came up; stopping the job: see its "
        "log above (python -m tfopt.data.serve) and check that TensorFlow imports there"
    )
    return False


def _lost(task: _Task) -> str:
    """What the trainers lose when a tf.data service task dies and starts again."""
    if task.role == "dispatcher":
        return "it reloads its jobs from its journal; the trainers wait for it and lose no element"
    return (
        "under distributed_epoch the rest of the split it was producing (at most one pass of "
        "the data) is skipped: the service visits each element at most once; under "
        "parallel_epochs its stream starts again from the first pass"
    )


def _restart_data_task(task: _Task) -> bool:
    """Starts a tf.data service task that exited again on its port; False (said) if it cannot."""
    code = _exit_code(task.proc.returncode)
    if task.restarts >= DATA_RESTARTS:
        _say(
            f"{task.name} (tf.data service) exited with code {code} after {task.restarts} "
            "restart(s); stopping the job: see its log above"
        )
        return False
    task.restarts += 1
    _say(
        f"{task.name} (tf.data service) exited with code {code}; starting it again on port "
        f"{task.port} ({task.restarts}/{DATA_RESTARTS}): {_lost(task)}"
    )
    task.join_output()
    task.start()
    return _came_up(task)


def _wait(
    tasks: list[_Task],
    parameter_servers: bool,
    deadline: float | None,
    timeout: float | None,
    grace: float,
    terminated: threading.Event,
) -> tuple[int, str]:
    """Waits for the job; returns (exit code, name of the task that decided it).

    A tf.data service task that exits is started again on its port.
    """
    training = [t for t in tasks if t.role in ("chief", "worker")]
    primary = [t for t in tasks if t.role == "chief"] if parameter_servers else training
    primary += [
        t for t in tasks if t.role == "evaluator"
    ]  # it stops by itself after the last backup
    # Under ParameterServerStrategy a worker may die: the coordinator goes on without it.
    fatal = [
        t
        for t in tasks
        if t.role in (("chief", "ps") if parameter_servers else ("chief", "worker"))
    ]
    tolerated: set[str] = set()
    while True:
        if terminated.is_set():
            _say(
                f"got SIGTERM or SIGHUP; passing SIGTERM on to {len(tasks)} task(s) (each writes a backup and exits)"
            )
            _stop(tasks, grace)
            return PREEMPTED_EXIT, "launcher"
        for t in tasks:
            code = t.proc.poll()
            if code is not None and t.role in DATA_ROLES:
                if not _restart_data_task(t):
                    _stop(tasks, grace)
                    return NOT_UP_EXIT, t.name
                continue
            if code in (None, 0):
                continue
            if t in fatal:
                others = [o for o in tasks if o is not t and o.proc.poll() is None]
                _say(
                    f"{t.name} exited with code {_exit_code(code)}; stopping the other {len(others)} task(s)"
                )
                _stop(tasks, grace)
                return _exit_code(code), t.name
            if t.name not in tolerated:
                tolerated.add(t.name)
                _say(f"{t.name} exited with code {_exit_code(code)}; the job goes on without it")
        if all(t.proc.poll() is not None for t in primary):
            _stop(tasks, grace)  # the servers that never exit by themselves, and the evaluator
            return 0, "job"
        if deadline is not None and time.monotonic() > deadline:
            running = [t.name for t in tasks if t.proc.poll() is None]
            _say(
                f"job did not finish within --timeout={timeout:g}s; stopped {', '.join(running)}; "
                "raise --timeout or check the tasks' logs above"
            )
            _stop(tasks, grace)
            return TIMEOUT_EXIT, "launcher"
        time.sleep(_POLL)


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


def _isolation(isolate: bool | None, host: str) -> list[str]:
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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``tfopt launch`` (its own flags, before ``--``)."""
    parser = argparse.ArgumentParser(
        prog="tfopt launch",
        description="Run a command as every task of a local tf.distribute cluster (one TF_CONFIG each), "
        "or print it as a Kubeflow TFJob.",
        epilog="example: python -m tfopt.launch --workers 2 --max-restarts 3 -- python -m tfopt.train "
        "--strategy multi_worker_mirrored --backup-every 50",
    )
    parser.add_argument("--workers", type=int, default=2, help="number of worker tasks (default 2)")
    parser.add_argument(
        "--ps", type=int, default=0, help="number of parameter-server tasks (needs --chief)"
    )
    parser.add_argument("--chief", action="store_true", help="add a chief task")
    parser.add_argument(
        "--evaluator",
        action="store_true",
        help="add an evaluator task: it evaluates each new backup while training runs",
    )
    parser.add_argument(
        "--data-workers",
        type=int,
        default=0,
        metavar="N",
        help="start a tf.data service beside the cluster, a dispatcher and N workers; the "
        "trainers read their training input through it (data.service=launched; default 0: none)",
    )
    parser.add_argument(
        "--hosts",
        type=int,
        default=0,
        metavar="N",
        help="run the tasks on N simulated hosts, network namespaces joined by a link (root; "
        "default 0: this host's loopback)",
    )
    parser.add_argument(
        "--link",
        metavar="RATE[,DELAY]",
        help="the simulated hosts' link: rate each way and one-way delay, e.g. 10gbit,0.5ms "
        "(tc; default: the veth's own speed)",
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="K",
        help="restart a job that failed with a retryable code (>= 128) up to K times (default 0)",
    )
    parser.add_argument(
        "--isolate",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the cluster in a private network namespace, off the network (default: when "
        "--host is the loopback and the kernel allows it; --isolate: always, or fail; "
        "--no-isolate: never)",
    )
    parser.add_argument(
        "--timeout", type=float, default=None, help="stop all tasks and exit 124 after S seconds"
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address written into the tasks' TF_CONFIG, the one peers dial (default 127.0.0.1); "
        "TensorFlow's servers listen on every interface whatever it is: on the loopback the "
        "cluster runs in a private network namespace (see --isolate)",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=10.0,
        help="seconds between SIGTERM and SIGKILL (default 10: time to write a backup)",
    )
    kube.add_render_arguments(parser)
    return parser


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" in argv:
        cut = argv.index("--")
        own, command = argv[:cut], argv[cut + 1 :]
    else:
        own, command = argv, []
    return build_parser().parse_args(own), command


# Flags that only a local run reads, and flags that only the rendered Kubernetes job reads.
LOCAL_ONLY = (
    "--max-restarts",
    "--timeout",
    "--hosts",
    "--link",
    "--isolate",
    "--no-isolate",
    "--host",
    "--grace",
)
RENDER_ONLY = (
    "--image",
    "--name",
    "--namespace",
    "--restart-policy",
    "--backoff-limit",
    "--clean-pod-policy",
    "--cpu",
    "--memory",
    "--gpus",
    "--volume-claim",
    "--mount-path",
)


def _refuse_unused(own: list[str], render: bool) -> None:
    """Every launcher flag given applies to what runs: a local job or the rendered TFJob."""
    given = [t.split("=", 1)[0] for t in own if t.startswith("--")]
    unused = [f for f in given if f in (LOCAL_ONLY if render else RENDER_ONLY)]
    if not unused:
        return
    if render:
        raise ConfigError(
            f"{', '.join(unused)} apply to a local run, not to the rendered TFJob (Kubernetes "
            "restarts and stops pods itself: --restart-policy, --backoff-limit); drop "
            f"{'them' if len(unused) > 1 else 'it'}"
        )
    raise ConfigError(
        f"{', '.join(unused)} apply to --render kubeflow only; add --render kubeflow, or drop "
        f"{'them' if len(unused) > 1 else 'it'}"
    )


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: ``python -m tfopt.launch [options] -- COMMAND ...``; returns the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    args, command = _parse(argv)
    try:
        _refuse_unused(argv[: argv.index("--")] if "--" in argv else argv, bool(args.render))
        if args.render:
            sys.stdout.write(kube.render_from_args(args, command))
            return 0
        _check(
            command,
            args.workers,
            args.ps,
            args.chief,
            args.timeout,
            args.host,
            args.max_restarts,
            args.data_workers,
        )
        hosts = _simulated_hosts(args.hosts, args.link)
        if hosts is not None:
            with hosts:
                return _launch_args(command, args, hosts)
        prefix = _isolation(args.isolate, args.host)
        if prefix:
            os.environ[ISOLATED_ENV] = "1"
            os.execvp(prefix[0], [*prefix, sys.executable, "-m", "tfopt.launch", *argv])
        return _launch_args(command, args)
    except ConfigError as e:
        _say(str(e))
        return 2


def _launch_args(command: list[str], args: argparse.Namespace, hosts=None) -> int:
    return launch(
        command,
        args.workers,
        ps=args.ps,
        chief=args.chief,
        timeout=args.timeout,
        host=args.host,
        grace=args.grace,
        max_restarts=args.max_restarts,
        evaluator=args.evaluator,
        data_workers=args.data_workers,
        hosts=hosts,
    )


def _simulated_hosts(count: int, link: str | None) -> hosts_lib.SimulatedHosts | None:
    """The simulated hosts ``--hosts``/``--link`` ask for; None (said in one line) where refused."""
    if not count:
        if link:
            raise ConfigError(
                f"--link={link!r} joins simulated hosts; add --hosts 2, or drop --link"
            )
        return None
    shaped = hosts_lib.parse_link(link) if link else None
    try:
        hosts = hosts_lib.SimulatedHosts(count, shaped)
    except hosts_lib.HostsUnavailable as e:
        _say(f"{e}; running the job on this host's loopback instead")
        return None
    for note in hosts.notes:
        _say(note)
    joined = f"a {shaped} link" if shaped else "the veth's own speed"
    _say(
        f"{count} simulated hosts ({', '.join(hosts_lib.address(i) for i in range(count))}), "
        f"joined at {joined}"
    )
    return hosts


if __name__ == "__main__":
    sys.exit(main())
