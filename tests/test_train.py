"""Short training on a slice of real MNIST under every strategy, plus the CLI's handling of bad input."""

import json
import os
import subprocess
import sys

import pytest
from isolation import ISOLATED

from tfopt import config as C
from tfopt.train import run as train

SLICE = {"dataset": "mnist", "limit": 3000, "global_batch_size": 64, "num_shards": 4}


def _cfg(out, strategy, **train_kw):
    # 2 epochs (92 steps): after 1 epoch the accuracy of this CNN still moves by several points
    # with the data order alone, too much to compare strategies.
    return C.from_dict(
        {
            "data": SLICE,
            "runtime": {"strategy": strategy},
            "train": {"epochs": 2, "output_dir": str(out), "verbose": 0, **train_kw},
        }
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """one_device, 2 epochs on the slice: what every other strategy is compared with."""
    out = tmp_path_factory.mktemp("reference") / "run"
    run = train(_cfg(out, "one_device")).to_dict()
    assert run == json.load(open(out / "run.json"))
    assert run["versions"]["tf_keras"].startswith("2.")
    return _check_run(out, "one_device", 1)


def _check_run(run_dir, strategy, replicas, reference=None, tolerance=0.05):
    run = json.load(open(os.path.join(run_dir, "run.json")))
    assert run["strategy"]["name"] == strategy and run["strategy"]["num_replicas"] == replicas
    assert run["data"]["splits"] == {"train": 3000, "validation": 3000, "test": 3000}
    if reference is not None:  # the same examples and steps as the one_device reference
        acc, ref = run["metrics"]["test_accuracy"], reference["metrics"]["test_accuracy"]
        assert acc >= ref - tolerance, f"{strategy}: {acc:.4f} vs one_device {ref:.4f}"
    assert run["train"]["examples_per_sec"] > 0
    assert len(run["history"]) == run["train"]["epochs"] == run["config"]["train"]["epochs"]
    for name in ("model.keras", "saved_model", "metrics.csv", "metrics.json", "tensorboard"):
        assert os.path.exists(os.path.join(run_dir, name)), name
    assert not [f for f in os.listdir(run_dir) if f.startswith(".tmp")]
    return run


@pytest.mark.slow
def test_mirrored_in_process_matches_one_device(tmp_path, reference):
    run = train(_cfg(tmp_path / "run", "mirrored")).to_dict()
    assert run == json.load(open(tmp_path / "run" / "run.json"))
    _check_run(tmp_path / "run", "mirrored", 2, reference)


def _launch(tmp_path, strategy, *launch_args, timeout=300, epochs=2, quiet=True):
    cmd = [
        *ISOLATED,
        sys.executable,
        "-m",
        "tfopt.launch",
        *launch_args,
        "--timeout",
        "240",
        "--",
        sys.executable,
        "-m",
        "tfopt.train",
        "--strategy",
        strategy,
        "--limit",
        "3000",
        "--batch-size",
        "64",
        "--epochs",
        str(epochs),
        *(["--quiet"] if quiet else []),
        "-o",
        str(tmp_path / "run"),
        "--set",
        "data.num_shards=4",
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _done_lines(out):
    return [
        json.loads(line.split("tfopt train: done ", 1)[1])
        for line in out.splitlines()
        if "tfopt train: done " in line
    ]


@pytest.mark.slow
def test_multi_worker_mirrored_two_real_processes(tmp_path, reference):
    proc = _launch(tmp_path, "multi_worker_mirrored", "--workers", "2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    done = _done_lines(proc.stdout + proc.stderr)
    assert sorted(d["task"] for d in done) == ["worker:0", "worker:1"]
    assert done[0]["weights_sha256"] == done[1]["weights_sha256"]
    run = _check_run(tmp_path / "run", "multi_worker_mirrored", 2, reference)
    assert run["strategy"]["num_workers"] == 2
    # Only the chief writes: no worker scratch left behind in the run directory.
    assert not [p for p, _, _ in os.walk(tmp_path / "run") if "workertemp" in p]


@pytest.mark.slow
def test_parameter_server_workers_read_disjoint_batches():
    # The dataset function is traced once on the chief; tfopt gives every worker its own shard
    # and seed (before, both workers read the same stream and each batch was applied twice).
    script = os.path.join(os.path.dirname(__file__), "ps_batches.py")
    cmd = [
        *ISOLATED,
        sys.executable,
        "-m",
        "tfopt.launch",
        "--chief",
        "--workers",
        "2",
        "--ps",
        "1",
        "--timeout",
        "240",
        "--",
        sys.executable,
        script,
        "12",
    ]
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(__file__))},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if "ps_batches " in ln)
    result = json.loads(line.split("ps_batches ", 1)[1])
    batches = result["batches"]
    examples = [e for b in batches for e in b]
    assert len(batches) == 12 and len(examples) == 12 * 32
    # 12 x 32 = 384 examples of the ~1,257 training records: within one pass of each worker's
    # shard, no example may come twice.
    assert len(set(map(tuple, batches))) == len(batches), "two closures read the same batch"
    assert len(set(examples)) == len(examples), (
        f"{len(examples) - len(set(examples))} examples read twice"
    )


@pytest.mark.slow
def test_parameter_server_real_cluster(tmp_path, reference):
    # With progress on: Keras refuses its per-step bar under parameter servers; tfopt prints per epoch.
    proc = _launch(
        tmp_path, "parameter_server", "--chief", "--workers", "2", "--ps", "1", quiet=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[chief:0] 46/46 - " in proc.stdout and "val_accuracy" in proc.stdout, proc.stdout[
        -2000:
    ]
    # What asynchrony cannot break: the coordinator runs every planned step once and each applies
    # one update to the variables on the ps, whatever their order and staleness (2 x 46 steps).
    run = _check_run(tmp_path / "run", "parameter_server", 1)
    steps = run["train"]["optimizer_steps"]
    assert steps == 2 * run["train"]["steps_per_epoch"] == 92, run["train"]
    # And that the cluster learned: far above chance (10 classes; 3,000 test examples put an
    # untrained model within 0.12), with no at-chance warning from tfopt.runtime.quality. Not a
    # share of the one_device reference: stale updates cost the dense head a share no bound
    # holds under load. Runs of this test's cluster (reference 0.887): 5 beside the loaded suite
    # 0.98x-0.99x; 6 beside two more busy loops 0.81x-1.0x (lowest 0.716); inside the full suite
    # on 2 cores 0.65x and 0.73x, and on a loaded CI machine below the 0.5x this test asked.
    # 0.3 asks only that it learned: 2.4x below the lowest accuracy seen, 2.5x above chance.
    acc, ref = run["metrics"]["test_accuracy"], reference["metrics"]["test_accuracy"]
    print(f"parameter_server: test accuracy {acc:.4f}, {acc / ref:.2f}x one_device's {ref:.4f}")
    assert acc >= 0.3 and not [w for w in run["warnings"] if "chance" in w], (acc, run["warnings"])
    assert run["strategy"]["num_workers"] == 2
    assert run["strategy"]["class"] == "ParameterServerStrategyV2"


def _cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "tfopt.train", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    "args, env, needle",
    [
        (["--strategy", "tpu"], None, "'tpu' is not valid; choose one of one_device, mirrored"),
        (["--epochs", "many"], None, "invalid int value: 'many'"),
        (["--model", "resnet9000", "--limit", "64"], None, "unknown model 'resnet9000'"),
        (["--config", "nope.yaml"], None, "config file 'nope.yaml' does not exist"),
        (["--strategy", "multi_worker_mirrored"], {"TF_CONFIG": "{not json"}, "TF_CONFIG"),
        (["--dataset", "imagenet42"], None, "imagenet42"),
    ],
)
@pytest.mark.slow
def test_cli_bad_input_one_line_exit_2(tmp_path, args, env, needle):
    proc = _cli(*args, "-o", str(tmp_path / "run"), env=env)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


def test_print_config_resolves_file_then_flags():
    proc = _cli(
        "--config",
        "pipelines/mnist_cnn.yaml",
        "--precision",
        "mixed_bfloat16",
        "--set",
        "train.epochs=9",
        "--print-config",
    )
    assert proc.returncode == 0, proc.stderr
    cfg = json.loads(proc.stdout)
    assert cfg["runtime"]["precision"] == "mixed_bfloat16" and cfg["train"]["epochs"] == 9
    assert cfg["train"]["output_dir"] == "runs/mnist_cnn"


@pytest.mark.slow
def test_a_runs_config_yaml_makes_the_same_run_again(tmp_path):
    """Every run directory holds config.yaml; --config takes it back and, under --deterministic,
    reproduces the weights bit for bit (the settings come from the file, not from flags)."""
    first = tmp_path / "first"
    flags = ["--dataset", "digits", "--model", "mlp", "--epochs", "1", "--batch-size", "32"]
    proc = _cli(
        *flags,
        "--strategy",
        "one_device",
        "--deterministic",
        "--set",
        "train.seed=7",
        "-o",
        str(first),
        "--quiet",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (first / "config.yaml").read_text()
    assert text.startswith("# The resolved config of this train run.") and "seed: 7" in text
    again = _cli("--config", str(first / "config.yaml"), "-o", str(tmp_path / "again"), "--quiet")
    assert again.returncode == 0, again.stderr[-3000:]
    records = [json.load(open(tmp_path / d / "run.json")) for d in ("first", "again")]
    assert (
        records[1]["config"]["train"]["seed"] == 7
        and records[1]["config"]["runtime"]["deterministic"]
    )
    assert records[0]["weights_sha256"] == records[1]["weights_sha256"]
    # the control: the same command without the file's settings (seed 42) trains other weights
    other = _cli(
        *flags,
        "--strategy",
        "one_device",
        "--deterministic",
        "-o",
        str(tmp_path / "other"),
        "--quiet",
    )
    assert other.returncode == 0, other.stderr[-3000:]
    assert (
        json.load(open(tmp_path / "other" / "run.json"))["weights_sha256"]
        != records[0]["weights_sha256"]
    )
