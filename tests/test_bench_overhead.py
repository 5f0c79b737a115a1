"""Keeps benchmark B7 (bench/overhead.py) runnable and honest: its ``--smoke`` mode end to end.

Not a performance test: the smoke figures mean nothing. It checks that every side really trained
as described (tfopt through its library entry, the bare fit with Keras' defaults and with tfopt's
steps_per_execution, both strategies, the same initial weights and steps on every side), and that
each published figure is recomputed here, independently, from the raw timestamps the JSON holds,
with a verdict that follows from its number.
"""

import json
import math
import os
import statistics
import subprocess
import sys

import pytest
from bench_checks import committed

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIDES = ("tfopt", "bare_tuned", "bare_default")


def _step_ms(r):
    """ms per step over the epochs after the first: epoch begin to its last step, summed."""
    total = 0.0
    for e in range(1, len(r["steps"])):
        total += r["last_step_end_s"][e] - r["epoch_begin_s"][e]
    return 1000.0 * total / sum(r["steps"][1:])


def _cycle_ms(r):
    return 1000.0 * (r["train_end_s"] - r["epoch_begin_s"][1]) / sum(r["steps"][1:])


def _slower_pct(a, b):
    return (a - b) / b * 100.0


def _check_figure(fig, values):
    assert fig["values"] == pytest.approx(values, rel=1e-9)
    assert fig["value"] == pytest.approx(statistics.median(values), rel=1e-9)
    assert fig["spread"] == pytest.approx([min(values), max(values)], rel=1e-9)
    if fig["op"] is None:
        assert fig["status"] == "-"
    else:
        ok = fig["value"] <= fig["bound"] if fig["op"] == "<=" else fig["value"] >= fig["bound"]
        assert fig["status"] == ("pass" if ok else "MISS"), fig


@pytest.mark.slow
@pytest.mark.bench
def test_overhead_benchmark_smoke(tmp_path):
    out = tmp_path / "overhead.json"
    env = dict(
        os.environ,
        PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    env.pop("TF_CONFIG", None)
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "bench", "overhead.py"),
            "--smoke",
            "--workdir",
            str(tmp_path / "new"),
            "--out",
            str(out),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "| B7 framework overhead" in proc.stdout

    res = json.loads(out.read_text())
    assert res["params"]["smoke"] is True
    check_result(res)


def check_result(res):
    """Everything a B7 result must get right whatever its figures (also usable on a full run's JSON)."""
    p = res["params"]
    assert res["id"] == "B7" and res["lscpu"]["flags"] and res["environment"]["tensorflow"]
    cells = {(prec, strat): tuple(sides) for prec, strat, sides in p["cells"]}
    assert {strat for _, strat in cells} == {"one_device", "mirrored"}
    runs = res["runs"]
    assert sorted((x["precision"], x["strategy"], x["repeat"]) for x in runs) == sorted(
        (prec, strat, r) for prec, strat in cells for r in range(p["repeats"])
    )

    # -- every side trained as described --------------------------------------------------------
    steps_per_epoch = (
        p["limit"] // p["batch"]
    )  # the first `limit` training records; no partial batch
    for run in runs:
        names = cells[run["precision"], run["strategy"]]
        assert names[:2] == ("tfopt", "bare_tuned") and set(names) <= set(SIDES)
        assert sorted(run["order"]) == sorted(names) and not (set(SIDES) - set(names)) & set(run)
        sides = [run[s] for s in names]
        for side, r in zip(names, sides):
            assert (
                r["side"] == side
                and r["strategy"] == run["strategy"]
                and r["precision"] == run["precision"]
            )
            assert r["policy"] == run["precision"]
            assert r["replicas"] == (2 if run["strategy"] == "mirrored" else 1)
            assert r["distribute_strategy"] == (
                "MirroredStrategy" if run["strategy"] == "mirrored" else "OneDeviceStrategy"
            )
            assert r["global_batch_size"] == p["batch"] and r["epochs"] == p["epochs"]
            # equal training: every epoch ran all its steps, each side the same number
            assert r["steps_per_epoch"] == steps_per_epoch
            assert r["steps"] == [steps_per_epoch] * p["epochs"]
            assert (
                r["executions"]
                == [math.ceil(steps_per_epoch / r["steps_per_execution"])] * p["epochs"]
            )
            times = [t for pair in zip(r["epoch_begin_s"], r["last_step_end_s"]) for t in pair] + [
                r["train_end_s"]
            ]
            assert times == sorted(times) and times[0] == 0.0
            assert 0 <= r["window"]["foreign_load"] <= 1 or math.isnan(r["window"]["foreign_load"])
        tfopt, tuned = sides[:2]
        assert tuned["steps_per_execution"] == tfopt["steps_per_execution"] > 1
        if "bare_default" in names:
            assert run["bare_default"]["steps_per_execution"] == 1
        # the same model from the same initial weights on every side
        assert len({r["params"] for r in sides}) == 1
        assert len({r["initial_weights_sha256"] for r in sides}) == 1
        for (
            r
        ) in sides:  # the stored per-step figures are the timestamps' (recomputed independently)
            assert r["step_ms"] == pytest.approx(_step_ms(r), rel=1e-9)
            assert r["cycle_ms"] == pytest.approx(_cycle_ms(r), rel=1e-9)
            assert r["cycle_ms"] > r["step_ms"] > 0  # the cycle adds validation at least
            assert r["examples_per_sec"] == pytest.approx(
                p["batch"] * 1000.0 / r["step_ms"], rel=1e-9
            )

    # -- every figure follows from the raw numbers ------------------------------------------------
    figs = {f["name"]: f for f in res["figures"]}
    expected = 0
    for (prec, strat), names in cells.items():
        cell = sorted(
            (x for x in runs if x["precision"] == prec and x["strategy"] == strat),
            key=lambda x: x["repeat"],
        )
        tuned = figs[f"tfopt vs tuned bare fit, per-step time, {strat}, {prec} (% slower)"]
        _check_figure(
            tuned, [_slower_pct(_step_ms(x["tfopt"]), _step_ms(x["bare_tuned"])) for x in cell]
        )
        assert tuned["op"] == "<=" and tuned["bound"] == 2.0 and tuned["unit"] == "%"
        bare_rate = statistics.median(x["bare_tuned"]["examples_per_sec"] for x in cell)
        assert tuned["peer"].endswith(f"{bare_rate:,.0f} ex/s")
        name = f"(info) tfopt vs bare fit with Keras defaults, per-step time, {strat}, {prec} (% slower)"
        if "bare_default" in names:
            _check_figure(
                figs[name],
                [_slower_pct(_step_ms(x["tfopt"]), _step_ms(x["bare_default"])) for x in cell],
            )
            expected += 1
        else:
            assert name not in figs
        cycle = [
            f
            for n, f in figs.items()
            if n.startswith("(info) tfopt vs tuned bare fit, epoch cycle")
            and n.endswith(f"{strat}, {prec} (% slower)")
        ]
        assert len(cycle) == 1
        _check_figure(
            cycle[0], [_slower_pct(_cycle_ms(x["tfopt"]), _cycle_ms(x["bare_tuned"])) for x in cell]
        )
        expected += 2
    for prec in {
        prec
        for prec, strat in cells
        if (prec, "one_device") in cells and (prec, "mirrored") in cells
    }:
        one = sorted(
            (x for x in runs if x["precision"] == prec and x["strategy"] == "one_device"),
            key=lambda x: x["repeat"],
        )
        mirrored = sorted(
            (x for x in runs if x["precision"] == prec and x["strategy"] == "mirrored"),
            key=lambda x: x["repeat"],
        )
        fig = figs[f"(info) tfopt mirrored (2 logical CPU devices) / one_device throughput, {prec}"]
        # throughput ratio: examples per second of mirrored over one_device (same global batch)
        _check_figure(
            fig,
            [
                m["tfopt"]["examples_per_sec"] / o["tfopt"]["examples_per_sec"]
                for o, m in zip(one, mirrored)
            ],
        )
        expected += 1
    assert len(figs) == expected


def test_the_committed_overhead_result_holds_together():
    check_result(committed("overhead"))
