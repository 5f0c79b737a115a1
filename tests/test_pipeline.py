"""The end-to-end runner: configs, stage fingerprints, resume at the first unfinished stage."""

import json
import os
import re
import subprocess
import sys

import pytest
from isolation import launch_isolates

from tfopt.core.errors import ConfigError
from tfopt.pipeline import apply_overrides, load_pipeline, plan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MNIST_EDGE = os.path.join(ROOT, "pipelines", "mnist_edge.py")


def _prints(cfg):
    return {s.name: s.fingerprint for s in plan(cfg)}


def test_every_pipeline_file_gives_a_valid_config_for_every_variant():
    import importlib.util

    for name in sorted(os.listdir(os.path.join(ROOT, "pipelines"))):
        if name.endswith(".py"):
            path = os.path.join(ROOT, "pipelines", name)
            spec = importlib.util.spec_from_file_location(name[:-3], path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            for variant in module.VARIANTS:
                cfg = load_pipeline(path, variant)
                assert cfg.name == name[:-3]
                assert [s.name for s in plan(cfg)][:2] == ["teacher", "student"]


def test_a_changed_setting_reruns_that_stage_and_the_stages_after_it_only():
    cfg = load_pipeline(MNIST_EDGE, "smoke")
    base = _prints(cfg)
    # none changes a result: what a run fingerprints (tfopt.runs.result_config) decides
    same = ["train.verbose=2", "select=acc_drop<=1", "train.backup_every=4", "data.verify=true"]
    assert _prints(apply_overrides(cfg, same)) == base

    def changed(*overrides):
        new = _prints(apply_overrides(cfg, list(overrides)))
        return sorted(n for n in base if new[n] != base[n])

    assert changed("export.runs=10") == ["student-export", "student-pqat-export", "teacher-export"]
    assert changed("export.calibration_steps=8") == [
        "student-export",
        "student-pqat-export",
        "teacher-export",
    ]
    assert changed("student.alpha=0.5") == [
        "student",
        "student-export",
        "student-pqat",
        "student-pqat-export",
    ]
    assert changed("compress.sparsity=0.6") == ["student-pqat", "student-pqat-export"]
    assert changed("teacher.epochs=2") == sorted(base)
    assert changed("data.limit=512") == sorted(base)


def test_overrides_and_their_errors():
    cfg = load_pipeline(MNIST_EDGE, "smoke")
    two = apply_overrides(
        cfg, ["compress.techniques=pqat,prune_2of4", "export.threads=1,2", "teacher.epochs=2"]
    )
    assert two.compress.techniques == ("pqat", "prune_2of4") and two.export.threads == (1, 2)
    names = [s.name for s in plan(two)]
    assert "student-prune_2of4-export" in names
    modes = {s.name: s.settings["export"]["modes"] for s in plan(two) if s.kind == "export"}
    assert modes["student-pqat-export"] == "int8"  # a QAT model converts to int8 only
    assert modes["student-prune_2of4-export"] == ",".join(cfg.export.modes)
    low = apply_overrides(cfg, ["compress.techniques=low_rank,low_rank_qat", "compress.flops=0.4"])
    stages = {s.name: s for s in plan(low)}
    assert stages["student-low_rank"].settings["run"]["optimize"]["low_rank_flops"] == 0.4
    assert [
        stages[f"student-{t}-export"].settings["export"]["modes"]
        for t in ("low_rank", "low_rank_qat")
    ] == [",".join(cfg.export.modes), "int8"]  # a QAT result converts to int8 only
    both = ["compress.techniques=pqat,low_rank"]
    before = {s.name: s.fingerprint for s in plan(apply_overrides(cfg, both))}
    after = {
        s.name: s.fingerprint for s in plan(apply_overrides(cfg, [*both, "compress.flops=0.4"]))
    }
    assert after["student-low_rank"] != before["student-low_rank"]
    assert after["student-pqat"] == before["student-pqat"]  # it reads no multiply-add target
    assert [s.name for s in plan(apply_overrides(cfg, ["compress.techniques="]))] == [
        "teacher",
        "student",
        "teacher-export",
        "student-export",
    ]
    for bad, message in [
        (
            ["teacher.epoch=2"],
            r"unknown key teacher.epoch; valid keys in 'teacher': model, args, epochs, learning_rate",
        ),
        (
            ["compress.techniques=pqat,magic"],
            r"compress.techniques='pqat,magic' is not valid; give distinct names from",
        ),
        (["teacher.model=resnet"], r"unknown model 'resnet'; choose one of"),
        (["export.modes=int4"], r"int4"),
        (["student.alpha=2"], r"student.alpha=2.0 in \[0, 1\]"),
        (["teacher.epochs=two"], r"teacher.epochs='two' is not an int"),
        (["nonsense"], r"override 'nonsense' is not of the form section.key=value"),
        (["stages.x=1"], r"unknown pipeline section 'stages'; valid sections:"),
        (["export.calibration_steps=0"], r"export.calibration_steps=0 must be >= 1"),
        (
            ["launch.isolate=true"],
            r"launch.isolate='true' is not valid; choose one of auto, on, off",
        ),
        (["compress.flops=0"], r"compress.flops=0.0 must be in \(0, 1\]"),
        (
            ["compress.techniques=channel_prune", "compress.sparsity=0.6"],
            r"^compress.sparsity is not used by compress.techniques='channel_prune' \(it belongs "
            r"to prune, pqat, pcqat\); add one of them to compress.techniques, or drop",
        ),
        (
            ["compress.flops=0.4"],
            r"^compress.flops is not used by compress.techniques='pqat' \(it belongs to low_rank, "
            r"low_rank_qat, channel_prune, channel_prune_qat\)",
        ),
    ]:
        with pytest.raises(ConfigError, match=message):
            apply_overrides(cfg, bad)
    from tfopt.pipeline.runner import launch_command

    launches = {
        mode: launch_command(apply_overrides(cfg, [f"launch.isolate={mode}"]), plan(cfg)[0], "r")
        for mode in ("auto", "on", "off")
    }
    assert [c[c.index("--") - 1] for c in launches.values()] == ["2", "--isolate", "--no-isolate"]
    with pytest.raises(
        ConfigError,
        match=r"--variant 'huge' is not one of .*mnist_edge.py's variants: default, smoke",
    ):
        load_pipeline(MNIST_EDGE, "huge")
    with pytest.raises(ConfigError, match=r"pipeline 'nope.py': no such file"):
        load_pipeline("nope.py")


@pytest.mark.slow
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path):
    not_ours = tmp_path / "mine"
    not_ours.mkdir()
    (not_ours / "notes.txt").write_text("keep me")
    for args, message in [
        (["pipelines/nope.py"], "pipeline 'pipelines/nope.py': no such file"),
        ([MNIST_EDGE, "--set", "teacher.epochs=0"], "teacher.epochs=0 must be >= 1"),
        (
            [MNIST_EDGE, "--variant", "smoke", "-o", str(not_ours)],
            "is a non-empty directory without pipeline.json",
        ),
    ]:
        result = subprocess.run(
            [sys.executable, "-m", "tfopt.pipeline", *args],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
        )
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().splitlines() == [
            f"tfopt pipeline: error: {result.stderr.split('error: ', 1)[1].strip()}"
        ]
        assert message in result.stderr
    assert os.listdir(not_ours) == ["notes.txt"]


@pytest.mark.slow
def test_a_stopped_pipeline_resumes_at_its_unfinished_stage(pipeline_run):
    stopped, resumed, changed = pipeline_run["logs"]
    assert pipeline_run["codes"] == [143, 0, 0], stopped[-2000:] + resumed[-2000:] + changed[-2000:]
    assert "stopped by SIGTERM at step" in stopped
    assert "teacher (train): finished earlier with the same settings, kept" in resumed
    step = int(re.search(r"resuming at step (\d+)", resumed).group(1))
    assert step >= 4  # the student went on from its backup, not from scratch
    assert "student (distill): running" in resumed
    kept = re.findall(r"\] \d+/\d+ (\S+) \(\w+\): finished earlier", changed)
    ran = re.findall(r"\] \d+/\d+ (\S+) \(\w+\): running", changed)
    assert kept == ["teacher", "student", "student-pqat"] and ran == [
        "teacher-export",
        "student-export",
        "student-pqat-export",
    ]
    state = json.load(open(os.path.join(pipeline_run["run"], "pipeline.json")))
    assert [s["status"] for s in state["stages"]] == ["done"] * 6
    assert {s["name"] for s in state["stages"]} <= set(os.listdir(pipeline_run["run"]))
    records = {
        n: json.load(open(os.path.join(pipeline_run["run"], n, "run.json")))
        for n in ("teacher", "student")
    }
    assert (
        records["student"]["train"]["resumed"]
        and records["student"]["train"]["resumed_from_step"] == step
    )
    assert not records["teacher"]["train"]["resumed"]
    compressed = json.load(open(os.path.join(pipeline_run["run"], "student-pqat", "run.json")))[
        "optimize"
    ]
    assert compressed["checks"]["sparsity"]["ok"], compressed[
        "checks"
    ]  # pruned to compress.sparsity
    export = json.load(open(os.path.join(pipeline_run["run"], "teacher-export", "run.json")))
    assert export["export"]["settings"]["bench"]["runs"] == 10
    assert (
        0 <= state["probe"]["input_bound_fraction"] <= 1
        and state["probe"]["input_examples_per_sec"] > 0
    )


@pytest.mark.slow
def test_multi_worker_training_stages_run_under_the_launcher(tmp_path):
    """Under multi_worker_mirrored each training stage is a tfopt.launch process group of 2 workers."""
    run = tmp_path / "mwms"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tfopt.pipeline",
            MNIST_EDGE,
            "--variant",
            "smoke",
            "--strategy",
            "multi_worker_mirrored",
            "--set",
            "compress.techniques=",
            "--set",
            "export.modes=float32",
            "--set",
            "probe.steps=0",
            "--no-report",
            "--quiet",
            "-o",
            str(run),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # the launcher keeps each stage off the network where the kernel allows it; if not, the chief says so once
    exposed = result.stdout.count("warning: TensorFlow's servers of this job listen on port(s)")
    assert exposed == (0 if launch_isolates() else 2), result.stdout[-3000:]
    for stage in ("teacher", "student"):
        record = json.load(open(run / stage / "run.json"))
        assert (
            record["strategy"]["name"] == "multi_worker_mirrored"
            and record["strategy"]["num_workers"] == 2
        )
    # both workers trained the same weights (the launcher's tasks each print their digest)
    digests = re.findall(
        r"\[worker:(\d)\] tfopt train: done \{\"task\": \"worker:\d\", \"weights_sha256\": \"(\w+)\"",
        result.stdout,
    )
    assert sorted(w for w, _ in digests) == ["0", "1"] and len({d for _, d in digests}) == 1
    assert (
        json.load(open(run / "teacher-export" / "run.json"))["export"]["modes"][0]["mode"]
        == "float32"
    )


def test_a_kill_mid_run_keeps_the_done_marks_of_stages_it_does_not_change(tmp_path, monkeypatch):
    from tfopt.core import stage as stage_lib
    from tfopt.pipeline import runner

    ran = []

    class Recording:  # commits a run the way a stage does; "kills" at one stage
        trains = False

        def __init__(self, name):
            self.name = name

        def check(self, options):
            pass

        def run(self, cfg, inputs, out_dir, *, options=None, overwrite=False):
            name = os.path.basename(out_dir)
            if name == crash_at:
                raise KeyboardInterrupt
            ran.append(name)
            assert stages[name].kind == self.name
            assert [os.path.basename(i) for i in inputs] == list(stages[name].inputs)
            assert options == stages[name].options and cfg.train.output_dir == out_dir
            os.makedirs(out_dir, exist_ok=True)
            with open(os.path.join(out_dir, "run.json"), "w") as f:
                json.dump({"stage": self.name}, f)

    monkeypatch.setattr(stage_lib, "_REGISTERED", {})  # the pipeline finds them by name
    for kind in stage_lib.BUILTIN:
        stage_lib.register(Recording(kind))
    cfg = apply_overrides(load_pipeline(MNIST_EDGE, "smoke"), ["probe.steps=0"])
    out = str(tmp_path / "run")
    crash_at = None
    stages = {s.name: s for s in plan(cfg)}
    runner.run_pipeline(cfg, out, report=False)
    order = [s.name for s in plan(cfg)]
    assert ran == order and order.index("student-pqat") < order.index("student-export")
    changed = apply_overrides(cfg, ["compress.sparsity=0.6"])  # student-pqat and its export only
    stages = {s.name: s for s in plan(changed)}
    crash_at = "student-pqat"
    with pytest.raises(KeyboardInterrupt):
        runner.run_pipeline(changed, out, report=False)
    status = {
        s["name"]: s["status"]
        for s in json.load(open(os.path.join(out, "pipeline.json")))["stages"]
    }
    assert status == {
        n: "pending" if n in ("student-pqat", "student-pqat-export") else "done" for n in order
    }
    ran.clear()
    crash_at = None
    runner.run_pipeline(changed, out, report=False)
    assert ran == ["student-pqat", "student-pqat-export"]
