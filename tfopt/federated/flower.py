"""Flower's processes for one run: a SuperLink and one SuperNode per client on the loopback,
the run submitted with ``flwr run``, and all of them stopped at the end.

Every process is a child of this one that dies with it (:func:`tfopt.core.children.die_with_parent`)
in a session of its own (stopping one stops the ClientApp processes its SuperNode started), with
its output in ``logs/``; a watchdog (:mod:`tfopt.federated.watchdog`) stops what is not this
process's child (the ServerApp the SuperLink starts) if this process dies. Flower's state (its
``config.toml``, the app it unpacks) lives in a ``FLWR_HOME`` of the run's own, so runs side by
side do not meet. The SuperLink listens on
127.0.0.1 only, without TLS: the clients are processes of this machine.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable

from tfopt.core.children import die_with_parent
from tfopt.core.errors import ConfigError, TfoptError
from tfopt.federated.watchdog import stop_leftovers

log = logging.getLogger(__name__)

#: The Flower app tfopt submits: its ServerApp and ClientApp (tfopt.federated.app).
PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "tfopt-federated"
version = "1.0.0"
description = "tfopt's federated training (the components are tfopt's own)"
dependencies = []

[tool.flwr.app]
publisher = "tfopt"

[tool.flwr.app.components]
serverapp = "tfopt.federated.app:server"
clientapp = "tfopt.federated.app:client"

[tool.flwr.app.config]
spec = {spec}
"""
#: The connection name ``flwr`` is given for this run's SuperLink.
CONNECTION = "tfopt"


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def require_flower() -> str:
    """The directory of Flower's commands (``flower-superlink``, ``flower-supernode``, ``flwr``).

    Raises:
        ConfigError: Flower is not installed beside this Python (the line says how to add it).
    """
    import importlib.util
    import shutil

    beside = os.path.dirname(sys.executable)
    found = shutil.which("flower-superlink", path=beside) or shutil.which("flower-superlink")
    if importlib.util.find_spec("flwr") is None or found is None:
        raise ConfigError(
            "tfopt federated runs on Flower, which is not installed here: pip install "
            "'tfopt[federated]' (flwr 1.42)"
        )
    return os.path.dirname(found)


class Flower:
    """The SuperLink and ``clients`` SuperNodes of one run, under ``home``.

    Args:
        home: A directory of the run's own: ``FLWR_HOME``, ``app/`` and ``logs/`` go there.
        clients: SuperNodes to start; node ``i`` gets ``partition-id=i``.
        superlink: The address of a SuperLink started elsewhere (nothing is started here).
        simulation: Flower's simulation engine instead: the SuperLink runs the ClientApps of
            ``clients`` virtual SuperNodes itself (Ray actors, one CPU each, as many at once as
            there are cores) and no SuperNode process is started.
    """

    def __init__(self, home: str, clients: int, superlink: str = "", simulation: bool = False):
        self.home, self.clients, self.external = home, clients, superlink
        self.simulation = simulation
        if simulation:
            import importlib.util

            if importlib.util.find_spec("ray") is None:
                raise ConfigError(
                    "--engine simulation runs on Flower's simulation engine (Ray), which is not "
                    "installed here: pip install 'tfopt[federated]' (flwr[simulation] 1.42)"
                )
        self.logs = os.path.join(home, "logs")
        os.makedirs(self.logs, exist_ok=True)
        bin_dir = require_flower()
        self.env = {
            **os.environ,
            "FLWR_HOME": os.path.join(home, "flwr"),
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            # Flower starts its helpers by name (flower-superexec, flwr-serverapp, flwr-clientapp)
            "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
            "PYTHONUNBUFFERED": "1",
        }
        self.bin = bin_dir
        self.port, *self.node_ports = _free_ports(1 if simulation else clients + 1)
        self.superlink: subprocess.Popen | None = None
        self.nodes: list[subprocess.Popen] = []
        self.watchdog: subprocess.Popen | None = None

    def _start(self, name: str, args: list[str]) -> subprocess.Popen:
        out = open(os.path.join(self.logs, f"{name}.log"), "ab")
        try:
            return subprocess.Popen(
                [os.path.join(self.bin, args[0]), *args[1:]],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=die_with_parent(signal.SIGKILL),
            )
        finally:
            out.close()

    @property
    def address(self) -> str:
        """The SuperLink's ``HOST:PORT``."""
        return self.external or f"127.0.0.1:{self.port}"

    def start(self) -> None:
        """Starts the SuperLink and the SuperNodes (``partition-id=i num-partitions=N``), or
        with ``superlink`` given only points ``flwr`` at it."""
        os.makedirs(self.env["FLWR_HOME"], exist_ok=True)
        with open(os.path.join(self.env["FLWR_HOME"], "config.toml"), "w") as f:
            f.write(
                f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
                f'address = "{self.address}"\ninsecure = true\n'
            )
        if self.external:
            return
        stop_leftovers(self.env["FLWR_HOME"])
        # Stops what outlives this process (its ServerApp) if it dies before stop().
        self.watchdog = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tfopt.federated.watchdog",
                str(os.getpid()),
                self.env["FLWR_HOME"],
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.superlink = self._start(
            "superlink",
            [
                "flower-superlink",
                "--insecure",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--disable-runtime-dependency-installation",
                *(["--simulation"] if self.simulation else []),
            ],
        )
        for i, port in enumerate(self.node_ports):
            self.nodes.append(
                self._start(
                    f"client-{i}",
                    [
                        "flower-supernode",
                        "--insecure",
                        "--superlink",
                        f"127.0.0.1:{self.port}",
                        "--port",
                        str(port),
                        "--node-config",
                        f"partition-id={i} num-partitions={self.clients}",
                    ],
                )
            )
        self._write_pids()

    def _write_pids(self) -> None:
        """``pids.json``: the process ids of the SuperLink and of each client's SuperNode (what
        an operator, or a test, stops one of them by)."""
        pids = {"superlink": self.superlink.pid, "clients": [p.pid for p in self.nodes]}
        # (none with an external SuperLink: this process started nothing)
        with open(os.path.join(self.home, "pids.json"), "w") as f:
            json.dump(pids, f)

    def _flwr(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            [os.path.join(self.bin, "flwr"), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def wait_online(self, timeout: float = 120) -> float:
        """Waits until every SuperNode is online at the SuperLink (under the simulation engine:
        until the SuperLink answers, its nodes are virtual); returns the seconds it took.

        Raises:
            TfoptError: a process exited, or the nodes are not online in ``timeout`` seconds.
        """
        started = time.monotonic()
        last = ""
        while time.monotonic() - started < timeout:
            for name, proc in (("superlink", self.superlink), *zip(self._names(), self.nodes)):
                if proc is not None and proc.poll() is not None:
                    raise TfoptError(
                        f"Flower's {name} exited with code {proc.returncode} while starting: "
                        f"see {os.path.join(self.logs, name + '.log')}"
                    )
            done = self._flwr(
                *(() if self.simulation else ("supernode",)), "ls", CONNECTION, "--format", "json"
            )
            if done.returncode == 0 and (self.simulation or self._online(done.stdout)):
                return time.monotonic() - started
            last = (done.stdout + done.stderr).strip()[-300:]
            time.sleep(0.5)
        where = f"at {self.external}" if self.external else f"(see the logs in {self.logs})"
        what = (
            "the simulation SuperLink was not answering"
            if self.simulation
            else f"{self.clients} Flower SuperNodes were not online"
        )
        raise TfoptError(f"{what} after {timeout:.0f} s {where}: {last or 'no answer'}")

    def _online(self, listing: str) -> bool:
        """Whether ``flwr supernode ls``'s JSON shows every client online."""
        try:
            nodes = json.loads(listing).get("nodes", [])
        except ValueError:
            return False
        return sum(n.get("status") == "online" for n in nodes) >= self.clients

    def _names(self) -> list[str]:
        return [f"client-{i}" for i in range(len(self.nodes))]

    def run(self, spec: str, watch: Callable[[], None] = lambda: None) -> int:
        """Submits tfopt's app for the run described by ``spec`` (a ``spec.json`` path) and
        waits for it, calling ``watch`` about once a second; returns ``flwr run``'s exit code
        (which is 0 even when the ServerApp failed: the caller checks its result)."""
        app = os.path.join(self.home, "app")
        os.makedirs(app, exist_ok=True)
        with open(os.path.join(app, "pyproject.toml"), "w") as f:
            f.write(PYPROJECT.format(spec=json.dumps(os.path.abspath(spec))))
        out = open(os.path.join(self.logs, "server.log"), "ab")
        try:
            proc = subprocess.Popen(
                [os.path.join(self.bin, "flwr"), "run", app, CONNECTION, "--stream", *self._sim()],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent(signal.SIGKILL),
            )
        finally:
            out.close()
        while proc.poll() is None:
            watch()
            time.sleep(1.0)
        watch()
        return proc.returncode

    def _sim(self) -> list[str]:
        """``flwr run``'s simulation settings: the virtual SuperNodes and one CPU per ClientApp."""
        if not self.simulation:
            return []
        return [
            "--federation-config",
            f"num-supernodes={self.clients} client-resources-num-cpus=1",
        ]

    def stop(self) -> None:
        """Stops every process (SIGTERM, then SIGKILL after 10 s) with what it started, and the
        watchdog."""
        procs = [p for p in (*self.nodes, self.superlink) if p is not None]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in procs:
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, sig)
                    except ProcessLookupError:
                        pass
            deadline = time.monotonic() + 10
            while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                time.sleep(0.1)
        if self.watchdog is not None:  # everything stopped: nothing left to watch for
            self.watchdog.kill()
            self.watchdog.wait()
