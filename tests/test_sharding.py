"""Variables sharded over parameter servers (tfopt.runtime.sharding): partitioners, refusals, and real
clusters that resume across shardings with bit-identical weights and export the same .tflite."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from isolation import ISOLATED

from tfopt import config
from tfopt.config import RuntimeConfig, cli
from tfopt.core.errors import ConfigError
from tfopt.runtime import sharding

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20
WIDE = (784, 2048)  # wide_mlp's first kernel: 6.125 MiB of float32


def _rt(**kw):
    return RuntimeConfig(strategy="parameter_server", **kw)


def test_no_partitioner_by_default():
    assert sharding.partitioner(_rt(), num_ps=2) is None


def test_min_size_shards_the_large_kernel_over_the_ps_tasks_and_leaves_small_ones_whole():
    part = sharding.partitioner(_rt(variable_partitioner="min_size", min_shard_bytes=MIB), num_ps=2)
    assert part(WIDE, "float32") == [2, 1]
    assert part((2048,), "float32") == [1]  # 8 KiB: below one shard's minimum
    assert part(WIDE, "float32") == [2, 1]
    with sharding.kept_whole():  # what tfmot's wrappers get
        assert part(WIDE, "float32") == [1, 1]
    assert part(WIDE, "float32") == [2, 1]
    # max_shards below the ps count caps the shards; above it, refused in one line.
    capped = sharding.partitioner(
        _rt(variable_partitioner="min_size", min_shard_bytes=1024, max_shards=2), num_ps=3
    )
    assert capped(WIDE, "float32") == [2, 1]
    with pytest.raises(ConfigError) as e:
        sharding.partitioner(_rt(variable_partitioner="min_size", max_shards=3), num_ps=2)
    assert str(e.value).startswith("runtime.max_shards=3 is more than the 2 ps task(s)")
    assert "\n" not in str(e.value)


def test_max_size_refuses_a_variable_that_needs_more_shards_than_ps_tasks():
    part = sharding.partitioner(
        _rt(variable_partitioner="max_size", max_shard_bytes=4 * MIB), num_ps=2
    )
    assert part(WIDE, "float32") == [2, 1]  # two shards of 392 rows (3.06 MiB each)
    part = sharding.partitioner(_rt(variable_partitioner="max_size", max_shard_bytes=MIB), num_ps=2)
    with pytest.raises(ConfigError) as e:
        part(WIDE, "float32")
    # 1 MiB holds 128 rows of 8 KiB: 784 rows need 7 shards; 2 shards need 392 rows = 3.06 MiB.
    assert str(e.value) == (
        "runtime.max_shard_bytes=1048576: a variable of shape (784, 2048) (6.12 MiB) needs 7 "
        "shards of at most 1 MiB, more than the 2 that runtime.max_shards allows; raise "
        "runtime.max_shard_bytes to at least 3.06 MiB, or add ps tasks"
    )


def test_sharding_under_another_strategy_is_refused_in_one_line():
    with pytest.raises(ConfigError) as e:
        config.from_dict({"runtime": {"strategy": "mirrored", "variable_partitioner": "min_size"}})
    msg = str(e.value)
    assert "\n" not in msg and "'min_size'" in msg and "strategy is 'mirrored'" in msg
    assert "use --strategy parameter_server" in msg
    with pytest.raises(ConfigError, match="choose one of none, min_size, max_size"):
        config.from_dict({"runtime": {"variable_partitioner": "fixed"}})
    with pytest.raises(ConfigError, match=r"runtime.min_shard_bytes=0 must be >= 1"):
        config.from_dict({"runtime": {"min_shard_bytes": 0}})


def test_shard_variables_flag():
    from tfopt.optimize import cli as optimize_cli
    from tfopt.train import cli as train_cli

    args = train_cli.build_parser().parse_args(
        ["--strategy", "parameter_server", "--shard-variables", "0.5"]
    )
    runtime = cli.config_from_args(args).runtime
    assert (runtime.variable_partitioner, runtime.min_shard_bytes) == ("min_size", MIB // 2)
    args = optimize_cli.build_parser().parse_args(
        ["--from", "runs/x", "--technique", "prune", "--shard-variables", "2"]
    )
    assert cli.shard_variables(args) == {
        "variable_partitioner": "min_size",
        "min_shard_bytes": 2 * MIB,
    }
    with pytest.raises(ConfigError, match=r"^--shard-variables 0: give the smallest shard size"):
        cli.shard_variables(train_cli.build_parser().parse_args(["--shard-variables", "0"]))


def test_train_main_refuses_shard_variables_without_parameter_servers(capsys):
    from tfopt.train import cli as train_cli

    assert train_cli.main(["--strategy", "mirrored", "--shard-variables", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "tfopt train: error: runtime.variable_partitioner"
    ), err


def test_sharding_settings_are_not_part_of_the_fingerprint():
    # A backup restores into any sharding, so a resumed run may change it.
    from tfopt.runtime.job import result_config

    a = config.from_dict({"runtime": {"strategy": "parameter_server"}})
    b = config.from_dict(
        {
            "runtime": {
                "strategy": "parameter_server",
                "variable_partitioner": "max_size",
                "max_shard_bytes": 4 * MIB,
                "max_shards": 2,
            }
        }
    )
    assert result_config(a) == result_config(b)


# ---- real clusters: chief + 1 worker + 2 ps, wide_mlp ----

STEPS = 30  # per epoch, 2 epochs; backups every 5 steps


def _train_cmd(out, *extra):
    launch = "-m tfopt.launch --chief --workers 1 --ps 2 --timeout 400 --".split()
    train = (
        "-m tfopt.train --strategy parameter_server --model wide_mlp --epochs 2 --limit 2000 "
        f"--steps-per-epoch {STEPS} --backup-every 5 --deterministic --quiet "
        "--set train.tensorboard=false"
    ).split()
    return [*ISOLATED, sys.executable, *launch, sys.executable, *train, "-o", str(out), *extra]


def _done(text):
    for line in text.splitlines():
        if "[chief:0] tfopt train: done " in line:
            return json.loads(line.split("tfopt train: done ", 1)[1])
    raise AssertionError(f"no done line in:\n{text[-3000:]}")


def _train(out, *extra):
    r = subprocess.run(
        _train_cmd(out, *extra), capture_output=True, text=True, timeout=500, cwd=REPO
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return r.stdout


def _preempted_then_resumed(out, first, second):
    """Trains with ``first`` flags, SIGTERM after the backup of step 15, resumes with ``second``."""
    proc = subprocess.Popen(
        _train_cmd(out, *first),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
    )
    state = os.path.join(f"{out}.partial", "backup", "0", "checkpoint")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        m = os.path.exists(state) and re.search(r'ckpt-(\d+)"', open(state).read())
        if m and int(m.group(1)) >= 15:
            break
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)  # the launcher passes it on: a backup at the next step
    proc.communicate(timeout=120)
    assert proc.returncode == 143
    log = _train(out, *second)
    resumed = int(re.search(r"resuming at step (\d+)", log).group(1))
    assert 15 <= resumed < 2 * STEPS, resumed
    return _done(log), resumed


def _table(out):
    return {
        v["name"]: v
        for v in json.load(open(os.path.join(out, "run.json")))["strategy"]["variables"]
    }


@pytest.mark.slow
def test_sharded_parameter_servers_resume_across_shardings_bit_identically(tmp_path):
    if not ISOLATED:
        pytest.skip(
            "needs a private network namespace (root): the tasks' servers would listen on all interfaces"
        )
    shard = ("--shard-variables", "1")
    whole = _done(_train(tmp_path / "whole"))
    sharded = _done(_train(tmp_path / "sharded", *shard))
    # The 6.1 MiB kernel is split over both ps tasks; the small variables stay whole.
    table = _table(tmp_path / "sharded")
    assert table["wide/kernel"]["shape"] == list(WIDE)
    assert [(s["shape"], s["task"]) for s in table["wide/kernel"]["shards"]] == [
        ([392, 2048], "ps:0"),
        ([392, 2048], "ps:1"),
    ]
    assert all(len(v["shards"]) == 1 for n, v in table.items() if n != "wide/kernel")
    assert all(len(v["shards"]) == 1 for v in _table(tmp_path / "whole").values())
    # Whole -> sharded: the backup's full tensors are split over the ps tasks, and training on
    # shards computes what training on the whole kernel does: the uninterrupted whole run's weights.
    x, at_x = _preempted_then_resumed(tmp_path / "to-sharded", (), shard)
    assert _table(tmp_path / "to-sharded")["wide/kernel"]["shards"][1]["task"] == "ps:1"
    # Sharded -> whole: the backup's slices are joined; the uninterrupted sharded run's weights.
    y, at_y = _preempted_then_resumed(tmp_path / "to-whole", shard, ())
    print(
        f"\nsharded parameter servers: whole -> sharded resumed at step {at_x}, sharded -> whole at "
        f"step {at_y}; weights equal to the uninterrupted runs"
    )
    assert x["weights_sha256"] == whole["weights_sha256"]
    assert y["weights_sha256"] == sharded["weights_sha256"]
    # (Sharded variables are initialized shard by shard: their run differs from the whole one.)
    assert sharded["weights_sha256"] != whole["weights_sha256"]
    # The sharded run exports the .tflite its weights give unsharded, byte for byte.
    tflites = []
    for run in ("sharded", "to-whole"):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "tfopt.export",
                "--from",
                str(tmp_path / run),
                "--modes",
                "float32",
                "--strip-strings",
                "--quiet",
                "-o",
                str(tmp_path / f"{run}-export"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=REPO,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        tflites.append(open(tmp_path / f"{run}-export" / "model_float32.tflite", "rb").read())
    assert _without_metadata(tflites[0]) == _without_metadata(tflites[1])

    # A teacher loaded from a file keeps its whole variables (they load); the student is sharded.
    launch = "-m tfopt.launch --chief --workers 1 --ps 2 --timeout 300 --".split()
    distill = (
        f"-m tfopt.distill --teacher {tmp_path / 'whole'} --student wide_mlp --strategy "
        "parameter_server --shard-variables 1 --epochs 1 --steps-per-epoch 5 --limit 2000 --quiet"
    ).split()
    out = tmp_path / "distilled"
    r = subprocess.run(
        [*ISOLATED, sys.executable, *launch, sys.executable, *distill, "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=REPO,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    variables = json.load(open(out / "run.json"))["strategy"]["variables"]
    # The teacher's and the student's layers share names: the table lists both.
    assert [len(v["shards"]) for v in variables if v["name"] == "wide/kernel"] in ([1, 2], [2, 1])
    assert [v["name"] for v in variables if len(v["shards"]) > 1] == ["wide/kernel"], variables


def _without_metadata(content: bytes) -> bytes:
    """The flatbuffer a runtime computes with: the TFLite Metadata (whose version names the run it
    was exported from) and the packed files left out."""
    from tfopt.core._compat import read_tflite_model, write_tflite_model

    model = read_tflite_model(content)
    for entry in model.metadata or []:
        if entry.name in (b"TFLITE_METADATA", "TFLITE_METADATA"):
            model.buffers[entry.buffer].data = None
    model.metadata = [
        m for m in model.metadata or [] if m.name not in (b"TFLITE_METADATA", "TFLITE_METADATA")
    ]
    return write_tflite_model(model)
