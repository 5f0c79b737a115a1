"""The pipeline report: the selection rule and its one-line errors, the choice and every rejection's
reason, the Pareto frontier against brute force, B8, and report.md / report.json / report.html /
HParams built from a small synthetic pipeline run directory (records written by hand)."""

import json
import os
import random
import re

import pytest

from tfopt.core.errors import ConfigError
from tfopt.core.fileio import write_json
from tfopt.export import ops, roofline
from tfopt.report import pareto, targets
from tfopt.report.collect import Variant, collect
from tfopt.report.select import KEYS, choose, parse_rule

# --- the rule -------------------------------------------------------------------------------------


def test_rule_parses_every_key_and_operator():
    rule = ",".join(
        f"{k}{op}{i}.5" for i, (k, op) in enumerate(zip(KEYS, ["<=", "<", ">=", ">"] * 3))
    )
    constraints = parse_rule(rule)
    assert [c.key for c in constraints] == list(KEYS)
    assert [c.op for c in constraints[:4]] == ["<=", "<", ">=", ">"]
    assert constraints[1].value == 1.5
    assert parse_rule(" acc_drop <= 0.5 , p50_us<50 ")[1].value == 50.0
    assert parse_rule("") == [] and parse_rule(None) == []
    assert str(parse_rule("gzip_kb<=1e2")[0]) == "gzip_kb<=100"


@pytest.mark.parametrize(
    "rule, token",
    [
        ("acc_drop=0.5", "'acc_drop=0.5'"),
        ("accuracy>=99", "unknown key 'accuracy'"),
        ("acc_drop<=0.5,p50<=50", "'p50<=50'"),
        ("p50_us<=fast", "'p50_us<=fast'"),
        ("acc_drop<=0.5,", "empty constraint"),
        ("acc_drop<=0.5,,p50_us<=9", "empty constraint"),
        ("<=5", "'<=5'"),
    ],
)
def test_bad_rule_is_one_line_naming_the_token_keys_operators_and_an_example(rule, token):
    with pytest.raises(ConfigError) as e:
        parse_rule(rule)
    message = str(e.value)
    assert "\n" not in message and token in message
    assert "valid keys: acc (%), acc_drop (pt)" in message and "p50_us_2t" in message
    assert (
        "operators: <=, >=, <, >" in message
        and "example: --select 'acc_drop<=0.5,p50_us<=50,min:gzip_kb'" in message
    )


# --- the choice -----------------------------------------------------------------------------------


def _v(name, acc=99.0, gzip=100_000, p50=50.0, keras=False, **kw):
    model, fmt = name.split("/")
    return Variant(
        name=name,
        model=model,
        format=fmt,
        accuracy_pct=acc,
        delta_pt=acc - 99.0,
        agreement_pct=None if keras else 99.5,
        size_bytes=880_000 if gzip is None else gzip + 1000,
        gzip_bytes=None if keras else gzip,
        p50_us=p50,
        **kw,
    )


VARIANTS = [
    _v("teacher/keras", 99.0, None, 500.0, keras=True),
    _v("teacher/float32", 99.0, 800_000, 120.0),
    _v("teacher/int8", 98.9, 200_000, 90.0),
    _v("student/float32", 98.7, 80_000, 20.0),
    _v("student/int8", 98.0, 20_000, 40.0),  # loses 1 pt
    _v("student-pqat/int8", 98.6, 15_000, 60.0),  # smallest that keeps the accuracy, but slow
    _v("student-pqat/dynamic", 98.6, 15_000, 30.0),  # same size, faster: wins the tie
]


def test_choice_is_the_smallest_gzip_passing_every_constraint_and_every_other_variant_has_a_reason():
    sel = choose(VARIANTS, "acc_drop<=0.5")
    assert (
        sel.chosen == "student-pqat/dynamic"
    )  # tie on gzip size with student-pqat/int8: lower p50
    assert sel.passing == [
        "student-pqat/dynamic",
        "student-pqat/int8",
        "student/float32",
        "teacher/int8",
        "teacher/float32",
    ]
    assert set(sel.rejected) == {v.name for v in VARIANTS} - {"student-pqat/dynamic"}
    assert sel.rejected["student/int8"] == "fails acc_drop<=0.5: acc_drop is 1.00 pt"
    assert "same gzip -9 size and a higher p50" in sel.rejected["student-pqat/int8"]
    assert sel.rejected["teacher/float32"] == (
        "passes but its gzip -9 size is higher than the chosen one's (781.25 KiB vs 14.65 KiB)"
    )
    assert "Keras model" in sel.rejected["teacher/keras"]
    assert "student-pqat/dynamic is chosen" in sel.statement and "'acc_drop<=0.5'" in sel.statement

    fast = choose(VARIANTS, "acc_drop<=0.5,p50_us<=25")
    assert fast.chosen == "student/float32"
    assert fast.rejected["student-pqat/dynamic"] == "fails p50_us<=25: p50_us is 30.00 us"
    assert (
        fast.rejected["teacher/int8"] == "fails p50_us<=25: p50_us is 90.00 us"
    )  # the first failing constraint

    assert choose(VARIANTS, None).chosen == "student-pqat/dynamic"  # no rule: smallest of all

    fastest = choose(VARIANTS, "acc_drop<=0.5,min:p50_us")
    assert fastest.chosen == "student/float32" and fastest.objective == "min:p50_us"
    assert fastest.rejected["student-pqat/dynamic"] == (
        "passes but its p50 latency at 1 thread is higher than the "
        "chosen one's (30.00 us vs 20.00 us)"
    )
    assert "the lowest p50 latency at 1 thread (20.00 us)" in fastest.statement
    assert choose(VARIANTS, "max:acc").chosen == "teacher/float32"
    for bad in ("min:speed", "fast:p50_us", "min:acc,max:acc"):
        with pytest.raises(ConfigError, match="objective|objectives"):
            choose(VARIANTS, bad)


def test_latencies_within_five_percent_of_the_best_tie_and_the_smallest_of_them_wins():
    variants = [
        _v("teacher/keras", 99.0, None, 500.0, keras=True),
        _v("student/float32", 98.6, 53_900, 28.4),
        _v("student/dynamic", 98.6, 14_800, 29.2),  # 2.8% slower: a tie, 3.6x smaller
        _v("student/int8", 98.6, 14_900, 29.8),  # 4.9%: a tie too, but larger than dynamic
        _v("student-pqat/int8", 98.6, 11_300, 29.9),
    ]  # 5.3%: slower, though the smallest
    sel = choose(variants, "acc_drop<=0.5,min:p50_us")
    assert sel.chosen == "student/dynamic"
    assert sel.passing == [
        "student/dynamic",
        "student/float32",
        "student/int8",
        "student-pqat/int8",
    ]
    assert sel.rejected["student/float32"] == (
        "passes and its p50 latency at 1 thread (28.40 us) ties with the chosen "
        "one's (29.20 us: within 5%), but its gzip -9 size is larger "
        "(52.6 KiB vs 14.5 KiB)"
    )
    assert "ties with" in sel.rejected["student/int8"]
    assert sel.rejected["student-pqat/int8"] == (
        "passes but its p50 latency at 1 thread is higher than the chosen "
        "one's (29.90 us vs 29.20 us)"
    )
    assert sel.statement.startswith(
        "student/dynamic is chosen: its p50 latency at 1 thread (29.20 us) ties with the "
        "lowest (28.40 us, student/float32; within 5%"
    )
    assert "smallest of the 3 tied" in sel.statement
    # a size objective has no tolerance: the smallest wins outright
    assert choose(variants, "acc_drop<=0.5").chosen == "student-pqat/int8"


def test_no_passing_variant_is_a_statement_not_a_crash():
    sel = choose(VARIANTS, "acc>=99.5")
    assert sel.chosen is None and sel.passing == []
    assert (
        "No .tflite variant satisfies the rule 'acc>=99.5'" in sel.statement
        and "nothing is chosen" in sel.statement
    )
    assert sel.rejected["student/int8"] == "fails acc>=99.5: acc is 98.00 %"
    unmeasured = choose(VARIANTS, "p50_us_2t<=100")
    assert unmeasured.chosen is None
    assert unmeasured.rejected["teacher/int8"] == "fails p50_us_2t<=100: p50_us_2t not measured"
    assert choose([], "acc>=1").chosen is None


# --- Pareto ---------------------------------------------------------------------------------------


def _brute_force(points):
    def dominated(p):
        return any(q[1] <= p[1] and q[2] >= p[2] and (q[1] < p[1] or q[2] > p[2]) for q in points)

    return {p[0] for p in points if not dominated(p)}


def test_pareto_frontier_matches_brute_force_including_ties():
    rng = random.Random(0)
    for trial in range(300):
        n = rng.randint(0, 12)
        # few distinct values: many equal costs, equal accuracies and exact duplicates
        points = [(i, float(rng.randint(1, 6)), float(rng.randint(90, 95))) for i in range(n)]
        got = pareto.frontier(points)
        assert set(got) == _brute_force(points), (trial, points, got)
        assert len(got) == len(set(got))
        costs = [dict((p[0], p[1]) for p in points)[k] for k in got]
        assert costs == sorted(costs)


def test_variant_frontier_uses_only_measured_tflite_variants():
    front = pareto.variant_frontier(VARIANTS + [_v("x/int8", 99.9, None, 1.0)], "gzip_bytes")
    assert front == [
        "student-pqat/int8",
        "student-pqat/dynamic",
        "student/float32",
        "teacher/int8",
        "teacher/float32",
    ]
    assert pareto.variant_frontier(VARIANTS, "p50_us") == [
        "student/float32",
        "teacher/int8",
        "teacher/float32",
    ]


def test_b8_ratios_and_verdicts():
    teacher = _v("teacher/keras", 99.0, None, 500.0, keras=True)
    teacher.size_bytes = 880_000
    chosen = _v("student/int8", 98.7, 20_000, 40.0)
    chosen.size_bytes = 22_000
    b8 = targets.b8(teacher, chosen)
    size, speed, loss = b8["rows"]
    assert size["value"] == pytest.approx(40.0) and size["status"] == "PASS"
    assert speed["value"] == pytest.approx(12.5) and speed["status"] == "PASS"
    assert loss["value"] == pytest.approx(0.3) and loss["status"] == "PASS" and b8["passed"] is True
    chosen.p50_us = 60.0
    assert (
        targets.b8(teacher, chosen)["rows"][1]["status"] == "MISS"
        and targets.b8(teacher, chosen)["passed"] is False
    )
    nothing = targets.b8(teacher, None)
    assert [r["status"] for r in nothing["rows"]] == ["n/a"] * 3 and nothing["passed"] is None


def test_a_model_at_chance_or_a_failed_gate_is_never_a_met_target():
    from tfopt.report import content

    teacher = _v("teacher/keras", 8.6, None, 5000.0, keras=True)
    teacher.size_bytes = 880_000
    teacher.notes.append("warning: test accuracy 8.6% is at chance (10.0% for 10 classes): ...")
    chosen = _v("student/int8", 8.4, 20_000, 40.0, file="/runs/x/student-export/model_int8.tflite")
    chosen.size_bytes = 22_000
    b8 = targets.b8(teacher, chosen)  # every ratio would pass: 40x smaller, 125x faster, 0.2 pt
    assert [r["status"] for r in b8["rows"]] == ["not judged"] * 3 and b8["passed"] is False
    assert b8["trouble"] == ["the teacher `teacher/keras` is at chance (8.6% test accuracy)"]
    report = {
        "selection": {
            "chosen": chosen.name,
            "rule": "",
            "passing": [chosen.name],
            "objective": "min:gzip_kb",
        },
        "b8": b8,
        "variants": [teacher.to_dict(), chosen.to_dict()],
        "baseline": teacher.name,
        "stages": [],
        "strategy": "one_device",
    }
    text = " ".join(" ".join(map(str, b.get("items", []))) for b in content._summary(report))
    assert "Not ready to ship: the teacher `teacher/keras` is at chance" in text
    assert "meets every target" not in text and "B8" not in text
    assert "File to ship: `/runs/x/student-export/model_int8.tflite`" in text
    chosen.notes.clear()
    teacher.notes.clear()
    chosen.gate = {"passed": False, "reasons": ["agreement 0.950 < 0.99"]}
    assert targets.b8(teacher, chosen)["trouble"] == [
        "the chosen model `student/int8` failed its fidelity gate (agreement 0.950 < 0.99)"
    ]
    chosen.gate = {"passed": True, "reasons": []}
    assert targets.b8(teacher, chosen)["passed"] is True


# --- a synthetic pipeline run ---------------------------------------------------------------------


def _record(stage, model, history=(), metrics=None, section=None, **extra):
    out = {
        "stage": stage,
        "config": {"model": {"name": model}},
        "versions": {"tfopt": "0.1.0", "tensorflow": "2.21.0"},
        "strategy": {"name": "one_device", "num_replicas": 1},
        "data": {"splits": {"test": 1000}},
        "model": {"name": model, "params": extra.pop("params", 1000)},
        "train": extra.pop("train", {}),
        "history": list(history),
        "metrics": metrics or {},
        "artifacts": {},
        "schema_version": 2,
    }
    if stage != "train":
        out[stage] = section or {}
    return out


def _row(mode, acc, keras_acc, agreement, size, gzip, p50_ms, gate=True, **extra):
    return {
        "mode": mode,
        "io": "float",
        "file": f"model_{mode}.tflite",
        "size_bytes": size,
        "gzip_bytes": gzip,
        "eval": {
            "examples": 500,
            "accuracy": acc,
            "keras_accuracy": keras_acc,
            "agreement": agreement,
            "accuracy_delta_pt": 100 * (acc - keras_acc),
        },
        "gate": {"passed": gate, "reasons": [] if gate else ["agreement 0.9800 < 0.99"]},
        "latency": {
            "xnnpack/1t": {"p50_ms": p50_ms, "p95_ms": 1.5 * p50_ms},
            "xnnpack/2t": {"p50_ms": 0.7 * p50_ms, "p95_ms": p50_ms},
        },
        **extra,
    }


PEAKS = {
    "fp32": {"gmacs": 50.0, "instruction": "vfmadd231ps zmmN", "instructions_per_cycle": 2.0},
    "int8": {"gmacs": 200.0, "instruction": "vpdpbusd zmmN", "instructions_per_cycle": 2.0},
    "clock_ghz": 3.0,
}
ROOFLINE = {
    "xnnpack/1t": roofline.analyze(
        [
            ops.OpCost(0, "CONV_2D", ops.CONV, 1_000_000, "int8", "int8"),
            ops.OpCost(1, "FULLY_CONNECTED", ops.CONV, 200_000, "int8", "int8"),
            ops.OpCost(2, "SOFTMAX", ops.OTHER, 0, "fp32", "int8"),
        ],
        PEAKS,
        p50_ms=0.02,
        op_ms=[0.012, 0.004, 0.002],
    )
}


def _export(model, params, flops, weights, keras_p50_ms, rows):
    section = {
        "modes": rows,
        "notes": [],
        "table": "",
        "keras": {
            "latency": {
                "1t": {"p50_ms": keras_p50_ms, "p95_ms": 2 * keras_p50_ms},
                "2t": {"p50_ms": keras_p50_ms / 1.5, "p95_ms": keras_p50_ms},
            },
            "weights_bytes": weights,
            "file_bytes": weights + 9000,
            "params": params,
            "flops": flops,
        },
    }
    rec = _record("export", model, section=section)
    rec["model"].update(params=params, flops=flops)
    return rec


SELECTIVE = {
    "ranking": [
        {
            "tensor_name": "model/conv0/Conv2D;model/conv0/BiasAdd",
            "op_name": "CONV_2D",
            "rmse_over_scale": 3.5,
            "mean_squared_error": 0.2,
            "scale": 0.1,
        },
        {
            "tensor_name": "model/fc/MatMul",
            "op_name": "FULLY_CONNECTED",
            "rmse_over_scale": 0.3,
            "mean_squared_error": 0.001,
            "scale": 0.1,
        },
    ],
    "trials": [
        {
            "float_layers": ["model/conv0/Conv2D;model/conv0/BiasAdd"],
            "size_bytes": 240_000,
            "result": {"accuracy": 0.99, "agreement": 0.995},
            "gate": {"passed": True, "reasons": []},
        }
    ],
    "chosen": 0,
    "passed": True,
    "search_split": "validation",
    "search_examples": 300,
}


# train.pipeline and train.privacy as tfopt train and tfopt distill record them.
SPLIT = {
    "stages": [
        {"layers": 3, "first": "c1", "last": "pool", "cost": 0.012, "device": "/device:CPU:0"},
        {"layers": 4, "first": "flat", "last": "logits", "cost": 0.010, "device": "/device:CPU:1"},
    ],
    "balanced_by": "time",
    "microbatches": 8,
    "schedule": "1f1b",
    "remat": True,
    "bubble_formula": 1 / 9,
    "measured": {
        "bubble_measured": 0.4876,
        "stage_peak_bytes": [3 * 2**20, 5 * 2**20],
        "unsplit_peak_bytes": 9 * 2**20,
    },
}
PRIVACY = {
    "epsilon_rdp": 2.9187,
    "epsilon_pld": 2.7012,
    "delta": 1e-5,
    "noise_multiplier": 1.1,
    "l2_clip": 1.0,
    "steps": 14040,
    "sampling": "Poisson",
}


def make_pipeline_dir(root, *, probe=True, pending=(), tflite=None) -> str:
    """A pipeline run directory with hand-written records: teacher -> student -> student-pqat, three exports.

    Args:
        root: Where to create it.
        probe: Write the input-pipeline probe into pipeline.json.
        pending: Stage names left pending, without a run.json.
        tflite: Bytes written as the .tflite of ``student-pqat/int8`` (for the analyzer), or None.
    """
    run = os.path.join(str(root), "run")
    hist = [
        {"epoch": 1, "loss": 0.5, "accuracy": 0.9, "val_loss": 0.3, "val_accuracy": 0.95},
        {"epoch": 2, "loss": 0.2, "accuracy": 0.97, "val_loss": 0.1, "val_accuracy": 0.98},
    ]
    records = {
        "teacher": _record(
            "train",
            "cnn",
            hist,
            {"test_accuracy": 0.985},
            params=220522,
            train={"epochs": 2, "examples_per_sec": 1800.0, "pipeline": SPLIT},
        ),
        "student": _record(
            "distill",
            "small_cnn",
            [{**h, "student_loss": h["loss"] + 0.1} for h in hist],
            {"test_accuracy": 0.98},
            {"settings": {"technique": "none"}},
            params=14506,
            train={"privacy": PRIVACY},
        ),
        "student-pqat": _record(
            "optimize",
            "small_cnn",
            [
                {"phase": "prune", "epochs": 1, "train_loss": 0.3, "train_accuracy": 0.96},
                {"phase": "qat", "epochs": 1, "train_loss": 0.25, "train_accuracy": 0.97},
            ],
            {"test_accuracy": 0.981},
            {"technique": "pqat"},
            params=14506,
        ),
        "teacher-export": _export(
            "cnn",
            220522,
            8_117_322,
            882_088,
            0.6,
            [
                _row("float32", 0.99, 0.99, 1.0, 883_908, 816_353, 0.15),
                _row("int8", 0.97, 0.99, 0.98, 228_576, 214_000, 0.09, gate=False),
                _row(
                    "int8-selective", 0.99, 0.99, 0.995, 240_000, 225_000, 0.08, selective=SELECTIVE
                ),
            ],
        ),
        "student-export": _export(
            "small_cnn",
            14506,
            400_000,
            58_024,
            0.4,
            [
                _row("float32", 0.984, 0.984, 1.0, 60_872, 55_000, 0.03),
                _row("int8", 0.986, 0.984, 0.996, 19_312, 17_000, 0.04),
            ],
        ),
        "student-pqat-export": _export(
            "small_cnn",
            14506,
            400_000,
            58_024,
            0.5,
            [_row("int8", 0.9865, 0.9862, 0.999, 19_728, 12_000, 0.02, roofline=ROOFLINE)],
        ),
    }
    records["student-pqat-export"]["export"]["cpu_peaks"] = PEAKS
    stages = []
    for name, rec in records.items():
        kind = rec["stage"]
        inputs = {"teacher": [], "student": ["teacher"], "student-pqat": ["student"]}.get(
            name, [name[: -len("-export")]]
        )
        done = name not in pending
        stages.append(
            {
                "name": name,
                "kind": kind,
                "dir": name,
                "inputs": inputs,
                "fingerprint": "f" * 16,
                "status": "done" if done else "pending",
                "seconds": 10.0 if done else None,
            }
        )
        if done:
            write_json(os.path.join(run, name, "run.json"), rec)
    if tflite is not None and "student-pqat-export" not in pending:
        with open(os.path.join(run, "student-pqat-export", "model_int8.tflite"), "wb") as f:
            f.write(tflite)
    state = {
        "schema": 1,
        "pipeline": "mnist_edge",
        "variant": "test",
        "file": "/x/pipelines/mnist_edge.py",
        "config": {"name": "mnist_edge", "select": "acc_drop<=0.5"},
        "select": "acc_drop<=0.5",
        "strategy": "one_device",
        "stages": stages,
        "wall_seconds": 60.0,
    }
    if probe:
        state["probe"] = {
            "input_examples_per_sec": 25000.0,
            "train_examples_per_sec": 700.0,
            "step_ms_real": 180.0,
            "step_ms_synthetic": 176.0,
            "input_bound_fraction": 0.0222,
            "batch": 128,
            "steps": 8,
        }
    write_json(os.path.join(run, "pipeline.json"), state)
    return run


@pytest.fixture(scope="module")
def tiny_tflite():
    from tfopt.core._keras import keras, tf

    inputs = keras.Input((4, 4, 1))
    model = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Flatten()(inputs)))
    return tf.lite.TFLiteConverter.from_keras_model(model).convert()


def test_collect_makes_one_variant_per_model_and_format_with_figures_from_the_records(tmp_path):
    run = collect(make_pipeline_dir(tmp_path))
    names = [v.name for v in run.variants]
    assert names == [
        "teacher/keras",
        "teacher/float32",
        "teacher/int8",
        "teacher/int8-selective",
        "student/keras",
        "student/float32",
        "student/int8",
        "student-pqat/keras",
        "student-pqat/int8",
    ]
    assert run.baseline == "teacher/keras" and run.warnings == []
    tk, ti8, sq = (
        run.variant("teacher/keras"),
        run.variant("teacher/int8"),
        run.variant("student-pqat/int8"),
    )
    assert (
        tk.accuracy_pct == pytest.approx(99.0)
        and tk.size_bytes == 882_088
        and tk.gzip_bytes is None
    )
    assert (
        tk.p50_us == pytest.approx(600.0)
        and tk.p50_us_2t == pytest.approx(400.0)
        and tk.flops == 8_117_322
    )
    assert ti8.delta_pt == pytest.approx(-2.0) and ti8.agreement_pct == pytest.approx(98.0)
    assert ti8.p95_us == pytest.approx(135.0) and ti8.gate["passed"] is False
    assert (
        sq.delta_pt == pytest.approx(-0.35)
        and sq.technique == "distilled+pqat"
        and sq.arch == "small_cnn"
    )
    assert run.variant("student-pqat/keras").accuracy_pct == pytest.approx(98.62)
    assert sq.file.endswith(os.path.join("student-pqat-export", "model_int8.tflite"))


@pytest.mark.slow
def test_report_md_json_html_and_hparams_from_a_synthetic_run(tmp_path, tiny_tflite, caplog):
    from tfopt.core.log import PROGRESS
    from tfopt.report import build

    run_dir = make_pipeline_dir(tmp_path, tflite=tiny_tflite)
    with caplog.at_level(PROGRESS, logger="tfopt"):
        report = build(run_dir)
    lines = [r.getMessage() for r in caplog.records if r.name == "tfopt.report.builder"]
    out = os.path.join(run_dir, "report")
    assert sorted(os.listdir(out)) == [
        "hparams",
        "pareto.png",
        "report.html",
        "report.json",
        "report.md",
        "training_curves.png",
    ]
    assert not [p for p in os.listdir(run_dir) if p.startswith((".tmp", ".old"))]
    assert lines and any("analyzer" in line for line in lines)
    with open(os.path.join(out, "report.json"), encoding="utf-8") as f:
        on_disk = json.load(f)
    assert on_disk == json.loads(json.dumps(report))
    assert set(report) >= {
        "schema",
        "summary",
        "environment",
        "config",
        "stages",
        "probe",
        "training",
        "variants",
        "pareto",
        "selection",
        "b8",
        "quantization_debugger",
        "analyzer",
        "hparams",
        "paths",
        "warnings",
        "wall_seconds",
        "baseline",
    }
    # acc_drop<=0.5 (pipeline.json's rule): teacher/int8 (-2 pt) and student/float32 (-0.6 pt) fail
    sel = report["selection"]
    assert (
        sel["chosen"] == "student-pqat/int8" and report["summary"]["chosen"] == "student-pqat/int8"
    )
    assert sel["rejected"]["teacher/int8"] == "fails acc_drop<=0.5: acc_drop is 2.00 pt"
    assert report["pareto"]["gzip_bytes"] == ["student-pqat/int8", "teacher/int8-selective"]
    b8 = {r["name"].split(":")[0]: r for r in report["b8"]["rows"]}
    assert b8["size"]["value"] == pytest.approx(882_088 / 19_728) and b8["size"]["status"] == "PASS"
    assert b8["latency"]["value"] == pytest.approx(30.0) and b8["latency"]["status"] == "PASS"
    assert b8["accuracy lost (teacher - chosen)"]["value"] == pytest.approx(0.35)
    assert report["b8"]["passed"] is True
    dbg = report["quantization_debugger"]
    assert len(dbg) == 1 and dbg[0]["model"] == "teacher" and dbg[0]["float_layers"] == ["conv0"]
    assert dbg[0]["worst"][0] == {**dbg[0]["worst"][0], "layer": "conv0", "in_float": True}
    assert [op["op"] for op in report["analyzer"]["ops"]] and "FULLY_CONNECTED" in report[
        "analyzer"
    ]["op_counts"]
    assert report["environment"]["cpu"]["logical_cores"] >= 1
    assert [c["stage"] for c in report["training"]] == ["teacher", "student", "student-pqat"]
    assert report["training"][1]["loss_name"] == "student_loss" and report["training"][2][
        "epoch"
    ] == [1, 2]

    with open(report["paths"]["md"], encoding="utf-8") as f:
        md = f.read()
    for heading in (
        "# mnist_edge: pipeline report",
        "## Variants",
        "## Pareto frontiers",
        "## Selection",
        "## Stages and training",
        "## Input pipeline",
        "## Quantization debugger",
        "## Chosen model's ops (TFLite analyzer)",
        "## Roofline",
        "## Environment",
        "## Resolved config",
    ):
        assert "\n" + heading + "\n" in "\n" + md, heading
    assert "**Chosen edge model: `student-pqat/int8`**" in md
    assert "| size: teacher float32 weights / chosen .tflite " in md and "| 44.71 x " in md
    assert "![" in md and "(pareto.png)" in md and "(training_curves.png)" in md
    assert md.count("\n| teacher/") == 4 + 4  # the variants table and the selection table
    assert "size is the bytes of the float32 weights" in md and "2.2%" in md
    # The roofline of the one variant that has it: bound 1.2M MACs / 200 GMAC/s = 6 µs, p50 20 µs.
    pqat = next(v for v in report["variants"] if v["name"] == "student-pqat/int8")
    assert pqat["bound_us"] == pytest.approx(6.0) and "| 3.33x " in md
    assert "`student-pqat/int8`: time: conv/FC 89% (3.0x its bound; 68 of 200 GMAC/s int8)" in md
    assert "one core's peaks at 3.00 GHz: fp32 50 GMAC/s (vfmadd231ps zmm" in md
    # The student's DP budget and the teacher's pipeline split, as their records hold them.
    cells = re.sub(" +", " ", md)  # the tables' columns are padded
    assert (
        "### Differential privacy" in md
        and "| student | 2.92 | 2.70 | 1.0e-05 | 1.100 | 1 " in cells
    )
    assert "### Pipeline parallelism" in md
    assert (
        "| teacher | 2 | 8 | 1f1b + remat | time | c1..pool \\| flat..logits | 0.49 | 0.11 "
        in cells
    )
    assert "| 3.0 / 5.0 | 9.0 |" in cells
    with open(report["paths"]["html"], encoding="utf-8") as f:
        page = f.read()
    assert page.count('src="data:image/png;base64,') == 2 and '<table id="variants">' in page
    assert "<script" not in page and "<link" not in page and 'src="http' not in page

    events = [
        os.path.join(d, f) for d, _, files in os.walk(report["hparams"]["dir"]) for f in files
    ]
    assert len(events) == 1 + len(report["variants"]) and all("tfevents" in e for e in events)
    assert os.path.isdir(os.path.join(report["hparams"]["dir"], "student-pqat", "int8"))
    assert report["hparams"]["runs"] == [v["name"] for v in report["variants"]]


def test_hparams_summaries_are_read_back_by_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2
    from tensorboard.util import tensor_util

    from tfopt.report import hparams

    root = str(tmp_path / "hp")
    hparams.write(root, VARIANTS[:3], "teacher/int8")
    acc = EventAccumulator(os.path.join(root, "teacher", "int8"), size_guidance={"tensors": 0})
    acc.Reload()
    values = {
        tag: float(tensor_util.make_ndarray(acc.Tensors(tag)[0].tensor_proto))
        for tag in acc.Tags()["tensors"]
        if tag in ("accuracy", "gzip_kb", "p50_us", "chosen")
    }
    assert values == pytest.approx(
        {"accuracy": 98.9, "gzip_kb": 200_000 / 1024, "p50_us": 90.0, "chosen": 1.0}
    )
    content = acc.SummaryMetadata("_hparams_/session_start_info").plugin_data.content
    start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    assert (
        start.hparams["format"].string_value == "int8"
        and start.hparams["model"].string_value == "teacher"
    )


@pytest.mark.slow
def test_unfinished_run_without_probe_reports_what_there_is(tmp_path):
    from tfopt.report import build

    run_dir = make_pipeline_dir(
        tmp_path, probe=False, pending=("student-pqat", "student-pqat-export")
    )
    report = build(run_dir, select="acc>=99.9")
    assert [v["name"] for v in report["variants"]][-1] == "student/int8"
    assert any("student-pqat" in w and "no run.json" in w for w in report["warnings"])
    assert report["selection"]["chosen"] is None and report["analyzer"] is None
    assert [r["status"] for r in report["b8"]["rows"]] == ["n/a"] * 3
    with open(report["paths"]["md"], encoding="utf-8") as f:
        md = f.read()
    assert "Input pipeline throughput: not measured" in md and "No .tflite variant satisfies" in md
    assert "## Warnings" in md and "No model was chosen" in md


@pytest.mark.slow
def test_cli_builds_and_bad_input_is_one_line_exit_2(tmp_path, capsys):
    from tfopt.report.cli import main

    run_dir = make_pipeline_dir(tmp_path)
    assert main([run_dir, "--quiet", "--select", "gzip_kb<=20"]) == 0
    out = capsys.readouterr().out
    assert (
        "student-pqat/int8 is chosen" in out
        and os.path.join(run_dir, "report", "report.html") in out
    )
    for argv, needle in (
        ([str(tmp_path / "nope")], "does not exist"),
        ([str(tmp_path)], "has no pipeline.json"),
        ([run_dir, "--select", "p50<=3"], "unknown key 'p50'"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("tfopt report: error: ") and needle in err[0], (
            err
        )


def test_report_md_shows_hostile_names_as_text():
    from markdown_it import MarkdownIt

    from tfopt.report.render import markdown

    name = "x` <img src=x onerror=alert(1)> [click](http://evil.example) `y"
    md = markdown(
        [
            {"type": "p", "text": f"Chosen edge model: `{name}`"},
            {"type": "list", "items": [f"run <script>alert(1)</script> {name}", "<img src=y>"]},
            {
                "type": "table",
                "header": ["variant"],
                "rows": [[name], ["a|b"], ["[c](http://e.example)"]],
            },
            {"type": "img", "alt": "](http://evil.example/track.png) ![", "file": "pareto.png"},
            {"type": "pre", "summary": "<b>log</b>", "text": "```\n<script>alert(1)</script>"},
        ]
    )
    html = MarkdownIt("commonmark", {"html": True}).enable("table").render(md)
    assert "<script" not in html and "<img src=x" not in html and "<img src=y" not in html
    assert "evil.example" not in "".join(
        re.findall(r'(?:href|src)="([^"]*)"', html)
    )  # no link, no image to it
    assert 'src="pareto.png"' in html and html.count("<tr>") == 4  # no cell split by a name
    assert (
        "```\n&lt;script&gt;alert(1)&lt;/script&gt;\n</code></pre>" in html
    )  # the fence holds the text
