"""The technique x strategy x precision matrix, run for real; docs/compatibility.md must say what it finds.

The test builds the document from the cells it ran and fails when the committed file differs
(the document holds only what every run must reproduce: outcomes and checks, no timings or
accuracies). Regenerate it with::

    TFOPT_WRITE_DOCS=1 .venv/bin/python -m pytest tests/test_optimize_matrix.py

In-process cells (one_device, mirrored on 2 logical CPUs) run every technique under float32,
mixed_bfloat16 (and mixed_float16 on one_device); multi_worker_mirrored runs as 2 real processes
and parameter_server as a real chief + 2 workers + 1 ps cluster, both through tfopt.launch.
All jobs start at once (they are mostly single-threaded tracing) and fine-tune a few steps each:
the figures say what happens, not how good a long fine-tuning gets (see bench/compression.py).
"""

import json
import os
import subprocess
import sys
import time

import pytest
from isolation import ISOLATED
from optimize_fixtures import tiny_run_dir

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(REPO, "docs", "compatibility.md")
ALL = (
    "prune",
    "prune_2of4",
    "qat",
    "cluster",
    "pqat",
    "cqat",
    "pcqat",
    "low_rank",
    "low_rank_qat",
    "channel_prune",
    "channel_prune_qat",
)
F16 = (
    "prune",
    "qat",
    "cluster",
    "low_rank",
    "channel_prune",
)  # mixed_float16 is for GPUs: a subset on the CPU
MWMS = (
    "prune",
    "qat",
    "pcqat",
    "low_rank",
    "channel_prune",
)  # pcqat: all three wrappers (prune, cluster, QAT)
PS = ("prune", "qat", "cluster", "low_rank", "channel_prune")
STEPS = 8
# A small learning rate: a few steps must not move a barely trained model far (accuracy is not the point here).
FLAGS = [
    "--steps-per-epoch",
    str(STEPS),
    "--epochs",
    "1",
    "--schedule",
    "polynomial",
    "--lr",
    "1e-4",
    "--set",
    "train.steps_per_execution=1",
]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    return tiny_run_dir(tmp_path_factory)


def _env():
    return dict(
        os.environ,
        PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
        PYTHONUNBUFFERED="1",
    )


def _start(cmd, log):
    return subprocess.Popen(
        cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=_env(), cwd=REPO
    )


def _launch_cmd(run_dir, out, report, strategy, techniques, *launch_args, flags=()):
    return [
        *ISOLATED,
        sys.executable,
        "-m",
        "tfopt.launch",
        *launch_args,
        "--timeout",
        "500",
        "--",
        sys.executable,
        "-m",
        "tfopt.optimize",
        "--from",
        run_dir,
        "--technique",
        ",".join(techniques),
        "--strategy",
        strategy,
        "--quiet",
        "--no-saved-model",
        "--no-tensorboard",
        "-o",
        out,
        "--report",
        report,
        *FLAGS,
        *flags,
    ]


# channel_prune under MWMS aims at a LiteRT latency, which only the chief measures (workers that
# timed their own tables would plan other widths). The target is far above any time this tiny
# model's float .tflite takes (about 10 us idle, a few times that loaded), so it cannot race the
# clock: the chief still times the table and the result and every worker gets its times (one
# all-reduce each), and the plan keeps every channel, the model meeting the target already. A
# target at the p50 this test measured failed under load: the chief's table, timed while the
# workers start, put the fastest widths' floor above it ("out of reach"; at 0.95x once, 13.7 us).
# What the table decides is checked without a clock in tests/test_channel_latency.py.
LATENCY_TARGET_US = 1e6
# Pruning under parameter servers follows a constant schedule: every mask update prunes to the
# target, whatever step the worker read. Under the polynomial schedule (the other cells') the
# last updates are steps 5 and 6 of 8, and asynchronous workers skip steps when the coordinator
# moves pruning's step counter ahead of them: 3 runs beside the loaded suite ended at 0.8, 0.8 and
# 0.796 (step 5's sparsity); one more skip ends at 0.770, below the check's 0.79, and the chief
# exits 1. 3 runs with the constant schedule ended at 0.8 each.
PS_FLAGS = ["--schedule", "constant"]
# Parameter servers shard every variable of 2 x 8 KiB or more over their 2 ps tasks: tiny_cnn's
# 79 KiB head kernel, which channel_prune keeps plain and sharded (low_rank makes it rank 1, 8 KiB:
# whole). tfmot's wrappers cannot hold a ShardedVariable, so the layers prune, cluster and QAT wrap
# keep their variables whole.
SHARD_MB = "0.0078125"  # 8 KiB


def _rows_from_report(path, strategy, precision="float32"):
    rows = []
    for r in json.load(open(path)):
        row = {
            "strategy": strategy,
            "precision": precision,
            "technique": r["technique"],
            "ok": r["ok"],
            "error": r.get("error", ""),
        }
        if r["ok"]:
            row.update(
                test_accuracy=r["test_accuracy"],
                source_accuracy=r["test_accuracy"] - r["accuracy_delta"],
                sparsity=r["sparsity"],
                clusters=r["clusters"],
                checks=r["checks"],
                notes=r["precision_notes"],
                replicas=r["strategy"]["num_replicas"],
                workers=r["strategy"]["num_workers"],
                sharded=sorted(
                    v["name"] for v in r["strategy"].get("variables", ()) if len(v["shards"]) > 1
                ),
            )
        rows.append(row)
    return rows


def _fmt(row):
    if not row["ok"]:
        return f"| {row['technique']} | {row['strategy']} | {row['precision']} | refused: {row['error']} | | |"
    checks = (
        ", ".join(f"{k} {'ok' if v else 'FAILED'}" for k, v in sorted(row["checks"].items())) or "-"
    )
    if row["strategy"] == "parameter_server":
        checks += "; sharded: " + (", ".join(row["sharded"]) or "none")
    # One decimal: what every run reproduces (the sparsity check holds each kernel within 0.01).
    return (
        f"| {row['technique']} | {row['strategy']} | {row['precision']} | ok | {row['sparsity']:.1f} | "
        f"{checks} |"
    )


def _doc(rows) -> str:
    from tfopt.core._keras import keras, tf

    import tensorflow_model_optimization as tfmot

    from tfopt.compress.techniques import MIXED_NOTES, TECHNIQUES

    order = {
        (s, p): i
        for i, (s, p) in enumerate(
            [
                (s, p)
                for s in ("one_device", "mirrored", "multi_worker_mirrored", "parameter_server")
                for p in ("float32", "mixed_bfloat16", "mixed_float16")
            ]
        )
    }
    rows = sorted(
        rows, key=lambda r: (ALL.index(r["technique"]), order[(r["strategy"], r["precision"])])
    )
    lines = [
        "# tfopt.optimize: technique x strategy x precision",
        "",
        "Checked by `tests/test_optimize_matrix.py` on every test run (regenerate with `TFOPT_WRITE_DOCS=1 "
        ".venv/bin/python -m pytest tests/test_optimize_matrix.py`; do not edit by hand): every row is a real "
        f"fine-tuning run of {STEPS} steps per phase (Adam 1e-4, cosine-decayed) on a tiny_cnn trained 2 epochs on "
        f"3,000 real MNIST images (TensorFlow {_minor(tf.__version__)}, tf_keras {_minor(keras.__version__)}, "
        f"tfmot {_minor(tfmot.__version__)}). The test also checks that fine-tuning keeps the gentle techniques' "
        "accuracy; sparsity and cluster counts are read back from the stripped weights (checks: each kernel's "
        "sparsity reaches the target, 2:4 groups hold, at most 16 values per clustered kernel, a factorized model's "
        "multiply-adds counted again meet its FLOPs budget, a channel-pruned model's widths read back are the plan's "
        "and meet its budget). "
        "mirrored = 2 replicas on 2 logical "
        "CPUs; multi_worker_mirrored = 2 worker processes (their final weights are checked identical); "
        "parameter_server = chief + 2 workers + 2 ps processes (asynchronous), every variable of 16 KiB or more "
        "sharded over both ps tasks (`--shard-variables 0.0078125`, 8 KiB shards at least; the checks column names "
        "the sharded variables). Every technique runs in-process "
        "under float32 and mixed_bfloat16; mixed_float16 (meant for GPUs) and the multi-process strategies run a "
        f"representative subset ({', '.join(F16)}; {', '.join(MWMS)}; {', '.join(PS)}) to keep the matrix "
        "affordable. No combination is refused: where tfmot alone fails, tfopt works around it (below).",
        "",
        "| technique | strategy | precision | result | sparsity | checks |",
        "|---|---|---|---|---|---|",
        *[_fmt(r) for r in rows],
        "",
        "## What tfopt does where tfmot alone fails",
        "",
        *[f"- **{kind}, mixed precision**: {note}." for kind, note in MIXED_NOTES.items()],
        "- **mixed_float16**: the optimizer gets dynamic loss scaling (`LossScaleOptimizer`) explicitly, since "
        "QAT models are built float32 while unquantized layers may compute in float16. On CPUs float16 math is "
        "slow; the cells prove correctness, GPUs bring the speed.",
        "- **QAT under any strategy** (a 'roadmap' item in tfmot's guides): the QAT model is built, compiled and "
        "fitted in `strategy.scope()`; its variables are copied by name into a strategy-free default-scheme QAT "
        "model for evaluation and saving.",
        "- **Saving QAT models**: tfmot 0.8.1 QAT models do not reload from `.keras` "
        "(`QuantizeLayer` builds twice, `QuantizeWrapperV2` saves duplicate weights); tfopt saves a copy whose "
        "layers save what a reload creates (load it with `tfopt.optimize.load_quantized_model` or inside "
        "`tfmot.quantization.keras.quantize_scope()`).",
        "- **Cluster-preserving QAT and Conv2D**: tfmot re-clusters a Conv2D per output channel when every "
        "channel uses about as many values; after cqat/pcqat the check counts Conv2D values per channel.",
        "- **parameter_server**: pruning's step counter is incremented by every worker without a lock, so "
        "schedules are approximate under asynchronous training; the sparsity check reads the result back.",
        "- **Sharded variables** (`--shard-variables`): tfmot's wrappers cannot hold a `ShardedVariable` (pruning "
        "updates its masks with the strategy's `extended.update`, which refuses one; QAT reads "
        "`kernel.get_shape()`, which it lacks). The layers prune, cluster and QAT wrap, and the wrappers' own "
        "variables, are built whole; the other layers' variables are sharded.",
        "",
        "Techniques: "
        + "; ".join(f"`{t.name}` = {t.description}" for t in TECHNIQUES.values())
        + ".",
        "",
    ]
    return "\n".join(lines)


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


@pytest.mark.slow
def test_matrix_matches_compatibility_doc(tiny_run, tmp_path):
    started = time.time()
    cells = [sys.executable, os.path.join(REPO, "tests", "optimize_matrix_cells.py"), tiny_run]
    jobs = {
        "one_device": _start(
            cells
            + [
                str(tmp_path / "a"),
                str(tmp_path / "a.json"),
                "one_device/float32,one_device/mixed_bfloat16,one_device/mixed_float16="
                + "+".join(F16),
                *FLAGS,
            ],
            tmp_path / "a.log",
        ),
        "mirrored": _start(
            cells
            + [
                str(tmp_path / "b"),
                str(tmp_path / "b.json"),
                "mirrored/float32,mirrored/mixed_bfloat16",
                *FLAGS,
            ],
            tmp_path / "b.log",
        ),
        "multi_worker_mirrored": _start(
            _launch_cmd(
                tiny_run,
                str(tmp_path / "c"),
                str(tmp_path / "c.json"),
                "multi_worker_mirrored",
                MWMS,
                "--workers",
                "2",
                flags=["--target-latency-us", str(LATENCY_TARGET_US)],
            ),
            tmp_path / "c.log",
        ),
        "parameter_server": _start(
            _launch_cmd(
                tiny_run,
                str(tmp_path / "d"),
                str(tmp_path / "d.json"),
                "parameter_server",
                PS,
                "--chief",
                "--workers",
                "2",
                "--ps",
                "2",
                flags=[*PS_FLAGS, "--shard-variables", SHARD_MB],
            ),
            tmp_path / "d.log",
        ),
    }
    codes = {name: proc.wait(timeout=900) for name, proc in jobs.items()}
    logs = {name: (tmp_path / f"{log}.log").read_text() for name, log in zip(jobs, "abcd")}
    assert codes == {name: 0 for name in jobs}, {n: logs[n][-3000:] for n, c in codes.items() if c}

    rows = json.load(open(tmp_path / "a.json")) + json.load(open(tmp_path / "b.json"))
    rows += _rows_from_report(tmp_path / "c.json", "multi_worker_mirrored")
    rows += _rows_from_report(tmp_path / "d.json", "parameter_server")
    print(f"matrix: {len(rows)} cells in {time.time() - started:.0f} s")

    assert len(rows) == len(ALL) * 4 + len(F16) + len(MWMS) + len(PS)
    refs = {
        r["technique"]: r["test_accuracy"]
        for r in rows
        if (r["strategy"], r["precision"]) == ("one_device", "float32") and r["ok"]
    }
    for row in rows:
        where = f"{row['technique']} / {row['strategy']} / {row['precision']}"
        assert row["ok"], (where, row["error"])
        assert all(row["checks"].values()), (
            where,
            row["checks"],
        )  # sparsity, 2:4 and clusters read back
        if row["technique"] in ("prune", "pqat", "pcqat"):
            assert abs(row["sparsity"] - 0.8) < 0.01, where
        if row["technique"] == "prune_2of4":
            assert 0.45 < row["sparsity"] <= 0.5, where
        if row["technique"] in ("cluster", "cqat", "pcqat"):
            assert row["clusters"], where
        if row["technique"].startswith("low_rank"):
            assert row["checks"]["flops"], (
                where
            )  # the factorized model's multiply-adds, counted again
        if row["technique"].startswith("channel_prune"):
            assert row["checks"]["channels"], (
                where
            )  # widths and multiply-adds read back from the result  # the checks above bound them: <= 16 per kernel (per channel after CQAT)
        # The accuracy bounds hold under parameter servers too: 8 Adam steps at lr 1e-4 move each
        # weight by about 1e-3 at most whatever the order and staleness of the gradients, so
        # asynchrony moves accuracy little. 6 runs of prune and cluster under parameter servers
        # beside the loaded suite: prune 0.673-0.681, cluster 0.760-0.768 (source 0.763).
        if row["technique"] in ("qat", "cluster", "cqat", "prune_2of4"):
            # Gentle techniques keep the source model's accuracy within a few points even after 8 steps.
            assert row["test_accuracy"] > row["source_accuracy"] - 0.05, (where, row)
        else:  # 80% one-shot-ish pruning in 8 steps: held to the same technique in one process
            ref = refs[row["technique"]]
            assert row["test_accuracy"] >= ref - 0.2, (where, row, ref)
        assert (row["precision"] != "float32") == bool(row["notes"]), where
        if row["strategy"] == "parameter_server":  # plain layers sharded, tfmot-wrapped ones whole
            assert bool(row["sharded"]) == (row["technique"] == "channel_prune"), row
    # Multi-worker replicas end with identical weights, technique by technique.
    digests = {}
    for line in logs["multi_worker_mirrored"].splitlines():
        for marker in ("tfopt optimize: done ", "tfopt optimize: worker done "):
            if marker in line:
                info = json.loads(line.split(marker, 1)[1])
                digests.setdefault(info["technique"], set()).add(info["weights_sha256"])
    assert set(digests) == set(MWMS) and all(len(d) == 1 for d in digests.values()), digests
    assert logs["multi_worker_mirrored"].count("worker done") == len(MWMS)
    # ... channel_prune under MWMS: the chief timed the table and the result, every worker finished
    # the same plan (the digests above); the target, far above both, leaves every channel.
    phase = json.load(open(tmp_path / "c" / "channel_prune" / "run.json"))["optimize"]["phases"][0]
    pruned, table = phase["latency"], phase["iterations"][0]["latency"]["table"]
    assert pruned["target_us"] == LATENCY_TARGET_US and pruned["measured_us"] > 0, pruned
    assert 0 < pruned["predicted_us"] == pruned["before_us"] == table["base_us"] < LATENCY_TARGET_US
    assert set(table["layers"]) == set(phase["widths"]) and not phase["layers"], phase
    doc = _doc(rows)
    assert doc.count("| ok |") == len(rows) and "| cqat | mirrored | mixed_bfloat16 | ok |" in doc
    if os.environ.get("TFOPT_WRITE_DOCS") == "1":
        from tfopt.core.fileio import write_text

        write_text(DOC, doc)
    assert open(DOC, encoding="utf-8").read() == doc, (
        "docs/compatibility.md is out of date; regenerate it: "
        "TFOPT_WRITE_DOCS=1 .venv/bin/python -m pytest tests/test_optimize_matrix.py"
    )
