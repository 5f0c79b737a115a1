"""The reliability battery: real processes killed (-9), preempted (SIGTERM) and restarted.

Each test prints its figure (faults injected / survived, steps lost, max |dw|) with ``-s``; the
reference is always an uninterrupted run of the same command.
"""

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest
from isolation import ISOLATED

pytestmark = pytest.mark.slow

EVERY = 10
# 2 epochs of 64 steps (2,048 training records, batches of 32), dropout on: the RNG state must resume too.
TRAIN = [
    "--limit",
    "2048",
    "--epochs",
    "2",
    "--batch-size",
    "32",
    "--backup-every",
    str(EVERY),
    "--deterministic",
    "--model",
    "mlp",
    "--quiet",
    "--set",
    "train.tensorboard=false",
]


def _train(out, *extra, strategy="one_device"):
    return [
        sys.executable,
        "-m",
        "tfopt.train",
        "--strategy",
        strategy,
        *TRAIN,
        *extra,
        "-o",
        str(out),
    ]


def _run(cmd, timeout=600, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def _done(text, task="local"):
    for line in text.splitlines():
        if "tfopt train: done " in line:
            summary = json.loads(line.split("tfopt train: done ", 1)[1])
            if summary["task"] == task:
                return summary
    raise AssertionError(f"no done line of {task} in:\n{text[-3000:]}")


def _wait_for_backup(out, step, proc, timeout=300):
    """Waits until the backup of ``step`` (or a later one) is complete in run ``out``'s work directory."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = os.path.join(f"{out}.partial", "backup", "0", "checkpoint")
        if os.path.exists(state):
            with open(state) as f:
                m = re.search(r'^model_checkpoint_path: "ckpt-(\d+)"', f.read(), re.M)
            if m and int(m.group(1)) >= step:
                return int(m.group(1))
        assert proc.poll() is None, f"the run ended before its backup of step {step}"
        time.sleep(0.02)
    raise AssertionError(f"no backup of step {step} within {timeout}s")


def _resumed_step(text):
    m = re.search(r"resuming at step (\d+)", text)
    return int(m.group(1)) if m else 0


def _weights(run_dir):
    from tfopt.models.io import load_model

    return load_model(run_dir).get_weights()


def _max_dw(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(_weights(a), _weights(b)))


_REFERENCES = {}


def _uninterrupted(tmp_path_factory, strategy="one_device"):
    if strategy not in _REFERENCES:
        out = tmp_path_factory.mktemp("ft") / f"reference-{strategy}"
        result = _run(_train(out, strategy=strategy))
        assert result.returncode == 0, result.stderr[-3000:]
        _REFERENCES[strategy] = out, _done(result.stdout)
    return _REFERENCES[strategy]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return _uninterrupted(tmp_path_factory)


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_kill9_mid_epoch_then_rerun_is_bit_identical(tmp_path, tmp_path_factory, strategy):
    reference = _uninterrupted(tmp_path_factory, strategy)
    out = tmp_path / "run"
    proc = subprocess.Popen(
        _train(out, strategy=strategy), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    saved = _wait_for_backup(out, 3 * EVERY, proc)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -9
    result = _run(_train(out, strategy=strategy))
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = _resumed_step(result.stderr)
    dw = _max_dw(out, reference[0])
    print(
        f"\n{strategy} kill -9: faults 1, survived 1; backup at step {saved}, resumed at step {resumed} "
        f"(<= {EVERY} steps redone); max |dw| vs uninterrupted {dw:.3g}"
    )
    assert saved <= resumed < 64 * 2 and resumed % EVERY == 0  # mid-run, from a step backup
    assert _done(result.stdout)["weights_sha256"] == reference[1]["weights_sha256"] and dw == 0.0
    assert not os.path.exists(f"{out}.partial") and not os.path.exists(
        out / "backup"
    )  # committed, no backup left


def test_sigterm_writes_a_backup_at_the_next_step_and_exits_143(tmp_path, uninterrupted):
    out = tmp_path / "run"
    proc = subprocess.Popen(_train(out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_backup(out, 2 * EVERY, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    stopped = int(re.search(r"stopped by SIGTERM at step (\d+)", err).group(1))
    assert len(err.strip().splitlines()[-1]) < 300 and "Traceback" not in err
    result = _run(_train(out))
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = _resumed_step(result.stderr)
    print(
        f"\nSIGTERM: stopped at step {stopped}, resumed at step {resumed}: {stopped - resumed} steps lost"
    )
    assert resumed == stopped  # no step lost
    assert _done(result.stdout)["weights_sha256"] == uninterrupted[1]["weights_sha256"]


def _tasks(marker):
    """pid per TF_CONFIG task ("worker:1") of the processes whose environment holds ``marker``."""
    found = {}
    for environ in glob.glob("/proc/[0-9]*/environ"):
        try:
            with open(environ, "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if env.get(b"TFOPT_TEST_MARKER") == marker.encode() and b"TF_CONFIG" in env:
            task = json.loads(env[b"TF_CONFIG"])["task"]
            found[f"{task['type']}:{task['index']}"] = int(environ.split("/")[2])
    return found


def _kill_task(marker, name):
    pid = _tasks(marker)[name]
    os.kill(pid, signal.SIGKILL)


def _launch(out, *launch_args, strategy, env, extra=()):
    cmd = [
        *ISOLATED,
        sys.executable,
        "-m",
        "tfopt.launch",
        *launch_args,
        "--timeout",
        "500",
        "--",
        *_train(out, *extra, strategy=strategy),
    ]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )


def test_multi_worker_kills_of_a_worker_and_the_chief_restart_to_identical_weights(tmp_path):
    if not ISOLATED:
        pytest.skip(
            "needs a private network namespace (root): the tasks' servers would listen on all interfaces"
        )
    marker = uuid.uuid4().hex
    env = dict(os.environ, TFOPT_TEST_MARKER=marker)
    reference = _launch(
        tmp_path / "reference", "--workers", "2", strategy="multi_worker_mirrored", env=env
    )
    ref_out, _ = reference.communicate(timeout=600)
    assert reference.returncode == 0, ref_out[-3000:]

    out = tmp_path / "run"
    proc = _launch(
        out, "--workers", "2", "--max-restarts", "2", strategy="multi_worker_mirrored", env=env
    )
    _wait_for_backup(out, 2 * EVERY, proc)
    _kill_task(marker, "worker:1")
    # After the restart, wait for a backup beyond the first, then kill the chief (worker 0).
    time.sleep(1.0)
    first_restart = _wait_for_backup(out, 5 * EVERY, proc)
    _kill_task(marker, "worker:0")
    log, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, log[-4000:]
    restarts = re.findall(r"restart (\d)/2", log)
    resumed = [int(s) for s in re.findall(r"\[worker:0\] tfopt train: resuming at step (\d+)", log)]
    print(
        f"\nmulti_worker_mirrored x2: faults 2 (kill -9 worker:1 after step {2 * EVERY}, kill -9 chief after step "
        f"{first_restart}), survived 2; resumed at steps {resumed}; weights bit-identical"
    )
    assert (
        restarts == ["1", "2"]
        and len(resumed) == 2
        and resumed[0] >= 2 * EVERY
        and resumed[1] >= first_restart
    )
    digests = {s["weights_sha256"] for s in (_done(log, "worker:0"), _done(log, "worker:1"))}
    assert digests == {_done(ref_out, "worker:0")["weights_sha256"]}


def test_parameter_server_survives_a_worker_kill_and_restarts_after_a_ps_kill(tmp_path):
    if not ISOLATED:
        pytest.skip(
            "needs a private network namespace (root): the tasks' servers would listen on all interfaces"
        )
    marker = uuid.uuid4().hex
    env = dict(os.environ, TFOPT_TEST_MARKER=marker)
    ps = ("--chief", "--workers", "2", "--ps", "1")
    # Parameter-server training is asynchronous: no bit-identical reference; compared by max |dw| to
    # an uninterrupted run, and by the planned number of steps.
    reference = _launch(tmp_path / "reference", *ps, strategy="parameter_server", env=env)
    ref_log, _ = reference.communicate(timeout=600)
    assert reference.returncode == 0, ref_log[-3000:]

    out = tmp_path / "worker-killed"
    proc = _launch(out, *ps, strategy="parameter_server", env=env)
    _wait_for_backup(
        out, 1, proc
    )  # the first epoch's backup (parameter servers back up at epoch ends)
    _kill_task(marker, "worker:1")
    log, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, log[-4000:]
    assert "worker:1 exited with code 137; the job goes on without it" in log
    record = json.loads((out / "run.json").read_text())
    assert (
        len(record["history"]) == 2 and record["train"]["optimizer_steps"] == 2 * 64
    )  # every planned step
    dw_worker = _max_dw(out, tmp_path / "reference")

    out = tmp_path / "ps-killed"
    proc = _launch(out, *ps, "--max-restarts", "1", strategy="parameter_server", env=env)
    _wait_for_backup(out, 1, proc)
    _kill_task(marker, "ps:0")
    log, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, log[-4000:]
    assert re.search(r"(chief:0|ps:0) exited with code 1?3[78]", log) and "restart 1/1" in log
    dw_ps = _max_dw(out, tmp_path / "reference")
    print(
        f"\nparameter_server: faults 2 (kill -9 worker:1, kill -9 ps:0), survived 2; max |dw| vs uninterrupted: "
        f"worker kill {dw_worker:.3g}, ps kill {dw_ps:.3g}"
    )


def test_sidecar_evaluator_evaluates_each_backup_as_the_chief_validates(tmp_path):
    if not ISOLATED:
        pytest.skip(
            "needs a private network namespace (root): the tasks' servers would listen on all interfaces"
        )
    out = tmp_path / "run"
    # Backups at epoch ends only (steps 64, 128); the cnn trains long enough for the evaluator to start.
    train = [a if a != "mlp" else "cnn" for a in TRAIN if a not in ("--backup-every", str(EVERY))]
    cmd = [
        *ISOLATED,
        sys.executable,
        "-m",
        "tfopt.launch",
        "--chief",
        "--workers",
        "0",
        "--evaluator",
        "--timeout",
        "400",
        "--",
        sys.executable,
        "-m",
        "tfopt.train",
        "--strategy",
        "one_device",
        *train,
        "-o",
        str(out),
    ]
    result = _run(cmd)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "[evaluator:0] tfopt train: evaluator: step 64 " in result.stdout
    rows = json.loads((out / "evaluator.json").read_text())
    history = {r["epoch"] * 64: r for r in json.loads((out / "run.json").read_text())["history"]}
    print(f"\nsidecar evaluator: evaluated steps {[r['step'] for r in rows]}")
    assert rows[0]["step"] == 64 and {r["step"] for r in rows} <= {64, 128}
    for row in (
        rows
    ):  # the same weights and held-out split as the chief's own validation at that epoch end
        assert row["accuracy"] == pytest.approx(history[row["step"]]["val_accuracy"], abs=1e-6)
        assert row["loss"] == pytest.approx(history[row["step"]]["val_loss"], rel=1e-5)
    assert glob.glob(str(out / "tensorboard" / "evaluator" / "events.out.tfevents.*"))


@pytest.fixture(scope="module")
def small_teacher(tmp_path_factory):
    """An mlp trained one epoch on the slice: the run that distill and optimize start from."""
    out = tmp_path_factory.mktemp("ft-teacher") / "teacher"
    result = _run(
        [
            sys.executable,
            "-m",
            "tfopt.train",
            "--strategy",
            "one_device",
            "--limit",
            "2048",
            "--epochs",
            "1",
            "--batch-size",
            "32",
            "--model",
            "mlp",
            "--quiet",
            "--set",
            "train.tensorboard=false",
            "-o",
            str(out),
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return str(out)


def _wait_for_slot_backup(out, slot, proc, timeout=300):
    """Waits until fit number ``slot`` (0 = the first phase) of run ``out`` has a complete backup."""
    deadline = time.monotonic() + timeout
    state = os.path.join(f"{out}.partial", "backup", str(slot), "checkpoint")
    while time.monotonic() < deadline:
        if os.path.exists(state):
            with open(state) as f:
                m = re.search(r'^model_checkpoint_path: "ckpt-(\d+)"', f.read(), re.M)
            if m and int(m.group(1)) >= EVERY:
                return int(m.group(1))
        assert proc.poll() is None, f"the run ended before a backup of its fit {slot}"
        time.sleep(0.02)
    raise AssertionError(f"no backup of fit {slot} within {timeout}s")


# distill: one fit (the Distiller, teacher frozen); optimize pqat: two fits (pruning, then
# prune-preserving QAT), killed in the second, so the resume must find its phase and wrapper state.
STAGES = {
    "distill": (
        ["-m", "tfopt.distill", "--teacher", "{teacher}", "--student", "mlp", "--epochs", "2"],
        0,
    ),
    "optimize": (
        ["-m", "tfopt.optimize", "--from", "{teacher}", "--technique", "pqat", "--epochs", "1"],
        1,
    ),
}


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_kill9_of_a_later_stage_resumes_to_identical_weights(tmp_path, small_teacher, stage):
    args, slot = STAGES[stage]
    common = [
        "--strategy",
        "one_device",
        "--limit",
        "2048",
        "--batch-size",
        "32",
        "--backup-every",
        str(EVERY),
        "--deterministic",
        "--quiet",
        "--set",
        "train.tensorboard=false",
    ]

    def cmd(out):
        return [
            sys.executable,
            *[a.format(teacher=small_teacher) for a in args],
            *common,
            "-o",
            str(out),
        ]

    reference = _run(cmd(tmp_path / "reference"))
    assert reference.returncode == 0, reference.stderr[-3000:]
    out = tmp_path / "run"
    proc = subprocess.Popen(cmd(out), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    saved = _wait_for_slot_backup(out, slot, proc)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    result = _run(cmd(out))
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = int(
        re.findall(r"resuming at step (\d+)", result.stderr)[-1]
    )  # in the fit that was killed
    dw = _max_dw(out, tmp_path / "reference")
    digest = {
        json.loads((d / "run.json").read_text())["weights_sha256"]
        for d in (out, tmp_path / "reference")
    }
    print(
        f"\n{stage} kill -9 in fit {slot}: backup at step {saved}, resumed at step {resumed}; "
        f"max |dw| vs uninterrupted {dw:.3g}"
    )
    assert resumed >= saved > 0 and len(digest) == 1 and dw == 0.0
