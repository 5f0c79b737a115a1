"""Starting, watching, restarting and stopping a local cluster's tasks (the job semantics of
:mod:`tfopt.launch`)."""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import IO

from tfopt.config import DATA_SERVICE_ENV
from tfopt.core.children import ISOLATED_ENV, die_with_parent
from tfopt.core.errors import ConfigError
from tfopt.launch import hosts as hosts_lib
from tfopt.launch.cluster import data_service_tasks, make_cluster

TIMEOUT_EXIT = 124
INTERRUPT_EXIT = 130
PREEMPTED_EXIT = 143
RETRYABLE_FROM = 128  # exit codes from here on: signals, preemption (143), a lost peer (138)
NOT_UP_EXIT = 1  # a tf.data service task never came up: final, like bad input
DATA_ROLES = ("dispatcher", "data-worker")  # tf.data service tasks (python -m tfopt.data.serve)
DATA_READY_TIMEOUT = 60.0  # seconds a tf.data service task has to accept connections
DATA_RESTARTS = 5  # times one tf.data service task is started again within one attempt
_POLL = 0.05


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
        say(f"interrupted again; killing {sum(t.proc.poll() is None for t in alive)} task(s) now")
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


def say(message: str) -> None:
    print(f"tfopt launch: {message}", file=sys.stderr, flush=True)


def check(
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
        hosts: Run the tasks on these simulated hosts (:mod:`tfopt.launch.hosts`), round-robin in
            the order chief, workers, ps, evaluator; the tf.data service on the first. TF_CONFIG
            names each task by its host's address; ``host`` is then unused.

    Returns:
        The job's exit code: 0 on success, the failing task's code (128 + N when killed by
        signal N), 124 on timeout, 130 on Ctrl-C, 143 when the launcher got SIGTERM, 1 when a
        tf.data service task did not come up.

    Raises:
        ConfigError: an empty command or impossible task counts.
    """
    check(command, workers, ps, chief, timeout, host, max_restarts, data_workers)
    base = _task_env(env, hosts is not None)
    deadline = None if timeout is None else time.monotonic() + timeout
    terminated = threading.Event()
    previous = _on_sigterm(terminated)
    run = functools.partial(
        _run_once,
        command,
        base=base,
        out=out or sys.stdout,
        grace=grace,
        deadline=deadline,
        timeout=timeout,
        terminated=terminated,
    )
    try:
        for attempt in range(max_restarts + 1):
            cluster = make_cluster(workers, ps=ps, chief=chief, host=host, evaluator=evaluator)
            taken = [a for addresses in cluster.values() for a in addresses]
            cluster, prefixes = _placed(cluster, hosts)  # on the simulated hosts, if any
            with tempfile.TemporaryDirectory(prefix="tfopt-dispatcher-") as work_dir:
                first = hosts_lib.address(0) if hosts else host  # where the service runs
                service = (
                    data_service_tasks(data_workers, first, taken, work_dir, bind=host)
                    if data_workers
                    else {}
                )
                code, failed = run(cluster, service, prefixes=prefixes, service_host=first)
            if _ends(code, failed, attempt, max_restarts, terminated):
                return code
        return code  # pragma: no cover - the loop always returns
    finally:
        for sig, handler in (previous or {}).items():
            signal.signal(sig, handler)


def _task_env(env: Mapping[str, str] | None, isolated: bool) -> dict[str, str]:
    """The tasks' base environment: ``env`` (or this process's), unbuffered output, and on
    simulated hosts the mark that their only interfaces are their loopback and the link."""
    base = dict(os.environ if env is None else env)
    base.setdefault("PYTHONUNBUFFERED", "1")
    if isolated:
        base[ISOLATED_ENV] = "1"
    return base


def _ends(code: int, failed: str, attempt: int, max_restarts: int, terminated) -> bool:
    """True when the exit code ``code`` of attempt ``attempt`` ends the launch; otherwise says
    that every task starts again."""
    if (
        code == 0
        or code < RETRYABLE_FROM
        or code in (TIMEOUT_EXIT, INTERRUPT_EXIT)
        or terminated.is_set()
    ):
        return True
    if attempt == max_restarts:
        if max_restarts:
            say(
                f"{failed} exited with code {code}; no restart left (--max-restarts={max_restarts})"
            )
        return True
    say(
        f"{failed} exited with code {code} ({_meaning(code)}); restart {attempt + 1}/{max_restarts}: "
        "every task starts again and resumes from the last backup"
    )
    return False


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
        say(f"interrupted; stopping {len(tasks)} task(s)")
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
    say(
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
        say(
            f"{task.name} (tf.data service) exited with code {code} after {task.restarts} "
            "restart(s); stopping the job: see its log above"
        )
        return False
    task.restarts += 1
    say(
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
            say(
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
                say(
                    f"{t.name} exited with code {_exit_code(code)}; stopping the other {len(others)} task(s)"
                )
                _stop(tasks, grace)
                return _exit_code(code), t.name
            if t.name not in tolerated:
                tolerated.add(t.name)
                say(f"{t.name} exited with code {_exit_code(code)}; the job goes on without it")
        if all(t.proc.poll() is not None for t in primary):
            _stop(tasks, grace)  # the servers that never exit by themselves, and the evaluator
            return 0, "job"
        if deadline is not None and time.monotonic() > deadline:
            running = [t.name for t in tasks if t.proc.poll() is None]
            say(
                f"job did not finish within --timeout={timeout:g}s; stopped {', '.join(running)}; "
                "raise --timeout or check the tasks' logs above"
            )
            _stop(tasks, grace)
            return TIMEOUT_EXIT, "launcher"
        time.sleep(_POLL)
