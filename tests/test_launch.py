"""The local launcher and the start-up watchdog, with real processes.

Plain-Python children keep most tests under a second; the TensorFlow cluster tests (MWMS,
ParameterServer, a watchdog firing inside a real MWMS start-up) are marked slow. They run in
a private network namespace when ``unshare -n`` and ``ip`` are usable (root on Linux), since
TensorFlow servers listen unauthenticated on all interfaces.
"""

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from isolation import ISOLATED

from tfopt.core.errors import ConfigError
from tfopt.launch import free_ports, isolation_prefix, launch, main, make_cluster
from tfopt.runtime.tf_config import parse_tf_config
from tfopt.runtime.watchdog import timeout_message

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HELPER = os.path.join(ROOT, "tests", "dist_worker.py")
ENV = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def py(code: str) -> list[str]:
    """A command running ``code`` with the task's TF_CONFIG task as ``task``."""
    prelude = "import json, os, sys, time\ntask = json.loads(os.environ['TF_CONFIG'])['task']\n"
    return [sys.executable, "-c", prelude + textwrap.dedent(code)]


def run_launch(command, **kwargs):
    """``(exit code, the job's output, time.monotonic() when launch returned)``."""
    out = io.StringIO()
    code = launch(command, out=out, env=ENV, **kwargs)
    return code, out.getvalue(), time.monotonic()


# A task that sleeps longer than any test waits, then says so: its line in the output means the
# launcher let it run out instead of stopping it (no clock involved, whatever the machine's load).
SLEEP_OUT = "time.sleep(60); print('slept out', flush=True)"


# ---------------------------------------------------------------- cluster helpers


def test_free_ports_are_distinct_and_bindable():
    ports = free_ports(4)
    assert len(set(ports)) == 4
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_make_cluster_shapes():
    assert list(make_cluster(2)) == ["worker"]
    cluster = make_cluster(2, ps=1, chief=True)
    assert {k: len(v) for k, v in cluster.items()} == {"chief": 1, "worker": 2, "ps": 1}
    info = parse_tf_config(json.dumps({"cluster": cluster, "task": {"type": "ps", "index": 0}}))
    assert len(info.peers()) == 3


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(workers=0), "--workers=0"),
        (dict(workers=2, ps=1), "--ps=1 needs --chief"),
        (dict(workers=-1, chief=True), "must be >= 0"),
    ],
)
def test_make_cluster_rejects(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        make_cluster(**kwargs)


# ---------------------------------------------------------------- job semantics


def test_two_workers_each_get_their_tf_config():
    code, out, _ = run_launch(py("print('task', task['type'], task['index'])"), workers=2)
    assert code == 0
    assert "[worker:0] task worker 0" in out and "[worker:1] task worker 1" in out


def test_failing_worker_stops_the_others_quickly():
    code, out, _ = run_launch(
        py(f"""
        if task['index'] == 1:
            print('failing'); sys.exit(7)
        {SLEEP_OUT}
    """),
        workers=2,
        grace=1.0,
    )
    assert code == 7
    assert "[worker:1] failing" in out
    assert "slept out" not in out  # worker 0 was stopped, not waited for


@pytest.mark.slow
def test_sigterm_ignoring_task_is_killed_after_grace():
    # Worker 0 notes when SIGTERM reached it (CLOCK_MONOTONIC is one clock for every process) and
    # sleeps on. Timed is the stop alone, SIGTERM to the launcher's return, never the start-up of
    # the tasks, which a loaded machine stretches: 0.5 s of grace, then SIGKILL. The bound is 10x
    # that grace and half the launcher's default one (10 s), which an ignored --grace would take.
    code, out, returned = run_launch(
        py(f"""
        import signal
        def note(signum, frame):
            print('sigterm at', time.monotonic(), flush=True)
        signal.signal(signal.SIGTERM, note if task['index'] == 0 else signal.SIG_IGN)
        if task['index'] == 1:
            time.sleep(0.5); sys.exit(1)
        {SLEEP_OUT}
    """),
        workers=2,
        grace=0.5,
    )
    assert code == 1
    assert "slept out" not in out  # killed: SIGTERM alone did not stop it
    (sigterm,) = [float(x) for x in re.findall(r"\[worker:0\] sigterm at ([0-9.]+)", out)]
    assert 0 < returned - sigterm < 5.0, out


def test_killed_task_gives_shell_style_code():
    code, _, _ = run_launch(py("os.kill(os.getpid(), 9)"), workers=1)
    assert code == 128 + 9


@pytest.mark.slow
def test_timeout_returns_124(capfd):
    code, out, _ = run_launch(py(SLEEP_OUT), workers=2, timeout=1.0, grace=1.0)
    assert code == 124
    assert "slept out" not in out  # the job's --timeout stopped both sleepers
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--timeout=1s" in err[0] and "worker:0" in err[0]


def test_chief_exit_ends_parameter_server_job():
    code, out, _ = run_launch(
        py(f"""
        if task['type'] == 'chief':
            time.sleep(0.3); print('chief done'); sys.exit(0)
        {SLEEP_OUT}  # a worker/ps server never exits by itself
    """),
        workers=2,
        ps=1,
        chief=True,
        grace=1.0,
    )
    assert code == 0 and "[chief:0] chief done" in out
    assert "slept out" not in out  # the workers and the ps were stopped when the chief ended


def test_cli_errors_exit_2(capsys):
    assert main(["--workers", "2"]) == 2
    assert "no command to launch" in capsys.readouterr().err
    assert main(["--workers", "1", "--ps", "1", "--", "true"]) == 2
    assert "--ps=1 needs --chief" in capsys.readouterr().err


def test_missing_program_is_a_config_error():
    with pytest.raises(ConfigError, match="'/nonexistent/prog'"):
        launch(["/nonexistent/prog"], workers=2, out=io.StringIO())


def test_ctrl_c_stops_children():
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tfopt.launch",
            "--workers",
            "2",
            "--",
            *py("print('pid', os.getpid(), flush=True); time.sleep(60)"),
        ],
        env=ENV,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        # A shell starts background jobs with SIGINT ignored, and Python then installs no
        # KeyboardInterrupt handler: give the launcher the default disposition a terminal gives.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    pids = [int(proc.stdout.readline().split()[-1]) for _ in range(2)]
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=20) == 130
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_sigterm_to_the_launcher_reaches_every_task_and_exits_143():
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tfopt.launch",
            "--workers",
            "2",
            "--grace",
            "20",
            "--",
            *py("""
             import signal
             signal.signal(signal.SIGTERM, lambda *a: (print('saving', task['index'], flush=True), sys.exit(143)))
             print('ready', flush=True)
             time.sleep(60)
             """),
        ],
        env=ENV,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    ready = 0
    while ready < 2:
        ready += proc.stdout.readline().strip().endswith("ready")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 143
    assert (
        "[worker:0] saving 0" in out and "[worker:1] saving 1" in out
    )  # each task handled it itself


@pytest.mark.slow
def test_restarts_only_retryable_failures_up_to_the_limit(tmp_path, capfd):
    count = tmp_path / "attempts"
    code, out, _ = run_launch(
        py(f"""
        with open({str(count)!r}, "a") as f:
            f.write(str(task["index"]))
        if task["index"] == 1 and open({str(count)!r}).read().count("1") < 3:
            os.kill(os.getpid(), 9)   # killed twice, then it succeeds
        """),
        workers=2,
        max_restarts=2,
    )
    said = capfd.readouterr().err
    assert code == 0 and count.read_text().count("1") == 3
    assert (
        "worker:1 exited with code 137 (killed by SIGKILL); restart 1/2" in said
        and "restart 2/2" in said
    )
    code, out, _ = run_launch(
        py("sys.exit(2 if task['index'] == 1 else 0)"), workers=2, max_restarts=3
    )
    assert code == 2 and "restart" not in capfd.readouterr().err  # bad input is final
    code, out, _ = run_launch(
        py("os.kill(os.getpid(), 9) if task['index'] == 0 else None"), workers=1, max_restarts=1
    )
    assert code == 137 and "no restart left (--max-restarts=1)" in capfd.readouterr().err


INTERFACES = py(
    "print('interfaces', sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]), "
    "flush=True)"
)
HOST_INTERFACES = sorted(
    line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:]
)


@pytest.mark.parametrize(
    "flags, isolated",
    [
        ([], True),  # the default: a loopback cluster runs off the network
        (["--isolate"], True),
        (["--no-isolate"], False),
        (["--host", "this machine's address"], False),  # an address a private namespace lacks
    ],
)
@pytest.mark.slow
def test_a_local_cluster_has_no_network_but_its_loopback(flags, isolated):
    if not ISOLATED:
        pytest.skip("needs root (unshare -n)")
    if "--host" in flags:
        found = subprocess.run(
            ["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True
        ).stdout.split()
        if "inet" not in found:
            pytest.skip("this machine has no global IPv4 address")
        flags = ["--host", found[found.index("inet") + 1].partition("/")[0]]
    proc = subprocess.run(
        [sys.executable, "-m", "tfopt.launch", *flags, "--workers", "1", "--", *INTERFACES],
        env=ENV,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert HOST_INTERFACES != ["lo"]  # the test itself does see the host's interfaces
    seen = ["lo"] if isolated else HOST_INTERFACES
    assert f"[worker:0] interfaces {seen}" in proc.stdout, proc.stdout


def test_other_users_get_the_namespace_inside_a_user_namespace(monkeypatch):
    if subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode != 0:
        pytest.skip("this kernel has no user namespaces")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    prefix = isolation_prefix()
    assert prefix[:2] == ["unshare", "-rn"]
    proc = subprocess.run(
        [*prefix, *INTERFACES],
        env=dict(ENV, TF_CONFIG=json.dumps({"task": {"type": "worker", "index": 0}})),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and "interfaces ['lo']" in proc.stdout, proc.stderr


def test_a_host_that_is_not_this_machine_is_a_one_line_error():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tfopt.launch",
            "--host",
            "10.255.255.1",
            "--workers",
            "1",
            "--",
            *INTERFACES,
        ],
        env=ENV,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stderr.startswith(
        "tfopt launch: --host '10.255.255.1' is not an address of this machine (Cannot assign requested address)"
    )
    assert len(proc.stderr.strip().splitlines()) == 1


def test_isolate_fails_in_one_line_where_no_namespace_can_be_made(tmp_path):
    (tmp_path / "unshare").write_text(
        "#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n"
    )
    (tmp_path / "unshare").chmod(0o755)
    env = dict(ENV, PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    run = [sys.executable, "-m", "tfopt.launch", "--workers", "1", "--", *INTERFACES]
    proc = subprocess.run(
        [*run[:3], "--isolate", *run[3:]],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "[worker:0]" not in proc.stdout
    assert proc.stderr.strip().splitlines()[-1] == (
        "tfopt launch: --isolate cannot create a network namespace (unshare: unshare failed: Operation not "
        "permitted); run as root or enable unprivileged user namespaces (sysctl user.max_user_namespaces), or "
        "pass --no-isolate on a trusted machine"
    )
    proc = subprocess.run(
        run, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )  # the default
    assert proc.returncode == 0 and f"[worker:0] interfaces {HOST_INTERFACES}" in proc.stdout, (
        proc.stderr
    )


# ---------------------------------------------------------------- watchdog (no TensorFlow)


def test_timeout_message_names_only_unreachable_peers():
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        up = f"127.0.0.1:{listening.getsockname()[1]}"
        down = f"127.0.0.1:{free_ports(1)[0]}"
        line = timeout_message(5, [up, down])
    assert f"unreachable peers: {down} (connection refused)" in line
    assert up not in line
    assert "--set runtime.startup_timeout=SECONDS" in line and "\n" not in line


WATCHED = """
import sys, time
from tfopt.runtime.watchdog import StartupWatchdog
with StartupWatchdog(float(sys.argv[1]), sys.argv[2:]):
    time.sleep(float(sys.argv[1]) * 20)
print("finished")
"""


def test_watchdog_fires_with_exit_3():
    peer = f"127.0.0.1:{free_ports(1)[0]}"
    done = subprocess.run(
        [sys.executable, "-c", WATCHED, "0.5", peer],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 3
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and peer in lines[0] and "within 0.5s" in lines[0]
    assert "finished" not in done.stdout


def test_watchdog_silent_when_block_finishes():
    done = subprocess.run(
        [sys.executable, "-c", WATCHED.replace("* 20", "* 0"), "5", "127.0.0.1:1"],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0 and done.stdout.strip() == "finished" and done.stderr == ""


# ---------------------------------------------------------------- real TensorFlow clusters


def _launch_cli(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*ISOLATED, sys.executable, "-m", "tfopt.launch", *args],
        env=ENV,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_multi_worker_mirrored_two_processes():
    done = _launch_cli(
        [
            "--workers",
            "2",
            "--timeout",
            "120",
            "--",
            sys.executable,
            HELPER,
            "multi_worker_mirrored",
            "60",
        ],
        timeout=180,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    for i in range(2):
        assert f"[worker:{i}] RESULT worker:{i} replicas=2 sum=2" in done.stdout


@pytest.mark.slow
def test_watchdog_fires_when_peer_never_starts():
    ports = free_ports(2)
    tf_config = {
        "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
        "task": {"type": "worker", "index": 0},
    }
    done = subprocess.run(
        [*ISOLATED, sys.executable, HELPER, "multi_worker_mirrored", "4"],
        env=dict(ENV, TF_CONFIG=json.dumps(tf_config)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("tfopt:")]
    assert len(lines) == 1
    assert f"unreachable peers: 127.0.0.1:{ports[1]} (connection refused)" in lines[0]
    assert f"127.0.0.1:{ports[0]}" not in lines[0]


@pytest.mark.slow
def test_parameter_server_chief_two_workers_one_ps():
    done = _launch_cli(
        [
            "--chief",
            "--workers",
            "2",
            "--ps",
            "1",
            "--timeout",
            "150",
            "--grace",
            "1",
            "--",
            sys.executable,
            HELPER,
            "parameter_server",
        ],
        timeout=200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "[chief:0] RESULT chief:0 counter=4" in done.stdout
    assert "[ps:0] tfopt: ps:0 server listening" in done.stdout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead too
        return f.read().split(")")[-1].split()[0] != "Z"


def _wait_dead(pids, timeout=15.0):
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP])
def test_tasks_end_when_their_launcher_dies(sig):
    """kill -9 of the launcher, or its terminal closing: no task is left running with its ports open."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tfopt.launch",
            "--workers",
            "2",
            "--grace",
            "5",
            "--",
            *py("""
             import signal
             signal.signal(signal.SIGTERM, lambda *a: (print('saving', flush=True), sys.exit(143)))
             print('pid', os.getpid(), flush=True)
             time.sleep(120)
             """),
        ],
        env=ENV,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    pids = [int(proc.stdout.readline().split()[-1]) for _ in range(2)]
    proc.send_signal(sig)
    proc.wait(timeout=30)
    assert _wait_dead(pids) == [], "tasks outlived their launcher"


@pytest.mark.slow
def test_a_second_ctrl_c_during_the_grace_period_kills_the_tasks_without_a_traceback():
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tfopt.launch",
            "--workers",
            "2",
            "--grace",
            "60",
            "--",
            *py("""
             import signal
             signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a task slow to stop
             print('pid', os.getpid(), flush=True)
             time.sleep(120)
             """),
        ],
        env=ENV,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    pids = [int(proc.stdout.readline().split()[-1]) for _ in range(2)]
    proc.send_signal(signal.SIGINT)
    time.sleep(1.0)  # inside the 60 s grace period
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert "interrupted again; killing 2 task(s) now" in err
    assert _wait_dead(pids, timeout=5) == []


_PIPELINE_LIKE = """
import sys
from tfopt.core.children import run_child
try:
    sys.exit(run_child(sys.argv[1:]))
except KeyboardInterrupt:
    print("parent: interrupted after its child ended", flush=True)
    sys.exit(130)
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigint_to_the_parent_only", "kill9_of_the_parent"])
def test_the_pipeline_runner_waits_for_its_launcher_or_takes_it_along(how):
    """What `tfopt.pipeline` does around each multi-process stage: its launcher never outlives it."""
    launcher = [
        sys.executable,
        "-m",
        "tfopt.launch",
        "--workers",
        "2",
        "--grace",
        "10",
        "--",
        *py("""
                    import signal
                    signal.signal(signal.SIGTERM, lambda *a: (print('saving', flush=True), sys.exit(143)))
                    print('pid', os.getpid(), flush=True)
                    time.sleep(120)
                    """),
    ]
    proc = subprocess.Popen(
        [sys.executable, "-c", _PIPELINE_LIKE, *launcher],
        env=ENV,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    pids = []
    while len(pids) < 2:
        line = proc.stdout.readline()
        if " pid " in line:
            pids.append(int(line.split()[-1]))
    if how == "kill9_of_the_parent":
        proc.kill()
        proc.wait(timeout=10)
        assert _wait_dead(pids) == []
        return
    proc.send_signal(signal.SIGINT)  # to the parent alone, not its process group
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "Traceback" not in out, out
    assert out.count("saving") == 2 and out.rstrip().endswith(
        "parent: interrupted after its child ended"
    ), out
    assert _wait_dead(pids, timeout=2) == []
