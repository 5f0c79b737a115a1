"""Benchmark B14 (pipeline parallelism): a model split GPipe-style into K stages with M micro-batches.

What it does, in one process on this machine's logical CPU devices (protocol: BENCHMARKS.md, row
B14). One convolutional model (``--blocks`` 3x3 convolutions of ``--width`` channels on 32x32x3
inputs, then pooling and a dense head; cut points between every block) is split by
``tfopt.runtime.gpipe`` (balanced by multiply-adds) into K = 2 and 4 stages, each on a logical CPU
device of its own, with M = K, 4K and 8K micro-batches per batch of ``--batch`` examples. For
each cell, ``tfopt.runtime.gpipe.measure.measure`` (the library code ``run.json`` records)
gives each stage's busy time (its forward and backward passes of the M micro-batches, alone),
the pipelined step's time, the measured idle fraction ``1 - sum(busy) / (K * step)`` and GPipe's
``(K-1)/(M+K-1)``, and each stage's peak memory holding its M micro-batches' activations, with
and without rematerialization, beside the unsplit model's. The peer is the unsplit model: its
forward and backward step on one device, timed in the same repeat (cells and the peer interleaved,
order rotated). The gradients of every cell are compared with the unsplit model's on the same
batch.

Figures: per cell, |measured idle - formula| (target <= 0.10 of the step); the peak memory per
stage (the largest stage) at K=4 over K=2, M=8K (target < 1: it falls as K grows); with
rematerialization over without (info); the pipelined step over the unsplit step (info); the
largest gradient difference relative to the gradient's scale (target <= 1e-3, float32's
summation-order tolerance); and a model over one device's memory budget trained with K stages:
the budget is 0.6x the model's peak on one stage (``tfopt.runtime.gpipe.measure.stage_peaks``:
its weights and the allocator's peak while it holds the micro-batches' activations), the one
stage is refused by ``check_budget`` (``--device-memory-mib``), and the fewest stages that fit
train 3 steps under the same check (figure: their largest stage's peak over the budget, target
< 1). Logical CPU devices share one allocator and have no limit of their own, so the budget is
tfopt's check against the measured peaks; on GPUs ``--device-memory-mib`` is also TensorFlow's
memory limit of each stage's GPU.

    PYTHONPATH=. python bench/pipeline_parallel.py          # ~5 min on 2 cores -> bench/results/pipeline_parallel.json
    PYTHONPATH=. python bench/pipeline_parallel.py --smoke  # tiny, one repeat (a test)
"""

from __future__ import annotations

import os
import sys
import time

if __package__ in (None, ""):  # run as a script: make `bench` and `tfopt` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._common import (  # noqa: E402
    CpuSample,
    QuietGate,
    figure,
    figures_table,
    markdown_table,
    median,
    publish,
    result,
    script_parser,
)

COMMAND = "PYTHONPATH=. python bench/pipeline_parallel.py"
STAGES = (2, 4)
FULL = {"blocks": 8, "width": 64, "batch": 64, "repeats": 3}
SMOKE = {"blocks": 4, "width": 8, "batch": 32, "repeats": 1}


def build_model(keras, blocks: int, width: int):
    """The benchmark's model: ``blocks`` convolutions (a cut point after each), pooling, a head."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((32, 32, 3))
    x = inputs
    for i in range(blocks):
        x = keras.layers.Conv2D(width, 3, padding="same", activation="relu", name=f"conv{i}")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(inputs, keras.layers.Dense(10, name="logits")(x), name="b14_cnn")


def cells(stages=STAGES) -> list[tuple[int, int, str]]:
    """(K, M, schedule): GPipe for every K and M in {K, 4K, 8K}; 1F1B at M = 8K."""
    gpipe = [(k, m, "gpipe") for k in stages for m in (k, 4 * k, 8 * k)]
    return gpipe + [(k, 8 * k, "1f1b") for k in stages]


def key(k: int, m: int, schedule: str = "gpipe") -> str:
    """A cell's name in the result: ``"K,M"`` (GPipe) or ``"K,M,1f1b"``."""
    return f"{k},{m}" + ("" if schedule == "gpipe" else f",{schedule}")


def _gradient_gap(tf, pipelined, model, x, y, loss) -> float:
    """max |g_split - g_unsplit| / max |g_unsplit| over the variables, on one batch."""
    with tf.GradientTape() as tape:
        reference = tape.gradient(loss(y, model(x, training=True)), model.trainable_variables)
    grads = pipelined.gradients(tf.constant(x), tf.constant(y))[1]
    return max(
        float(tf.reduce_max(tf.abs(g - r)) / tf.reduce_max(tf.abs(r)))
        for g, r in zip(grads, reference, strict=True)
    )


def measure_all(p: dict) -> dict:
    """Every cell's measurements per repeat, the unsplit peer's step time, the gradient gaps."""
    from tfopt.runtime import setup_cpu_replicas

    setup_cpu_replicas(max(STAGES))
    import numpy as np

    from tfopt import keras, tf
    from tfopt.compress import layer_macs
    from tfopt.runtime import (
        Pipelined,
        build_stages,
        measure_pipeline,
        median_seconds,
        partition,
        stage_devices,
    )

    model = build_model(keras, p["blocks"], p["width"])
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rng = np.random.default_rng(0)
    x = rng.random((p["batch"], 32, 32, 3), dtype=np.float32)
    y = rng.integers(0, 10, p["batch"])
    split = {}
    for k, m, schedule in cells():
        part = partition(model, k, by="flops", macs=layer_macs)
        devices = stage_devices(k)
        stages = build_stages(model, part, devices)
        split[key(k, m, schedule)] = Pipelined(stages, devices, m, False, part, schedule)
        split[key(k, m, schedule)].compile(keras.optimizers.SGD(0.01), loss)

    @tf.function
    def unsplit_step():
        with tf.GradientTape() as tape:
            value = loss(y, model(x, training=True))
        return tape.gradient(value, model.trainable_variables)

    gate = QuietGate(enabled=not p.get("no_gate"))
    runs = {key(*cell): [] for cell in cells()}
    peer = []
    names = [*runs, "unsplit"]
    for r in range(p["repeats"]):
        for name in names[r % len(names) :] + names[: r % len(names)]:

            def unit(name=name):
                with CpuSample() as s:
                    if name == "unsplit":
                        out = median_seconds(unsplit_step, 5)
                    else:
                        out = measure_pipeline(split[name], x, y)
                return out, [s.foreign]

            (peer if name == "unsplit" else runs[name]).append(gate.run(unit))
            print(f"repeat {r + 1}/{p['repeats']}: {name} measured", flush=True)
    gaps = {key(*cell): _gradient_gap(tf, split[key(*cell)], model, x, y, loss) for cell in cells()}
    budget = _over_budget(keras, model, loss, x, y, split)
    partitions = {str(k): split[key(k, m)].partition.stages for k, m, _ in cells() if m == k}
    return {
        "runs": runs,
        "unsplit_step_seconds": peer,
        "gradient_gap": gaps,
        "partitions": partitions,
        "macs": int(sum(layer_macs(layer, model) for layer in model.layers)),
        "params_count": int(model.count_params()),
        "budget": budget,
        "gate": gate,
    }


def _over_budget(keras, model, loss, x, y, split) -> dict:
    """The model on one stage against a device memory budget of 0.6x its peak there: refused by
    ``check_budget``; then the fewest stages (M = 8K) whose every stage fits, trained 3 steps
    under the same check."""
    from tfopt import ConfigError
    from tfopt.runtime import (
        Pipelined,
        build_stages,
        check_budget,
        partition,
        stage_devices,
        stage_peaks,
    )

    part = partition(model, 1)
    whole = Pipelined(build_stages(model, part, stage_devices(1)), stage_devices(1), 8, False, part)
    one = stage_peaks(whole, x)[0]
    mib = 0.6 * one / 2**20
    try:
        check_budget(whole, x, mib)
        refused = ""
    except ConfigError as e:
        refused = str(e)
    out = {"budget_mib": mib, "one_stage_peak_bytes": one, "refused": refused}
    for k in STAGES:
        pipelined = split[key(k, 8 * k)]
        peaks = stage_peaks(pipelined, x)
        out[str(k)] = peaks
        if max(peaks) <= mib * 2**20 and "trained" not in out:
            check_budget(pipelined, x, mib)
            losses = [float(pipelined.train_on_batch(x, y)) for _ in range(3)]
            out["trained"] = {"stages": k, "losses": losses}
    return out


def _ratio(a: float, b: float) -> float | None:
    """a / b; None (measured nothing) when the allocator counted no bytes for b."""
    return a / b if b else None


def figures(m: dict) -> list[dict]:
    """The published figures (module docstring) from :func:`measure_all`'s measurements."""
    runs, peer = m["runs"], m["unsplit_step_seconds"]
    out = []
    for k, mb, schedule in cells():
        if schedule != "gpipe":
            continue
        cell = runs[key(k, mb)]
        out.append(
            figure(
                f"K={k} M={mb}: |idle measured - (K-1)/(M+K-1)|, of the step",
                [abs(c["bubble_measured"] - c["bubble_formula"]) for c in cell],
                "",
                target=("<=", 0.10),
                anchor=f"GPipe: {(k - 1) / (mb + k - 1):.3f} idle",
                detail=f"idle measured {median(c['bubble_measured'] for c in cell):.3f}",
            )
        )

    def largest(k, mb, field="stage_peak_bytes"):
        return [max(c[field]) for c in runs[key(k, mb)]]

    k2, k4 = largest(2, 16), largest(4, 32)
    out.append(
        figure(
            "peak memory of the largest stage, K=4 over K=2 (M=8K)",
            [_ratio(a, b) for a, b in zip(k4, k2, strict=True)],
            "x",
            target=("<", 1.0),
            peer=f"unsplit {median(c['unsplit_peak_bytes'] for c in runs['2,16']) / 2**20:.1f} MiB",
            detail=f"K=2 {median(k2) / 2**20:.1f} MiB, K=4 {median(k4) / 2**20:.1f} MiB",
        )
    )
    for k in STAGES:
        remat = largest(k, 8 * k, "stage_peak_bytes_remat")
        plain = largest(k, 8 * k)
        out.append(
            figure(
                f"K={k} M={8 * k}: peak of the largest stage with rematerialization over without",
                [_ratio(a, b) for a, b in zip(remat, plain, strict=True)],
                "x",
            )
        )
        step = [c["step_seconds"] for c in runs[key(k, 4 * k)]]
        out.append(
            figure(
                f"K={k} M={4 * k}: pipelined step over the unsplit step",
                [a / b for a, b in zip(step, peer, strict=True)],
                "x",
                peer=f"unsplit step {median(peer) * 1000:.1f} ms",
            )
        )
        gpipe_peak = [c["step_peak_bytes"] for c in runs[key(k, 8 * k)]]
        one_f = [c["step_peak_bytes"] for c in runs[key(k, 8 * k, "1f1b")]]
        out.append(
            figure(
                f"K={k} M={8 * k}: peak memory of the step, 1F1B over GPipe",
                [_ratio(a, b) for a, b in zip(one_f, gpipe_peak, strict=True)],
                "x",
                target=("<", 1.0),
                detail=f"GPipe {median(gpipe_peak) / 2**20:.1f} MiB, 1F1B "
                f"{median(one_f) / 2**20:.1f} MiB",
            )
        )
    out.append(
        figure(
            "largest gradient difference from the unsplit model's, relative",
            [max(m["gradient_gap"].values())],
            "",
            target=("<=", 1e-3),
            detail="float32: the micro-batches' gradients are summed in another order",
            digits=7,
        )
    )
    b = m["budget"]
    trained = b.get("trained")
    fits = [max(b[str(trained["stages"])]) / (b["budget_mib"] * 2**20)] if trained else []
    out.append(
        figure(
            "a model over one device's memory budget (0.6x its one-stage peak) trains with K "
            "stages: the largest stage's peak over the budget",
            fits if b["refused"] else [],
            "x",
            target=("<", 1.0),
            detail=(
                f"one stage {b['one_stage_peak_bytes'] / 2**20:.1f} MiB over the budget of "
                f"{b['budget_mib']:.1f} MiB, refused"
                + (
                    f"; K={trained['stages']} trained 3 steps under it, loss "
                    + " -> ".join(f"{v:.3f}" for v in trained["losses"])
                    if trained
                    else "; no K fits"
                )
            ),
        )
    )
    return out


def table(res: dict) -> str:
    """Per cell: stage busy times, step, idle measured vs formula, peaks; then the figures."""
    rows = []
    for k, mb, schedule in cells():
        cell = res["runs"][key(k, mb, schedule)]
        rows.append(
            [
                f"K={k} M={mb} {schedule}",
                ", ".join(
                    f"{median(c['stage_seconds'][s] for c in cell) * 1000:.1f}" for s in range(k)
                ),
                f"{median(c['step_seconds'] for c in cell) * 1000:.1f}",
                f"{median(c['bubble_measured'] for c in cell):.3f}",
                f"{cell[0]['bubble_formula']:.3f}",
                ", ".join(
                    f"{median(c['stage_peak_bytes'][s] for c in cell) / 2**20:.1f}"
                    for s in range(k)
                ),
                f"{median(c['step_peak_bytes'] for c in cell) / 2**20:.1f}",
            ]
        )
    cells_md = markdown_table(
        [
            "cell",
            "stage busy ms",
            "step ms",
            "idle measured",
            "idle formula",
            "stage peak MiB",
            "step peak MiB",
        ],
        rows,
    )
    return f"## B14: pipeline parallelism\n\n{cells_md}\n\n{figures_table(res['figures'])}"


def main(argv: list[str] | None = None) -> int:
    """Measures every cell, prints the B14 table and writes the JSON result."""
    ap = script_parser(__doc__, "pipeline_parallel", "a tiny model, one repeat", gate=True)
    args = ap.parse_args(argv)
    started = time.perf_counter()
    p = {**(SMOKE if args.smoke else FULL), "smoke": args.smoke, "no_gate": args.no_gate}
    m = measure_all(p)
    gate = m.pop("gate")
    res = result("B14", "pipeline parallelism", COMMAND, figures(m), params=p, **m)
    return publish(res, args.out, "B14", table=table, gate=gate, started=started)


if __name__ == "__main__":
    sys.exit(main())
