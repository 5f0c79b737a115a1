"""``python -m tfopt.optimize`` end to end on a real run: outputs, export-readiness, one-line errors."""

import json
import os

import numpy as np
import pytest
from optimize_fixtures import tiny_run_dir

from tfopt.optimize.cli import main


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    return tiny_run_dir(tmp_path_factory)


def _one_line_error(capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and err[0].startswith("tfopt optimize: error: "), err
    return err[0]


@pytest.mark.slow
def test_iterative_taylor_channel_pruning_reaches_its_target_step_by_step(tiny_run, tmp_path):
    out = tmp_path / "cp"
    assert (
        main(
            [
                "--from",
                tiny_run,
                "--technique",
                "channel_prune",
                "--channels-flops",
                "0.5",
                "--importance",
                "taylor",
                "--taylor-batches",
                "2",
                "--prune-iterations",
                "2",
                "--epochs",
                "1",
                "--steps-per-epoch",
                "3",
                "--strategy",
                "one_device",
                "--quiet",
                "--no-saved-model",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    section = json.load(open(out / "run.json"))["optimize"]
    phase = section["phases"][0]
    steps = phase["iterations"]
    assert len(steps) == 2 and phase["epochs"] == 2 and phase["steps"] == 6  # each step fine-tuned
    assert (
        steps[0]["macs_before"]
        == phase["macs_before"]
        > steps[0]["macs_after"]
        == steps[1]["macs_before"]
    )
    assert (
        steps[0]["macs_after"] <= 0.75 * phase["macs_before"]
    )  # halfway to the target after the first step
    assert phase["macs_after"] == steps[1]["macs_after"] <= 0.5 * phase["macs_before"]
    assert (
        section["checks"]["channels"]["ok"] and section["channel_prune"]["importance"] == "taylor"
    )
    assert phase["widths"]["conv0"][1] < phase["widths"]["conv0"][0] == 12


@pytest.mark.slow
def test_bad_input_gets_one_line_and_exit_2(tiny_run, tmp_path, capsys):
    out = str(tmp_path / "out")
    _one_line_error(
        capsys,
        ["--from", str(tmp_path / "nope"), "--technique", "prune"],
        "is not a tfopt run directory",
    )
    _one_line_error(
        capsys,
        ["--from", tiny_run, "--technique", "magic"],
        "technique 'magic' is not valid; choose one of prune, prune_2of4, qat, cluster, pqat, cqat, pcqat",
    )
    _one_line_error(
        capsys, ["--from", tiny_run, "--technique", "prune", "-o", tiny_run], "is the input;"
    )
    _one_line_error(
        capsys,
        ["--from", tiny_run, "--technique", "prune", "--sparsity", "1.2", "-o", out],
        "sparsity=1.2 must be in [0, 1)",
    )
    with pytest.raises(SystemExit) as e:  # a choice list is argparse's: a usage error
        main(["--from", tiny_run, "--technique", "cluster", "--centroid-init", "best", "-o", out])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1, err
    assert "--centroid-init: invalid choice: 'best' (choose from 'kmeans_plus_plus'" in err[0]
    _one_line_error(
        capsys,
        ["--from", tiny_run, "--technique", "cluster", "--set", "optimize.centroid_init=best"],
        "optimize.centroid_init='best' is not valid; choose one of kmeans_plus_plus, density",
    )
    _one_line_error(
        capsys,
        ["--from", tiny_run, "--technique", "prune", "--strategy", "tpu", "-o", out],
        "runtime.strategy='tpu' is not valid",
    )
    _one_line_error(
        capsys,
        [
            "--from",
            tiny_run,
            "--technique",
            "prune",
            "--layers",
            "conv9",
            "--strategy",
            "one_device",
            "--steps-per-epoch",
            "1",
            "-o",
            out,
        ],
        "layer 'conv9' is not in model",
    )
    _one_line_error(
        capsys,
        [
            "--from",
            tiny_run,
            "--technique",
            "prune",
            "--policy",
            "xnnpack",
            "--strategy",
            "one_device",
            "--steps-per-epoch",
            "1",
            "-o",
            out,
        ],
        "pruning policy 'xnnpack' does not fit",
    )
    _one_line_error(
        capsys,
        ["--from", tiny_run, "--technique", "prune", "--block-size", "4", "-o", out],
        "optimize.block_size='4' is not ROWS,COLS; e.g. --block-size 4,1",
    )
    _one_line_error(
        capsys,
        [
            "--from",
            tiny_run,
            "--technique",
            "prune_2of4",
            "--block-size",
            "4,1",
            "--strategy",
            "one_device",
            "-o",
            out,
        ],
        "--block-size is not used by prune_2of4 (it belongs to prune, pqat, pcqat); "
        "prune_2of4 takes --policy",
    )
    _one_line_error(
        capsys,
        [
            "--from",
            tiny_run,
            "--technique",
            "channel_prune",
            "--channels-flops",
            "0.01",
            "--strategy",
            "one_device",
            "--steps-per-epoch",
            "1",
            "-o",
            out,
        ],
        "channel-pruning FLOPs target 0.01 of the model is out of reach",
    )
    _one_line_error(
        capsys,
        [
            "--from",
            tiny_run,
            "--technique",
            "channel_prune",
            "--target-latency-us",
            "0.01",
            "--strategy",
            "one_device",
            "--steps-per-epoch",
            "1",
            "-o",
            out,
        ],
        "channel-pruning latency target 0.01 us is out of reach",
    )
    _one_line_error(
        capsys,
        [
            "--from",
            tiny_run,
            "--technique",
            "channel_prune",
            "--target-latency-us",
            "50",
            "--channels-ratio",
            "0.3",
            "-o",
            out,
        ],
        "cannot be combined with ratio=0.3",
    )
    _one_line_error(
        capsys,
        [
            "--from",
            tiny_run,
            "--technique",
            "low_rank",
            "--low-rank-flops",
            "0.01",
            "--strategy",
            "one_device",
            "--steps-per-epoch",
            "1",
            "-o",
            out,
        ],
        "low-rank FLOPs budget 0.01 of the model is out of reach",
    )
    assert not os.path.exists(out)  # nothing written for a mistake


def test_inspect_lists_every_layer(tiny_run, capsys):
    assert main(["--from", tiny_run, "--inspect"]) == 0
    text = capsys.readouterr().out
    assert "model 'tiny_cnn': what each technique can do with each layer" in text
    for line in ("conv0", "pool0", "flatten", "logits"):
        assert any(row.startswith(line + " ") for row in text.splitlines()), line


@pytest.mark.slow
def test_prune_mirrored_writes_a_new_run_ready_for_export(tiny_run, tmp_path, capsys):
    out = tmp_path / "pruned"
    before = (sorted(os.listdir(tiny_run)), open(os.path.join(tiny_run, "run.json")).read())
    argv = [
        "--from",
        tiny_run,
        "--technique",
        "prune",
        "--sparsity",
        "0.8",
        "--strategy",
        "mirrored",
        "--steps-per-epoch",
        "12",
        "--quiet",
        "-o",
        str(out),
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert (
        "tfopt optimize: done " in printed and "sparsity" in printed.splitlines()[0]
    )  # the per-layer table
    run = json.load(open(out / "run.json"))
    assert run["strategy"] == {
        "name": "mirrored",
        "class": "MirroredStrategy",
        "num_replicas": 2,
        "num_workers": 1,
        "precision": "float32",
    }
    assert run["optimize"]["checks"]["sparsity"]["ok"] and run["optimize"][
        "sparsity"
    ] == pytest.approx(0.8, abs=0.01)
    assert run["optimize"]["gzip_ratio"] > 2.0  # 80% zeros compress
    assert run["optimize"]["source"]["run"] == os.path.abspath(tiny_run)
    assert run["optimize"]["accuracy_delta"] == pytest.approx(
        run["metrics"]["test_accuracy"] - run["optimize"]["source"]["test_accuracy"], abs=1e-4
    )
    assert sorted(os.listdir(out)) == [
        "config.yaml",
        "layers.json",
        "layers.txt",
        "model.keras",
        "run.json",
        "saved_model",
        "tensorboard",
    ]
    events = [
        f
        for _, _, files in os.walk(out / "tensorboard")
        for f in files
        if f.startswith("events.out")
    ]
    assert events, "no pruning summaries"
    # The next stage reads it like any run; the sparsity is in the saved weights themselves.
    from tfopt.models.io import load_model
    from tfopt.runs import load_run

    model = load_model(load_run(str(out)).model_path)
    kernel = model.get_layer("logits").kernel.numpy()
    assert (kernel == 0).mean() == pytest.approx(0.8, abs=0.01)
    from tfopt.export.evaluate import load_split

    x, y = load_split(
        load_run(str(out)).config.data, "test"
    )  # an independent evaluation of the saved model
    acc = float(np.mean(np.argmax(model.predict(x, verbose=0), -1) == y))
    assert acc == pytest.approx(run["metrics"]["test_accuracy"], abs=1e-3)
    assert (
        acc > run["optimize"]["source"]["test_accuracy"] - 0.15
    )  # 80% zeros after 36 steps keep most of it
    assert (
        sorted(os.listdir(tiny_run)),
        open(os.path.join(tiny_run, "run.json")).read(),
    ) == before  # input intact


@pytest.mark.slow
def test_pqat_bfloat16_survives_int8_tflite_conversion(tiny_run, tmp_path, capsys):
    out = tmp_path / "pqat"
    assert (
        main(
            [
                "--from",
                tiny_run,
                "--technique",
                "pqat",
                "--precision",
                "mixed_bfloat16",
                "--strategy",
                "one_device",
                "--steps-per-epoch",
                "12",
                "--quiet",
                "--no-saved-model",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    run = json.load(open(out / "run.json"))
    assert (
        run["strategy"]["precision"] == "mixed_bfloat16"
        and len(run["optimize"]["precision_notes"]) == 2
    )
    phases = run["optimize"]["phases"]
    assert [p["phase"] for p in phases] == ["prune", "qat"] and phases[1][
        "scheme"
    ] == "prune_preserve"
    assert (
        phases[0]["compute_dtypes"]["pool0"] == "bfloat16"
    )  # unwrapped layers keep the mixed policy
    # The next stage: `python -m tfopt.export` converts the saved QAT model from its learned ranges.
    from ai_edge_litert.interpreter import Interpreter

    from tfopt.export.cli import main as export_main

    exp = tmp_path / "exp"
    assert (
        export_main(
            [
                "--from",
                str(out),
                "--modes",
                "int8",
                "--eval-limit",
                "300",
                "--runs",
                "5",
                "--warmup",
                "1",
                "--threads",
                "1",
                "--no-plot",
                "-o",
                str(exp),
            ]
        )
        == 0
    )
    record = json.load(open(exp / "run.json"))["export"]
    row = record["modes"][0]
    assert row["qat"] and row["eval"]["agreement"] >= 0.97, row["eval"]
    assert abs(row["eval"]["accuracy"] - row["eval"]["keras_accuracy"]) <= 0.02, row[
        "eval"
    ]  # int8 = its QAT model
    interpreter = Interpreter(model_path=str(exp / "model_int8.tflite"))
    interpreter.allocate_tensors()
    int8_weights = [
        interpreter.get_tensor(d["index"])
        for d in interpreter.get_tensor_details()
        if d["dtype"] == np.int8 and len(d["shape"]) == 2 and d["shape"][0] == 10
    ]
    assert int8_weights, "no int8 logits kernel in the TFLite model"
    assert (int8_weights[0] == 0).mean() >= 0.79  # pruning survived QAT and int8 conversion


@pytest.mark.slow
def test_cluster_summaries_under_several_steps_per_execution(tiny_run, tmp_path, capsys):
    # tfmot's own ClusteringSummaries asserts on its step count when steps_per_execution > 1.
    out = tmp_path / "clustered"
    assert (
        main(
            [
                "--from",
                tiny_run,
                "--technique",
                "cluster",
                "--clusters",
                "8",
                "--epochs",
                "2",
                "--steps-per-epoch",
                "6",
                "--set",
                "train.steps_per_execution=3",
                "--strategy",
                "one_device",
                "--quiet",
                "--no-saved-model",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    run = json.load(open(out / "run.json"))
    assert (
        run["optimize"]["checks"]["clusters"]["ok"]
        and max(run["optimize"]["clusters"].values()) <= 8
    )
    events = [
        f
        for _, _, files in os.walk(out / "tensorboard")
        for f in files
        if f.startswith("events.out")
    ]
    assert events, "no clustering summaries"


@pytest.mark.slow
def test_pruning_an_optimize_run_reaches_its_target_and_a_missed_target_exits_1(
    tiny_run, tmp_path, capsys
):
    # An optimize run as the input: its split sizes come from the data itself (mask updates every
    # few steps of this 3,000-image slice), not from a 50,000-record guess that left them unpruned.
    clustered = tmp_path / "clustered"
    common = ["--strategy", "one_device", "--quiet", "--no-saved-model", "--no-tensorboard"]
    assert main(["--from", tiny_run, "--technique", "cluster", *common, "-o", str(clustered)]) == 0
    pruned = tmp_path / "pruned"
    assert (
        main(
            [
                "--from",
                str(clustered),
                "--technique",
                "prune",
                "--sparsity",
                "0.8",
                *common,
                "-o",
                str(pruned),
            ]
        )
        == 0
    )
    run = json.load(open(pruned / "run.json"))
    assert run["data"]["splits"]["train"] == 3000
    assert run["optimize"]["sparsity"] == pytest.approx(0.8, abs=0.01), run["optimize"]["phases"]
    assert run["optimize"]["prune"]["frequency"] == 46 * 3 // 20
    capsys.readouterr()
    # A schedule that ends after the phase never reaches the target: the check fails, exit code 1.
    missed = tmp_path / "missed"
    assert (
        main(
            [
                "--from",
                tiny_run,
                "--technique",
                "prune",
                "--sparsity",
                "0.8",
                "--steps-per-epoch",
                "4",
                "--epochs",
                "1",
                "--end-step",
                "400",
                *common,
                "-o",
                str(missed),
            ]
        )
        == 1
    )
    assert "check failed: prune: sparsity" in capsys.readouterr().err
    assert not json.load(open(missed / "run.json"))["optimize"]["checks"]["sparsity"]["ok"]
