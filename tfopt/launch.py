"""Local multi-process launcher: run one command as every task of a TF_CONFIG cluster.

Like ``accelerate launch`` or ``torchrun``, but for tf.distribute: each task gets its own
``TF_CONFIG`` on free loopback ports, and its output lines are prefixed with ``[worker:0]`` etc.

    python -m tfopt.launch --workers 2 -- python -m tfopt.train --set runtime.strategy=multi_worker_mirrored
    python -m tfopt.launch --chief --workers 2 --ps 1 -- python -m tfopt.train --set runtime.strategy=parameter_server

Job semantics:

* Any ``chief`` or ``worker`` task that exits non-zero fails the job: the other tasks are
  stopped and the launcher returns that task's exit code.
* Without ps tasks the job succeeds when every task has exited 0.
* With ps tasks (ParameterServerStrategy) the chief's exit ends the job: the worker and ps
  servers, which never exit by themselves, are then stopped.
* ``--timeout S`` stops everything after S seconds and returns 124.

Tasks are stopped with SIGTERM, then SIGKILL after a short grace period: a
MultiWorkerMirroredStrategy process catches SIGTERM (TensorFlow's preemption notifier) and
does not exit on it. TensorFlow servers listen on all interfaces, unauthenticated, even when
TF_CONFIG names 127.0.0.1: launch on trusted machines only.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Mapping

from tfopt.errors import ConfigError

TIMEOUT_EXIT = 124
INTERRUPT_EXIT = 130
_POLL = 0.05


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """Returns ``n`` distinct TCP ports that are free on ``host`` right now.

    All sockets are held open until every port is chosen, so the ports differ; another
    program may still take one before the task binds it (rare on loopback).
    """
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def make_cluster(workers: int, ps: int = 0, chief: bool = False, host: str = "127.0.0.1") -> dict[str, list[str]]:
    """Builds a TF_CONFIG ``cluster`` dict on free ports of ``host``.

    Args:
        workers: Number of ``worker`` tasks.
        ps: Number of ``ps`` tasks.
        chief: Add one ``chief`` task.
        host: Address every task listens on.

    Returns:
        ``{"chief": [...], "worker": [...], "ps": [...]}`` with empty roles left out.

    Raises:
        ConfigError: negative counts, no task at all, or ps tasks without a chief and a worker.
    """
    if workers < 0 or ps < 0:
        raise ConfigError(f"--workers={workers} / --ps={ps} must be >= 0")
    if workers + int(chief) < 1:
        raise ConfigError(f"--workers={workers} without --chief starts no task; give --workers 1 or more")
    if ps and (not chief or workers < 1):
        raise ConfigError(f"--ps={ps} needs --chief and --workers >= 1 (ParameterServerStrategy: one chief, "
                          "workers and ps tasks); add --chief or drop --ps")
    counts = {"chief": int(chief), "worker": workers, "ps": ps}
    ports = iter(free_ports(sum(counts.values()), host))
    return {role: [f"{host}:{next(ports)}" for _ in range(n)] for role, n in counts.items() if n}


class _Task:
    """One child process and the thread that copies its output with a prefix."""

    def __init__(self, role: str, index: int, command: list[str], env: dict[str, str], out: IO[str],
                 lock: threading.Lock):
        self.role, self.index = role, index
        self.name = f"{role}:{index}"
        self.proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
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
    alive = [t for t in tasks if t.proc.poll() is None]
    for t in alive:
        t.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(t.proc.poll() is None for t in alive) and time.monotonic() < deadline:
        time.sleep(_POLL)
    for t in alive:
        if t.proc.poll() is None:
            t.signal(signal.SIGKILL)
    for t in tasks:
        t.proc.wait()
        t.join_output()


def _say(message: str) -> None:
    print(f"tfopt.launch: {message}", file=sys.stderr, flush=True)


def launch(command: list[str], workers: int, ps: int = 0, chief: bool = False, timeout: float | None = None,
           env: Mapping[str, str] | None = None, host: str = "127.0.0.1", grace: float = 3.0,
           out: IO[str] | None = None) -> int:
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

    Returns:
        The job's exit code: 0 on success, the first failing chief/worker task's code
        (128 + N when killed by signal N), 124 on timeout, 130 on Ctrl-C.

    Raises:
        ConfigError: an empty command or impossible task counts.
    """
    if not command:
        raise ConfigError("no command to launch; put it after `--`, e.g. "
                          "`python -m tfopt.launch --workers 2 -- python -m tfopt.train`")
    if timeout is not None and timeout <= 0:
        raise ConfigError(f"--timeout={timeout} must be > 0 seconds; omit it to wait forever")
    cluster = make_cluster(workers, ps=ps, chief=chief, host=host)
    base = dict(os.environ if env is None else env)
    base.setdefault("PYTHONUNBUFFERED", "1")
    out = out or sys.stdout
    lock = threading.Lock()
    tasks: list[_Task] = []
    start = time.monotonic()
    try:
        for role, addresses in cluster.items():
            for index in range(len(addresses)):
                tf_config = {"cluster": cluster, "task": {"type": role, "index": index}}
                task_env = dict(base, TF_CONFIG=json.dumps(tf_config))
                try:
                    tasks.append(_Task(role, index, command, task_env, out, lock))
                except OSError as e:
                    _stop(tasks, grace)
                    raise ConfigError(f"cannot start command {command[0]!r} ({e.strerror or e}); "
                                      "check the program name after `--`") from None
        return _wait(tasks, ps > 0, timeout, start, grace)
    except KeyboardInterrupt:
        _say(f"interrupted; stopping {len(tasks)} task(s)")
        _stop(tasks, grace)
        return INTERRUPT_EXIT


def _wait(tasks: list[_Task], chief_ends_job: bool, timeout: float | None, start: float, grace: float) -> int:
    primary = [t for t in tasks if (t.role == "chief" if chief_ends_job else t.role in ("chief", "worker"))]
    while True:
        for t in tasks:
            code = t.proc.poll()
            if code not in (None, 0) and t.role in ("chief", "worker"):
                others = [o for o in tasks if o is not t and o.proc.poll() is None]
                _say(f"{t.name} exited with code {_exit_code(code)}; stopping the other {len(others)} task(s)")
                _stop(tasks, grace)
                return _exit_code(code)
        if all(t.proc.poll() is not None for t in primary):
            _stop(tasks, grace)  # under ParameterServerStrategy: the servers that never exit
            return 0
        if timeout is not None and time.monotonic() - start > timeout:
            running = [t.name for t in tasks if t.proc.poll() is None]
            _say(f"job did not finish within --timeout={timeout:g}s; stopped {', '.join(running)}; "
                 "raise --timeout or check the tasks' logs above")
            _stop(tasks, grace)
            return TIMEOUT_EXIT
        time.sleep(_POLL)


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" in argv:
        cut = argv.index("--")
        own, command = argv[:cut], argv[cut + 1:]
    else:
        own, command = argv, []
    parser = argparse.ArgumentParser(
        prog="python -m tfopt.launch",
        description="Run a command as every task of a local tf.distribute cluster (one TF_CONFIG each).",
        epilog="example: python -m tfopt.launch --workers 2 -- python -m tfopt.train")
    parser.add_argument("--workers", type=int, default=2, help="number of worker tasks (default 2)")
    parser.add_argument("--ps", type=int, default=0, help="number of parameter-server tasks (needs --chief)")
    parser.add_argument("--chief", action="store_true", help="add a chief task")
    parser.add_argument("--timeout", type=float, default=None, help="stop all tasks and exit 124 after S seconds")
    parser.add_argument("--host", default="127.0.0.1", help="address the tasks listen on (default 127.0.0.1)")
    parser.add_argument("--grace", type=float, default=3.0, help="seconds between SIGTERM and SIGKILL (default 3)")
    return parser.parse_args(own), command


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: ``python -m tfopt.launch [options] -- COMMAND ...``; returns the exit code."""
    args, command = _parse(sys.argv[1:] if argv is None else argv)
    try:
        return launch(command, args.workers, ps=args.ps, chief=args.chief, timeout=args.timeout,
                      host=args.host, grace=args.grace)
    except ConfigError as e:
        _say(str(e))
        return 2


if __name__ == "__main__":
    sys.exit(main())
