"""``tfopt launch --hosts N --link RATE[,DELAY]``: tasks on simulated hosts joined by a shaped link.

The tests with namespaces need root (``ip netns``); elsewhere they check the one-line fallback.
The shaping is checked from below only: a transfer cannot beat the link's rate, whatever the
load on the machine, while an unshaped veth moves the same bytes 100 times faster.
"""

import io
import os
import re
import subprocess
import sys
import textwrap

import pytest

from tfopt.core.errors import ConfigError
from tfopt.launch import cluster as launch_cluster
from tfopt.launch import hosts as hosts_lib
from tfopt.launch import launch, main
from tfopt.launch.hosts import HostsUnavailable, Link, SimulatedHosts, parse_link

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _can_make_namespaces() -> bool:
    try:
        SimulatedHosts(2).remove()
        return True
    except HostsUnavailable:
        return False


NAMESPACES = _can_make_namespaces()
needs_namespaces = pytest.mark.skipif(not NAMESPACES, reason="needs root and ip netns")


@pytest.mark.parametrize(
    "text, rate, delay",
    [
        ("10gbit", 1e10, 0.0),
        ("1gbit,0.5ms", 1e9, 0.0005),
        ("25Gbit,50us", 2.5e10, 5e-5),
        ("100mbit", 1e8, 0.0),
    ],
)
def test_parse_link(text, rate, delay):
    link = parse_link(text)
    assert (link.rate_bits, link.delay_s) == (rate, pytest.approx(delay))


@pytest.mark.parametrize("text", ["10", "fast", "10gbit,0.5", "0gbit", "10gbit,ms", "10 gbps"])
def test_a_bad_link_is_a_one_line_error(text):
    with pytest.raises(ConfigError, match=r"is not RATE\[,DELAY\]; give e.g. --link 10gbit,0.5ms"):
        parse_link(text)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--link", "1gbit"], "--link='1gbit' joins simulated hosts; add --hosts 2"),
        (["--hosts", "1"], "--hosts=1 is one machine; give --hosts 2 or more"),
        (["--hosts", "2", "--link", "1gbps"], "--link='1gbps' is not RATE[,DELAY]"),
    ],
)
def test_bad_host_flags_exit_2_in_one_line(argv, message, capsys):
    assert main([*argv, "--no-isolate", "--workers", "1", "--", "true"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_without_root_the_job_runs_on_the_loopback_and_says_so(monkeypatch, capfd):
    monkeypatch.setattr(hosts_lib.os, "geteuid", lambda: 1000)
    rc = main(
        [
            "--hosts",
            "2",
            "--no-isolate",
            "--workers",
            "1",
            "--",
            sys.executable,
            "-c",
            "print('ran')",
        ]
    )
    captured = capfd.readouterr()
    assert rc == 0 and "[worker:0] ran" in captured.out
    assert (
        "--hosts needs root to create network namespaces (ip netns); run as root, or drop --hosts; "
        "running the job on this host's loopback instead"
    ) in captured.err


# Worker 1 listens; worker 0 sends it BYTES through the link and reports the time it took.
BYTES = 4 * 1024 * 1024
TRANSFER = f"""
import json, os, socket, time
task = json.loads(os.environ["TF_CONFIG"])
me = task["cluster"]["worker"][task["task"]["index"]]
peer = task["cluster"]["worker"][1 - task["task"]["index"]]
netns = os.readlink("/proc/self/ns/net")
print("at", me, "netns", netns, flush=True)
if task["task"]["index"] == 1:
    server = socket.socket()
    server.bind(("", int(me.rpartition(":")[2])))
    server.listen()
    conn, _ = server.accept()
    got = 0
    while got < {BYTES}:
        got += len(conn.recv(1 << 20))
    conn.sendall(b"k")
    print("received", got, flush=True)
else:
    host, port = peer.rpartition(":")[0], int(peer.rpartition(":")[2])
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=1)
            break
        except OSError:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    start = time.monotonic()
    conn.sendall(b"x" * {BYTES})
    conn.recv(1)
    print("seconds", time.monotonic() - start, flush=True)
"""


def _launch(hosts: SimulatedHosts, code: str, **kwargs) -> tuple[int, str]:
    out = io.StringIO()
    command = [sys.executable, "-c", textwrap.dedent(code)]
    rc = launch(command, 2, out=out, hosts=hosts, timeout=60, **kwargs)
    return rc, out.getvalue()


@needs_namespaces
def test_two_hosts_have_their_own_addresses_and_the_link_limits_the_rate():
    rate = 100e6  # bits per second
    with SimulatedHosts(2, Link(rate)) as hosts:
        names = list(hosts.names)
        rc, out = _launch(hosts, TRANSFER)
    assert rc == 0, out
    found = re.findall(r"\[worker:(\d)\] at (\S+) netns (\S+)", out)
    at = {worker: address for worker, address, _ in found}
    assert at["0"].startswith("10.253.0.1:") and at["1"].startswith("10.253.0.2:")
    assert len({netns for *_, netns in found}) == 2, "the two workers share a network namespace"
    assert f"received {BYTES}" in out
    seconds = float(re.search(r"seconds (\S+)", out)[1])
    floor = BYTES * 8 / rate
    print(
        f"\n{BYTES / 1e6:.1f} MB over a {rate / 1e6:g} Mbit/s link: {seconds:.3f} s (the rate allows {floor:.3f} s)"
    )
    # tbf lets one burst (64 KiB here) through at once; the rest waits for the rate.
    assert seconds >= 0.9 * (BYTES - 64 * 1024) * 8 / rate, "the link was not shaped"
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in listing for name in names), "namespaces left behind"


@needs_namespaces
def test_a_delay_is_applied_or_its_absence_said_in_one_line():
    with SimulatedHosts(2, Link(1e9, 0.002)) as hosts:
        notes = list(hosts.notes)
        qdisc = subprocess.run(
            ["tc", "-n", hosts.names[0], "qdisc", "show", "dev", "eth0"],
            capture_output=True,
            text=True,
        ).stdout
    if notes:  # this kernel has no netem: the rate holds, the delay is said to be missing
        assert len(notes) == 1 and "tc netem is not available here" in notes[0]
        assert "but not the 2 ms delay" in notes[0]
        assert "tbf" in qdisc and "rate 1Gbit" in qdisc
    else:
        assert "netem" in qdisc and "delay 1ms" in qdisc  # half on each side of the switch


@needs_namespaces
def test_the_data_service_runs_on_the_first_host_and_trainers_reach_it_over_the_link(monkeypatch):
    monkeypatch.setattr(
        launch_cluster, "SERVE", [sys.executable, os.path.join(ROOT, "tests", "fake_serve.py")]
    )
    code = """
        import os, socket
        target = os.environ["TFOPT_DATA_SERVICE"]
        host, port = target[len("grpc://"):].rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=2).close()
        print("reached", target, flush=True)
    """
    with SimulatedHosts(2) as hosts:
        rc, out = _launch(hosts, code, data_workers=1)
    assert rc == 0, out
    assert re.search(r"\[worker:1\] reached grpc://10\.253\.0\.1:\d+", out), out


@needs_namespaces
def test_stale_namespaces_of_a_dead_launcher_are_removed():
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    name = f"tfopt-{dead.stdout.strip()}-h0"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        SimulatedHosts(2).remove()
        listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert name not in listing
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
