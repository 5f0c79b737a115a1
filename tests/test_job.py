"""The Job every stage runs in: run records, output directories, atomic commits, resume and fingerprints."""

import json
import os
import subprocess
import sys

import pytest

from tfopt import config as C
from tfopt.core.errors import ConfigError
from tfopt.runs import RunRecord, default_output, fingerprint, load_run, update_latest
from tfopt.runtime.rundir import RunDir

DIGITS = {"dataset": "digits", "global_batch_size": 64, "num_shards": 2}


def test_run_record_round_trip_and_schema_1():
    rec = RunRecord(
        stage="distill",
        config={"train": {}},
        metrics={"test_accuracy": 0.9},
        section={"gap": {"x": 1}},
    )
    d = rec.to_dict()
    assert d["distill"] == {"gap": {"x": 1}} and d["schema_version"] == 2 and "section" not in d
    assert RunRecord.from_dict(json.loads(json.dumps(d))) == rec
    old = {
        "stage": "distill",
        "config": {},
        "gap": {"x": 2},
        "teachers": [],
        "metrics": {},
    }  # schema 1: no version
    back = RunRecord.from_dict(old)
    assert back.section == {"gap": {"x": 2}, "teachers": []} and back.metrics == {}
    assert RunRecord.from_dict({"config": {}}).stage == "train"


def test_default_outputs_never_replace_a_run_and_latest_follows(tmp_path):
    root = tmp_path / "runs"
    first = default_output("train", str(root))
    assert first == str(root / "train")
    os.makedirs(first)
    assert (
        default_output("train", str(root)) == first
    )  # an empty (or crashed) dir is not a finished run
    (root / "train" / "run.json").write_text("{}")
    second = default_output("train", str(root))
    assert second == str(root / "train-2")
    os.makedirs(second)
    (root / "train-2" / "run.json").write_text("{}")
    assert default_output("train", str(root)) == str(root / "train-3")
    update_latest(first)
    update_latest(second)
    assert os.readlink(root / "latest") == "train-2"
    update_latest(str(tmp_path / "elsewhere" / "x"))  # not under a runs/ folder: no link there
    assert not os.path.lexists(tmp_path / "elsewhere" / "latest")


def _rundir(path, fp="a", settings=None, **kw):
    return RunDir(str(path), fp, settings or {"config": {"train": {"learning_rate": 0.001}}}, **kw)


def test_run_dir_refuses_a_finished_run_and_a_different_config(tmp_path):
    out = tmp_path / "run"
    rd = _rundir(out)
    rd.check()
    rd.open()
    assert os.path.isdir(rd.work) and rd.resuming
    rd.release()  # the run died: its work directory stays, its lock goes
    other = _rundir(out, "b", {"config": {"train": {"learning_rate": 0.01}}})
    with pytest.raises(
        ConfigError,
        match=r"other settings \(config.train.learning_rate: 0.001 -> 0.01\).*--overwrite",
    ):
        other.check()
    assert _rundir(out).resuming
    rd.commit(RunRecord(stage="train", config={}))
    assert os.path.isfile(out / "run.json") and not os.path.exists(rd.work)
    with pytest.raises(ConfigError, match="holds a finished run; give another -o, or --overwrite"):
        _rundir(out).check()
    _rundir(out, overwrite=True).check()
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="non-empty directory that is not a tfopt run"):
        _rundir(tmp_path / "junk").check()
    with pytest.raises(ConfigError, match="not a tfopt run .*which --overwrite never replaces"):
        _rundir(tmp_path / "junk", overwrite=True).check()
    assert (tmp_path / "junk" / "notes.txt").read_text() == "mine"


class _FsCrash(Exception):
    pass


def _count_fs_steps(monkeypatch, crash_at):
    """Makes the crash_at-th file-system change (rename, unlink, rmtree, symlink) raise; returns the counter."""
    import shutil

    calls = []

    def wrap(fn):
        def step(*args, **kwargs):
            calls.append(fn.__name__)
            if len(calls) == crash_at:
                raise _FsCrash(fn.__name__)
            return fn(*args, **kwargs)

        return step

    for module, name in ((os, "replace"), (os, "unlink"), (os, "symlink"), (shutil, "rmtree")):
        monkeypatch.setattr(module, name, wrap(getattr(module, name)))
    return calls


def _commit_over_a_previous_run(out):
    first = _rundir(out)
    first.open()
    first.commit(RunRecord(stage="train", config={}, metrics={"run": 1}))
    rd = _rundir(out, "b", overwrite=True)
    rd.check()
    rd.open()
    os.makedirs(os.path.join(rd.work, "backup", "chief"))
    open(os.path.join(rd.work, "backup", "chief", "ckpt"), "w").write("step 900")
    open(os.path.join(rd.work, "model.keras"), "w").write("finished model")
    return rd


def test_a_crash_at_any_file_system_step_of_a_commit_loses_nothing(tmp_path, monkeypatch):
    probe = _commit_over_a_previous_run(tmp_path / "probe" / "runs" / "r")
    with monkeypatch.context() as m:
        calls = _count_fs_steps(m, crash_at=0)
        probe.commit(RunRecord(stage="train", config={}, metrics={"run": 2}))
        steps = list(calls)
    assert len(steps) >= 6, steps  # run.json's rename, two renames, backup, stamp, .old, latest
    for crash_at in range(1, len(steps) + 1):
        out = tmp_path / str(crash_at) / "runs" / "r"
        rd = _commit_over_a_previous_run(out)
        with monkeypatch.context() as m:
            _count_fs_steps(m, crash_at)
            with pytest.raises(_FsCrash):
                rd.commit(RunRecord(stage="train", config={}, metrics={"run": 2}))
        rd.release()  # the process died: the kernel drops its lock
        # the next start (any stage, any settings) finishes or undoes it before anything else
        with pytest.raises(ConfigError, match="holds a finished run"):
            _rundir(out, "c").check()
        run = json.load(open(out / "run.json"))["metrics"]["run"]
        left = sorted(
            n for n in os.listdir(out.parent) if not n.startswith(".latest-")
        )  # a link never renamed
        if run == 2:  # the new run is in place, whole, and never resumable
            assert sorted(os.listdir(out)) == ["model.keras", "run.json"], (
                crash_at,
                steps[crash_at - 1],
            )
            assert left == ["latest", "r"] and os.readlink(out.parent / "latest") == "r", (
                crash_at,
                left,
            )
        else:  # crashed before run.json was in the work directory: the old run, the work and its backup intact
            assert (
                crash_at == 1
                and open(os.path.join(rd.work, "backup", "chief", "ckpt")).read() == "step 900"
            )
            assert sorted(os.listdir(out)) == ["run.json"] and left == ["latest", "r", "r.partial"]


def test_commit_replaces_atomically_and_drops_backups(tmp_path):
    out = tmp_path / "runs" / "r"
    rd = _rundir(out)
    rd.open()
    os.makedirs(os.path.join(rd.work, "backup", "chief"))
    rd.commit(RunRecord(stage="train", config={}, metrics={"a": 1}))
    assert sorted(os.listdir(out)) == ["run.json"]  # no backup, no fingerprint stamp
    assert os.readlink(out.parent / "latest") == "r"
    rd2 = _rundir(out, "b", overwrite=True)
    rd2.check()
    rd2.open()
    (open(os.path.join(rd2.work, "model.keras"), "w")).write("new")
    rd2.commit(RunRecord(stage="train", config={}, metrics={"a": 2}))
    assert json.load(open(out / "run.json"))["metrics"] == {"a": 2}
    assert not [p for p in os.listdir(out.parent) if p.endswith((".old", ".partial"))]


_HOLD = """
import sys, time
from tfopt.runtime.rundir import RunDir
rd = RunDir(sys.argv[1], "f", {}, cluster=sys.argv[2] or None)
rd.check()
rd.open()
print("locked", flush=True)
time.sleep(600)
"""


def _hold(path, cluster=""):
    """A live run in another process: it locks ``path`` and waits to be killed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(path), cluster], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "locked"
    return proc


@pytest.mark.slow
def test_a_live_run_locks_its_directory_until_it_dies(tmp_path):
    root = tmp_path / "runs"
    live = _hold(root / "train")
    try:
        for kw in ({}, {"overwrite": True}):  # --overwrite never replaces a live run
            with pytest.raises(
                ConfigError,
                match=rf"being written by another run \(pid {live.pid} on .*give another -o",
            ):
                _rundir(root / "train", **kw).check()
        assert default_output("train", str(root)) == str(root / "train-2")  # default names skip it
        picked = _rundir(root / "train", pick=lambda: default_output("train", str(root)))
        picked.check()  # a default name that a live run took between pick and lock moves on
        assert picked.path == str(root / "train-2") and picked.lock.held
        picked.release()
        assert os.path.isdir(root / "train.partial")  # the live run's work is untouched
    finally:
        live.kill()
        live.wait()
    rd = RunDir(str(root / "train"), "f", {})
    rd.check()  # kill -9 released it: the crashed run can be resumed
    assert rd.resuming and rd.lock.held
    rd.release()
    assert not os.path.exists(str(root / "train") + ".tfopt-lock")


def test_the_workers_of_a_cluster_pick_the_directory_their_chief_locked(tmp_path):
    root = tmp_path / "runs"
    chief = _hold(root / "train", cluster="c1")
    try:
        assert default_output("train", str(root), cluster="c1") == str(root / "train")
        assert default_output("train", str(root), cluster="c2") == str(root / "train-2")
        assert default_output("train", str(root)) == str(root / "train-2")
    finally:
        chief.kill()
        chief.wait()


def test_fingerprint_ignores_where_and_how_loudly():
    from tfopt.runtime.job import result_config

    a = C.from_dict({"train": {"output_dir": "x", "verbose": 0}})
    b = C.from_dict({"train": {"output_dir": "y", "verbose": 1}})
    c = C.from_dict({"train": {"learning_rate": 0.01}})
    assert fingerprint("train", result_config(a)) == fingerprint("train", result_config(b))
    assert fingerprint("train", result_config(a)) != fingerprint("train", result_config(c))


def test_a_changed_input_model_or_tfopt_version_is_not_resumed(tmp_path, monkeypatch):
    from tfopt.core._keras import keras

    from tfopt.runs import load_input
    from tfopt.runtime.job import Job

    teacher = str(tmp_path / "teacher.keras")
    inp = keras.Input((8, 8, 1))
    keras.Model(inp, keras.layers.Dense(10)(keras.layers.Flatten()(inp))).save(teacher)
    cfg = C.from_dict(
        {
            "data": DIGITS,
            "runtime": {"strategy": "one_device"},
            "train": {"output_dir": str(tmp_path / "student"), "verbose": 0},
        }
    )

    def job():  # what tfopt.distill fingerprints: its options and each teacher's digest
        return Job(cfg, "distill", options={"teacher_digests": [load_input(teacher).digest]})

    job().run_dir.open()  # an unfinished run against this teacher
    assert job().run_dir.resuming
    keras.Model(inp, keras.layers.Dense(10)(keras.layers.Flatten()(inp))).save(
        teacher
    )  # retrained: new weights
    with pytest.raises(ConfigError, match="other settings .*distill.teacher_digests"):
        job()
    before = fingerprint("distill", {})
    monkeypatch.setattr("tfopt._version.__version__", "0.0.0-other")
    assert fingerprint("distill", {}) != before  # another tfopt never resumes this one's backups


def test_a_backup_of_another_model_is_refused_not_half_restored(tmp_path):
    from tfopt.core._keras import keras, tf

    from tfopt.core.errors import TrainingError
    from tfopt.runtime.backup import Backup

    def backup(units, extra=False):
        inp = keras.Input((4,))
        x = keras.layers.Dense(units, name="fc")(inp)
        model = keras.Model(inp, keras.layers.Dense(2, name="extra")(x) if extra else x)
        b = Backup(
            model,
            str(tmp_path / "backup"),
            steps_per_epoch=1,
            every=0,
            chief=True,
            scratch=str(tmp_path),
            strategy=tf.distribute.get_strategy(),
        )
        b.set_model(model)  # what fit does with its callbacks
        return b

    saved = backup(3)
    saved.step = 7
    saved.save()
    assert backup(3).restore() == 7  # the same model restores
    for other in (
        backup(5),
        backup(3, extra=True),
    ):  # a variable of another shape; a layer the backup lacks
        with pytest.raises(TrainingError, match="does not match this run's model.*--overwrite"):
            other.restore()


# -- real training: resume, refusal, crash safety --------------------------------------------------


class Crash(Exception):
    pass


def _crash_at(epoch):
    from tfopt.core._keras import keras

    class CrashAt(keras.callbacks.Callback):
        def on_epoch_begin(self, e, logs=None):
            if e == epoch:
                raise Crash(f"killed at epoch {e}")

    return CrashAt()


def _cfg(out, **train):
    return C.from_dict(
        {
            "data": DIGITS,
            "runtime": {"strategy": "mirrored"},
            "train": {
                "epochs": 3,
                "output_dir": str(out),
                "verbose": 0,
                "tensorboard": False,
                **train,
            },
        }
    )


@pytest.mark.slow
def test_resume_keeps_the_whole_history_and_refuses_another_config(tmp_path):
    from tfopt.train import run

    out = tmp_path / "run"
    with pytest.raises(Crash):
        run(_cfg(out), callbacks=[_crash_at(2)])
    assert not os.path.exists(out / "run.json")  # nothing committed
    work = str(out) + ".partial"
    first_rows = json.load(open(os.path.join(work, "metrics.json")))
    assert [r["epoch"] for r in first_rows] == [1, 2]
    with pytest.raises(ConfigError, match="train.learning_rate"):
        run(_cfg(out, learning_rate=0.01))
    record = run(_cfg(out))  # the same settings: resumes at epoch 3
    assert record.train["resumed"] and record.train["epochs"] == 3
    assert [r["epoch"] for r in record.history] == [1, 2, 3]
    assert record.history[:2] == first_rows
    assert len(record.train["epoch_seconds"]) == 3
    on_disk = json.load(open(out / "metrics.json"))
    assert on_disk == record.history and load_run(str(out)).record.history == record.history
    assert not os.path.exists(work) and not os.path.exists(out / "backup")
    # A re-run with the same -o never "resumes" the finished run.
    with pytest.raises(ConfigError, match="holds a finished run"):
        run(_cfg(out))


@pytest.mark.slow
def test_a_crashed_overwrite_leaves_the_previous_run_intact(tmp_path):
    from tfopt.train import run

    out = tmp_path / "run"
    first = run(_cfg(out, epochs=1))
    before = {
        name: open(out / name, "rb").read() for name in ("run.json", "metrics.json", "model.keras")
    }
    with pytest.raises(Crash):
        run(_cfg(out, epochs=2, learning_rate=0.002), overwrite=True, callbacks=[_crash_at(1)])
    assert {name: open(out / name, "rb").read() for name in before} == before
    assert load_run(str(out)).record.weights_sha256 == first.weights_sha256
    second = run(_cfg(out, epochs=2, learning_rate=0.002), overwrite=True)
    assert (
        second.train["epochs"] == 2
        and load_run(str(out)).record.weights_sha256 == second.weights_sha256
    )


def test_versions_reports_what_is_installed_and_keeps_bugs(monkeypatch):
    from tfopt.runtime import record

    assert record.versions()["tensorflow_model_optimization"].startswith("0.8")

    def broken(name):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(record, "version", broken)
    with pytest.raises(ZeroDivisionError):  # only "not installed" is swallowed
        record.versions()


@pytest.mark.slow
def test_runs_started_together_on_the_default_output_each_commit_their_own(tmp_path):
    """Three `tfopt.train` and a pipeline started at once in one directory: every run commits, none mixed."""
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    cmd = [
        sys.executable,
        "-m",
        "tfopt.train",
        "--dataset",
        "digits",
        "--strategy",
        "one_device",
        "--epochs",
        "1",
        "--batch-size",
        "64",
        "--set",
        "train.tensorboard=false",
        "--set",
        "train.verbose=0",
    ]
    pipeline = [
        sys.executable,
        "-m",
        "tfopt.pipeline",
        os.path.join(env["PYTHONPATH"], "pipelines", "mnist_edge.py"),
        "--variant",
        "smoke",
        "--strategy",
        "one_device",
        "--set",
        "compress.techniques=",
        "--set",
        "export.modes=float32",
        "--set",
        "probe.steps=0",
        "--set",
        "data.limit=512",
        "--no-report",
        "--quiet",
    ]
    procs = [
        subprocess.Popen(
            command,
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for command in ([*cmd, "--set", f"train.seed={seed}"] for seed in (1, 2, 3))
    ]
    procs.append(
        subprocess.Popen(
            pipeline,
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    )  # and a pipeline, in the same runs/
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], [err[-2000:] for _, err in outs]
    runs = tmp_path / "runs"
    names = sorted(
        n
        for n in os.listdir(runs)
        if not n.startswith(".") and n not in ("latest", "mnist_edge-smoke")
    )
    assert names == ["train", "train-2", "train-3"], names
    state = json.load(open(runs / "mnist_edge-smoke" / "pipeline.json"))
    assert (
        all(
            s["status"] == "done"
            and os.path.isfile(runs / "mnist_edge-smoke" / s["dir"] / "run.json")
            for s in state["stages"]
        )
        and len(state["stages"]) == 4
    )
    seeds = sorted(load_run(str(runs / n)).config.train.seed for n in names)
    assert seeds == [1, 2, 3]  # each run committed its own config and model
    for n in names:
        rec = load_run(str(runs / n)).record
        assert (
            rec.history
            and rec.metrics["test_accuracy"] > 0
            and rec.config["train"]["output_dir"].endswith(n)
        )
    newest = max(names, key=lambda n: os.path.getmtime(runs / n / "run.json"))
    assert os.readlink(runs / "latest") == newest
