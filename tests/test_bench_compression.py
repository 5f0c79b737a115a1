"""Keeps benchmark B4 (bench/compression.py) runnable and its JSON honest: its --smoke mode end to end.

Not a performance test: it checks that the script runs, that the selection used the validation
split only and follows its rule, that every figure is recomputable from the recorded byte
counts and accuracies, and that each verdict follows from its number; never what the ratios are.
"""

import json
import operator
import os
import statistics
import subprocess
import sys

import pytest
from bench_checks import committed
from optimize_fixtures import tiny_run_dir

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FINAL = (
    "control_float",
    "pruned_int8",
    "clustered_int8",
    "clustered_linear_int8",
    "pcqat_int8",
    "peer_pruning",
    "peer_clustering",
)
OPS = {">=": operator.ge, "<=": operator.le}


def expected_choice(candidates: list[dict], bar: float) -> int:
    """The selection rule, restated: best validation accuracy among those reaching the bar, else the best ratio."""
    passing = [i for i, c in enumerate(candidates) if c["ratio"] >= bar]
    if not passing:
        return max(range(len(candidates)), key=lambda i: (candidates[i]["ratio"], -i))
    best = max(candidates[i]["val_accuracy"] for i in passing)
    tied = [i for i in passing if candidates[i]["val_accuracy"] == best]
    return min(tied, key=lambda i: (candidates[i]["recipe"]["epochs"], i))


@pytest.mark.slow
@pytest.mark.bench
def test_compression_benchmark_smoke(tmp_path, tmp_path_factory):
    out = tmp_path / "compression.json"
    env = dict(
        os.environ,
        PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "bench", "compression.py"),
            "--smoke",
            "--from",
            tiny_run_dir(tmp_path_factory),
            "--workdir",
            str(tmp_path / "work"),
            "--out",
            str(out),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert (
        "Selection (validation split)" in proc.stdout
        and "accuracy loss vs the float control" in proc.stdout
    )

    res = json.loads(out.read_text())
    assert (
        res["params"]["smoke"] is True
        and res["params"]["repeats"] == 1
        and len(res["repeats"]) == 1
    )
    check_result(res)
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]


def check_result(res: dict) -> None:
    """Everything a B4 result must get right whatever its figures (a smoke run's or a full run's)."""
    assert res["id"] == "B4" and res["lscpu"]["flags"] and res["environment"]["tensorflow"]
    base, repeats = res["base"], res["repeats"]
    assert len(repeats) == res["params"]["repeats"]
    fgz, facc = base["float"]["gzip_bytes"], base["float"]["test_accuracy"]
    # int8 weights are ~4x smaller than float32: physics, not tuning
    assert base["int8"]["bytes"] < base["float"]["bytes"] / 3

    # The recipe was chosen on the validation split, by the stated rule, before any test read.
    sel = res["selection"]
    assert sel["split"] == "validation" and len(sel["candidates"]) >= 2
    for c in sel["candidates"]:
        assert not any("test" in key for key in c), c
        assert 0.0 < c["val_accuracy"] <= 1.0 and c["ratio"] == pytest.approx(
            fgz / c["gzip_bytes"], rel=1e-3
        )
    assert sel["chosen"] == expected_choice(sel["candidates"], 12.0)
    assert sel["recipe"] == sel["candidates"][sel["chosen"]]["recipe"]
    assert repeats[0]["recipe"] == sel["recipe"]["name"]

    for r in repeats:
        for name in FINAL:
            row = r[name]
            assert 0.0 < row["test_accuracy"] <= 1.0 and row["gzip_bytes"] < row["bytes"], name
            assert row["ratio"] == pytest.approx(fgz / row["gzip_bytes"], rel=1e-3), name
            assert 0.0 < row["largest_buffer_entropy_bits"] <= 8.0, name
        # 80% zeros compress better than none; the control is a float model of the float's size
        assert r["pruned_int8"]["gzip_bytes"] < base["int8"]["gzip_bytes"]
        assert r["control_float"]["bytes"] == pytest.approx(base["float"]["bytes"], rel=0.01)
        assert r["peer_pruning"]["sparsity"] == pytest.approx(
            0.8, abs=0.01
        )  # the tutorial's final sparsity
        assert r["peer_clustering"]["unique_max"] <= 16

    # Every figure follows from the recorded numbers.
    figs = {f["name"].split(",")[0] + ("/" + f["unit"]): f for f in res["figures"]}
    ratio, loss = figs["pruned 80% + int8 PTQ/x"], figs["pruned 80% + int8 PTQ/pt"]
    assert ratio["values"] == pytest.approx([fgz / r["pruned_int8"]["gzip_bytes"] for r in repeats])
    assert loss["values"] == pytest.approx(
        [
            100 * (r["control_float"]["test_accuracy"] - r["pruned_int8"]["test_accuracy"])
            for r in repeats
        ],
        abs=1e-3,
    )
    linear = figs["(info) clustered 16 with --centroid-init linear (the tutorial's) + int8 PTQ/x"]
    assert linear["values"] == pytest.approx(
        [fgz / r["clustered_linear_int8"]["gzip_bytes"] for r in repeats]
    )
    info = figs["(info) pruned 80% + int8 PTQ/pt"]
    assert info["values"] == pytest.approx(
        [100 * (facc - r["pruned_int8"]["test_accuracy"]) for r in repeats], abs=1e-3
    )
    assert figs["clustered 16 + int8 PTQ/x"]["values"] == pytest.approx(
        [fgz / r["clustered_int8"]["gzip_bytes"] for r in repeats]
    )
    assert figs["pruned 80% + clustered 16 + PCQAT int8/x"]["values"] == pytest.approx(
        [fgz / r["pcqat_int8"]["gzip_bytes"] for r in repeats]
    )
    # the peer's ratio is the median over the repeats (a smoke run's single repeat)
    peer = statistics.median(fgz / r["peer_pruning"]["gzip_bytes"] for r in repeats)
    assert f"tfmot pruning tutorial {peer:.2f}x" in ratio["peer"] and ratio["anchor"]
    assert (ratio["op"], ratio["bound"], loss["op"], loss["bound"]) == (">=", 12.0, "<=", 0.3)
    for f in res["figures"]:
        if f["op"] is None:
            assert f["status"] == "-", f
        else:
            assert f["status"] == ("pass" if OPS[f["op"]](f["value"], f["bound"]) else "MISS"), f


def test_the_committed_compression_result_holds_together():
    check_result(committed("compression"))


@pytest.mark.slow
def test_largest_buffer_entropy_counts_the_biggest_kernels_bytes():
    """1 bit for a kernel whose int8 bytes take two values equally often, 0 for one value: the
    number follows the biggest buffer's byte histogram, not the file's."""
    from tfopt.core._keras import keras, tf

    import numpy as np

    from bench.compression import largest_buffer_entropy

    def converted(kernel):
        model = keras.Sequential([keras.layers.Dense(64, input_shape=(256,))])
        model.layers[0].set_weights([kernel.astype(np.float32), np.zeros(64, np.float32)])
        converter = tf.lite.TFLiteConverter.from_keras_model(model)
        converter.optimizations = [
            tf.lite.Optimize.DEFAULT
        ]  # dynamic range: int8 kernel, +-127 per channel
        return converter.convert()

    signs = np.where(np.arange(256 * 64).reshape(256, 64) % 2 == 0, 0.5, -0.5)
    assert largest_buffer_entropy(converted(signs)) == pytest.approx(1.0)
    assert largest_buffer_entropy(converted(np.full((256, 64), 0.5))) == pytest.approx(0.0)
