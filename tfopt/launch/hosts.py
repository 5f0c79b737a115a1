"""Simulated machines on one host: network namespaces joined by a shaped link.

``tfopt launch --hosts N --link RATE[,DELAY]`` puts the job's tasks on N simulated hosts: each a
network namespace of its own with one address (``10.253.0.1``, ``10.253.0.2``, ...) on a veth
pair whose other end sits on a bridge in a switch namespace. TF_CONFIG then names N machines and
every byte between tasks on different hosts crosses two veth hops, each shaped by ``tc``: the
host's side limits what it sends, the switch's side what it receives (a full-duplex NIC of RATE
each way). A delay goes half on each side (``netem``), so DELAY is the one-way time between
two hosts. The namespaces have no other interface: the servers in them are off the network.

Needs root (``ip netns``) and the ``ip`` and ``tc`` commands. Where namespaces cannot be made
(:class:`HostsUnavailable`) the launcher runs the job on the loopback and says so in one line; where ``tc`` cannot
shape (no ``tbf``) the hosts are joined at the veth's own speed, and where the kernel lacks
``netem`` the link gets its rate without the delay, each said in one line.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from tfopt.core.errors import ConfigError

SUBNET = "10.253.0"  # host i is SUBNET.(i + 1)/24
_PREFIX = "tfopt-"
_RATE = re.compile(r"(\d+(?:\.\d+)?)(gbit|mbit|kbit|bit)", re.I)
_DELAY = re.compile(r"(\d+(?:\.\d+)?)(ms|us)", re.I)
_UNITS = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3, "bit": 1.0, "ms": 1e-3, "us": 1e-6}


class HostsUnavailable(ConfigError):
    """This machine cannot make the simulated hosts (no root, no ``ip``, a refused namespace)."""


@dataclass(frozen=True)
class Link:
    """A shaped link: bits per second each way, and the one-way delay in seconds."""

    rate_bits: float
    delay_s: float = 0.0

    def __str__(self) -> str:
        rate = (
            f"{self.rate_bits / 1e9:g}gbit"
            if self.rate_bits >= 1e9
            else f"{self.rate_bits / 1e6:g}mbit"
        )
        return f"{rate},{self.delay_s * 1e3:g}ms" if self.delay_s else rate


def parse_link(text: str) -> Link:
    """Parses ``--link``: ``RATE`` or ``RATE,DELAY``, e.g. ``10gbit``, ``1gbit,0.5ms``, ``25gbit,50us``.

    Raises:
        ConfigError: a value that is not of that form, or a rate of 0.
    """
    rate, _, delay = str(text).partition(",")
    r, d = _RATE.fullmatch(rate.strip()), _DELAY.fullmatch(delay.strip()) if delay else None
    if r is None or (delay and d is None) or float(r[1]) <= 0:
        raise ConfigError(
            f"--link={text!r} is not RATE[,DELAY]; give e.g. --link 10gbit,0.5ms (rate in "
            "gbit, mbit or kbit per second each way; delay one-way in ms or us)"
        )
    seconds = float(d[1]) * _UNITS[d[2].lower()] if d else 0.0
    return Link(float(r[1]) * _UNITS[r[2].lower()], seconds)


def address(index: int) -> str:
    """The address of simulated host ``index`` (0-based)."""
    return f"{SUBNET}.{index + 1}"


def _run(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True)


def _reason(proc: subprocess.CompletedProcess) -> str:
    return (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]


class SimulatedHosts:
    """N network namespaces on a shaped bridge; a context manager that removes them on exit.

    Args:
        count: Number of hosts (>= 2).
        link: How the hosts are joined; None: the veth's own speed, no delay.

    Attributes:
        names: The hosts' namespace names (``ip netns``), host 0 first.
        notes: One line per thing that could not be done as asked (shaping, delay).

    Raises:
        ConfigError: fewer than 2 hosts, or more than the subnet holds.
        HostsUnavailable: namespaces cannot be made here (the message says why).
    """

    def __init__(self, count: int, link: Link | None = None):
        if count < 2:
            raise ConfigError(f"--hosts={count} is one machine; give --hosts 2 or more, or drop it")
        if count > 250:
            raise ConfigError(f"--hosts={count} is more than {SUBNET}.0/24 holds; give at most 250")
        _check_tools()
        _remove_stale()
        self.link, self.notes = link, []
        tag = f"{_PREFIX}{os.getpid()}"
        self.switch = f"{tag}-sw"
        self.names = [f"{tag}-h{i}" for i in range(count)]
        self._made: list[str] = []
        try:
            self._build()
        except BaseException:
            self.remove()
            raise

    def _ip(self, *args: str) -> None:
        proc = _run("ip", *args)
        if proc.returncode:
            raise HostsUnavailable(
                f"--hosts cannot set up the simulated network (`ip {' '.join(args)}`: "
                f"{_reason(proc)}); run as root on Linux with iproute2, or drop --hosts"
            )

    def _build(self) -> None:
        for name in (self.switch, *self.names):
            self._ip("netns", "add", name)
            self._made.append(name)
            self._ip("-n", name, "link", "set", "lo", "up")
        self._ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        self._ip("-n", self.switch, "link", "set", "br0", "up")
        for i, name in enumerate(self.names):
            port = f"port{i}"
            self._ip(
                "link",
                "add",
                "eth0",
                "netns",
                name,
                "type",
                "veth",
                "peer",
                "name",
                port,
                "netns",
                self.switch,
            )
            self._ip("-n", name, "addr", "add", f"{address(i)}/24", "dev", "eth0")
            self._ip("-n", name, "link", "set", "eth0", "up")
            self._ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
            if self.link is not None:
                self._shape(name, "eth0")
                self._shape(self.switch, port)

    def _shape(self, namespace: str, device: str) -> None:
        """Limits ``device``'s egress to the link's rate and half its delay (once a note per kind)."""
        link = self.link
        rate = f"{int(link.rate_bits)}bit"
        root = ("tc", "-n", namespace, "qdisc", "add", "dev", device, "root")
        if link.delay_s:
            half = f"{link.delay_s / 2 * 1e6:g}us"
            netem = _run(*root, "netem", "delay", half, "rate", rate)
            if netem.returncode == 0:
                return
            self._note(
                f"tc netem is not available here ({_reason(netem)}): the link gets its rate "
                f"but not the {link.delay_s * 1e3:g} ms delay (load the sch_netem module to add it)"
            )
        burst = str(max(64 * 1024, int(link.rate_bits / 8 / 1000)))  # 1 ms of traffic
        tbf = _run(*root, "tbf", "rate", rate, "burst", burst, "latency", "50ms")
        if tbf.returncode:
            self._note(
                f"tc cannot shape the link ({_reason(tbf)}): the hosts are joined at the veth's "
                "own speed (load the sch_tbf module to shape it)"
            )

    def _note(self, line: str) -> None:
        if line not in self.notes:
            self.notes.append(line)

    def prefix(self, index: int) -> list[str]:
        """The command prefix that runs a program on host ``index``."""
        return ["ip", "netns", "exec", self.names[index]]

    def remove(self) -> None:
        """Deletes the namespaces (and with them the veth pairs and the bridge); idempotent."""
        while self._made:
            _run("ip", "netns", "del", self._made.pop())

    def __enter__(self) -> SimulatedHosts:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def _check_tools() -> None:
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise HostsUnavailable(
            f"--hosts needs the {' and '.join(missing)} command(s); install iproute2, or drop --hosts"
        )
    if os.geteuid() != 0:
        raise HostsUnavailable(
            "--hosts needs root to create network namespaces (ip netns); run as root, or drop --hosts"
        )


def _remove_stale() -> None:
    """Deletes the namespaces of launchers that died without removing theirs."""
    listing = _run("ip", "netns", "list")
    for line in listing.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        match = re.fullmatch(rf"{_PREFIX}(\d+)-(sw|h\d+)", name)
        if match and not os.path.exists(f"/proc/{match[1]}"):
            _run("ip", "netns", "del", name)
