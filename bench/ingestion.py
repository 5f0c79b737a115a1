"""Benchmark B1 (ingestion): tfopt's input pipeline vs the tf.data guide's naive and optimized ones.

What it does, in one run on one machine (protocol: BENCHMARKS.md, row B1):

1. Makes (once, then reuses from ``--workdir``) 16 TFRecord shards of JPEG-encoded synthetic
   images (smooth gradients + noise + coloured shapes; ~2k images, random 128-256 px sides),
   with a manifest of record counts per shard that is checked on every reuse.
2. Every side decodes each JPEG and resizes it to 128 x 128 (``parse`` below: the user's
   dataset-specific decoding, the same function everywhere), then takes a random 112 x 112
   crop, mirrors it left-right half of the time and normalizes it (ImageNet mean/std):
     naive:   the tf.data guide's naive pipeline (bench/peers/tf_data_guide.py ``naive``): files
              read one after another, ``map`` one example at a time without parallelism,
              ``batch``; tf.data's default options (the baseline). The same with tf.data's
              automatic map parallelization and prefetch injection turned off is reported too;
     guide:   the pipeline the guide recommends (``optimized``): parallel interleave, parallel
              map, cache, random crop + flip after the cache, batch, vectorized normalize,
              prefetch; every knob AUTOTUNE;
     tfopt:   ``tfopt.data.build`` with ``data.augment=crop_flip, data.crop_size=112,
              data.normalize=imagenet``: the library's pipeline and augmentation (per-batch
              crop + flip + normalize after the cache, drawn from (seed, batch index)), every
              knob AUTOTUNE; nothing of it is written here.
3. Input-only throughput (images/s, nothing consumes the batches) for epoch 1 (tf.data cache
   empty; the OS page cache is warm for all) and for cached epochs (naive has no cache: its
   epoch 2).
4. Input-bound fraction of a real training step of a small tf_keras CNN:
   ``1 - T(ideal: one batch repeated) / T(real pipeline)``, cached epochs, tfopt and guide.
5. AUTOTUNE (all knobs -1) vs the best of a small hand grid (cache off, so that every epoch
   runs the tunable stages), with the winner re-measured against AUTOTUNE side by side so the
   gap is not inflated by picking the luckiest of many noisy measurements.

Each figure is a ratio of measurements interleaved in one run: per repeat, each side runs
``--trials`` interleaved trials and keeps its best (a shared machine only ever slows a run
down); the median over ``--repeats`` repeats is reported with the range. Units that other
processes disturbed are re-run within a time budget (``--quiet-threshold``, ``--max-wait``).
Prints a markdown table and writes the result JSON (bench/_common.result, atomically).

    PYTHONPATH=. python bench/ingestion.py [--repeats 3] [--out bench/results/ingestion.json]
    PYTHONPATH=. python bench/ingestion.py --smoke        # seconds, tiny data; used by a test
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import sys
import time

if __package__ in (None, ""):  # run as a script: make `bench` and `tfopt` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

from bench._common import (  # noqa: E402
    CpuSample,
    QuietGate,
    median,
    publish,
    result,
    script_parser,
)

# The benchmark's parts, by job (each under 600 lines).
from bench._ingestion_data import (  # noqa: E402
    ensure_dataset,
    epochs_of,
    guide_kwargs,
    make_parse,
    run_epoch,
    tfopt_config,
    tfopt_dataset,
)
from bench._ingestion_params import (  # noqa: E402
    COMMAND,
    NUM_CLASSES,
    SMOKE,
    Params,
)
from bench._ingestion_report import (  # noqa: E402
    figures,
    report,
)
from bench.peers import tf_data_guide as guide  # noqa: E402
from tfopt import keras, tf  # noqa: E402
from tfopt.config import default_data_dir  # noqa: E402
from tfopt.data import (  # noqa: E402
    crop_flip_augment,
    xla_available,
)

# --------------------------------------------------------------------------------------------
# Phases: each repeat is one "unit" measured side by side and re-run if another process
# disturbed it (see QuietGate)
# --------------------------------------------------------------------------------------------


def _interleaved(sides: dict, trials: int, r: int):
    """Runs ``trials`` trials of every side, rotating the order; returns ({side: [trial results]},
    [per side: the lowest foreign load of its trials])."""
    out = {name: [] for name in sides}
    loads = {name: [] for name in sides}
    names = list(sides)
    for t in range(trials):
        k = (r + t) % len(names)
        order = names[k:] + names[:k]
        for name in order if (r + t) % 2 == 0 else order[::-1]:
            res, load = sides[name]()
            out[name].append(res)
            loads[name].append(load)
    return out, [min(v) for v in loads.values()]


def phase_throughput(files, parse, p: Params, gate: QuietGate, bar) -> dict:
    """Input-only images/s of naive (default options, and with them off), guide and tfopt, epoch 1
    and cached epochs. Each repeat runs ``trials`` interleaved trials per side and keeps each
    side's best; the ratios of the bests are that repeat's figures."""
    kw = guide_kwargs(p)
    steps = p.images // p.batch_size

    def cached_trial(epoch):  # epoch(): the batches of the next epoch of one pipeline
        runs = [run_epoch(epoch()) for _ in range(1 + p.cached_epochs)]
        return (
            {
                "epoch1_ips": runs[0][0],
                "cached_ips": median(v for v, _ in runs[1:]),
                "cached_epochs_ips": [v for v, _ in runs[1:]],
            },
            max(f for _, f in runs),
        )

    def naive_trial():  # no cache: epoch 2 costs what epoch 1 does; it is the cached epochs' baseline
        ds = guide.naive(files, parse, **kw)
        (e1, f1), (e2, f2) = run_epoch(ds), run_epoch(ds)
        return {"epoch1_ips": e1, "epoch2_ips": e2}, max(f1, f2)

    def naive_off_trial():
        e1, f1 = run_epoch(guide.naive(files, parse, default_options=False, **kw))
        return {"epoch1_ips": e1}, f1

    sides = {
        "naive": naive_trial,
        "naive_options_off": naive_off_trial,
        # fresh pipelines: empty caches. The guide's dataset is one epoch, iterated once per epoch;
        # tfopt's is an endless stream of epochs, read one epoch at a time
        "guide": lambda: cached_trial((lambda ds: lambda: ds)(guide.optimized(files, parse, **kw))),
        "tfopt": lambda: cached_trial(
            epochs_of(tfopt_dataset(files, parse, p, tfopt_config(p)), steps)
        ),
    }

    def unit(r):
        got, loads = _interleaved(sides, p.trials, r)
        best = lambda side, key: max(t[key] for t in got[side])  # noqa: E731
        rec = {
            "trials": got,
            "naive_epoch1_ips": best("naive", "epoch1_ips"),
            "naive_epoch2_ips": best("naive", "epoch2_ips"),
            "naive_options_off_epoch1_ips": best("naive_options_off", "epoch1_ips"),
            "guide_epoch1_ips": best("guide", "epoch1_ips"),
            "guide_cached_ips": best("guide", "cached_ips"),
            "tfopt_epoch1_ips": best("tfopt", "epoch1_ips"),
            "tfopt_cached_ips": best("tfopt", "cached_ips"),
        }
        rec["epoch1_ratio"] = rec["tfopt_epoch1_ips"] / rec["naive_epoch1_ips"]
        rec["cached_ratio"] = rec["tfopt_cached_ips"] / rec["naive_epoch2_ips"]
        rec["epoch1_ratio_vs_guide"] = rec["tfopt_epoch1_ips"] / rec["guide_epoch1_ips"]
        rec["cached_ratio_vs_guide"] = rec["tfopt_cached_ips"] / rec["guide_cached_ips"]
        rec["epoch1_ratio_vs_options_off"] = (
            rec["tfopt_epoch1_ips"] / rec["naive_options_off_epoch1_ips"]
        )
        return rec, loads

    runs = []
    for r in range(p.repeats):
        runs.append(gate.run(lambda: unit(r)))
        bar.update(1)
    keys = [k for k in runs[0] if k != "trials"]
    return {"repeats": runs, **{k: median(x[k] for x in runs) for k in keys}}


def make_model(p: Params):
    """The step-time CNN: 3 strided 3x3 convs (w, 2w, 4w filters) + global pool + dense."""
    w = p.model_width
    inp = keras.Input((p.crop, p.crop, 3))
    x = keras.layers.Conv2D(w, 3, strides=2, padding="same", activation="relu")(inp)
    x = keras.layers.Conv2D(2 * w, 3, strides=2, padding="same", activation="relu")(x)
    x = keras.layers.Conv2D(4 * w, 3, strides=2, padding="same", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    out = keras.layers.Dense(NUM_CLASSES)(x)
    model = keras.Model(inp, out, name=f"b1_cnn_w{w}")
    model.compile(
        optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


class _EpochTimer(keras.callbacks.Callback):
    """Wall time and foreign load of every epoch of a fit."""

    def __init__(self):
        super().__init__()
        self.seconds: list[float] = []
        self.foreign: list[float] = []
        self._sample = None

    def on_epoch_begin(self, epoch, logs=None):
        self._sample = CpuSample().__enter__()

    def on_epoch_end(self, epoch, logs=None):
        self._sample.__exit__(None, None, None)
        self.seconds.append(self._sample.wall)
        self.foreign.append(self._sample.foreign)


def _fit(model, ds, steps: int, finite: bool = False) -> tuple[float, float]:
    """Trains one epoch of ``steps`` steps; returns (ms per step, foreign load). ``finite``: ``ds``
    holds exactly one epoch and is read to its end (so that a cache behind it completes)."""
    timer = _EpochTimer()
    model.fit(ds, epochs=1, steps_per_epoch=None if finite else steps, verbose=0, callbacks=[timer])
    return 1e3 * timer.seconds[0] / steps, timer.foreign[0]


def phase_input_bound(files, parse, p: Params, gate: QuietGate, bar) -> dict:
    """Per-step time of a real train step fed by one repeated batch (ideal) vs by the tfopt and
    the guide pipelines in their cached epochs; fraction = 1 - T(ideal) / T(real). Each repeat:
    ``trials`` interleaved one-epoch fits per side, best of each side kept. Then (information)
    tfopt's epoch 1 (decode + fill the cache) vs ideal, ``repeats`` times."""
    steps = p.images // p.batch_size
    model = make_model(p)
    first = next(iter(tfopt_dataset(files, parse, p, tfopt_config(p))))
    ideal = tf.data.Dataset.from_tensors((first[0], first[1])).repeat(steps)
    real = tfopt_dataset(files, parse, p, tfopt_config(p))
    peer = guide.optimized(files, parse, **guide_kwargs(p))
    # warm-up, not timed: traces the train function, fills both caches (every later epoch of
    # `real` and `peer` is a cached epoch)
    _fit(model, ideal, steps, finite=True)
    _fit(model, real, steps)
    _fit(model, peer, steps, finite=True)
    bar.update(1)
    sides = {
        "ideal": lambda: _fit(model, ideal, steps, finite=True),
        "tfopt": lambda: _fit(model, real, steps),
        "guide": lambda: _fit(model, peer, steps, finite=True),
    }

    def unit(r):
        got, loads = _interleaved(sides, p.trials, r)
        rec = {f"{k}_step_ms_trials": v for k, v in got.items()}
        rec.update({f"{k}_step_ms": min(v) for k, v in got.items()})
        for side in ("tfopt", "guide"):
            rec[f"{side}_input_bound_pct"] = 100.0 * (
                1.0 - rec["ideal_step_ms"] / rec[f"{side}_step_ms"]
            )
        return rec, loads

    def cold_unit():  # epoch 1 of a fresh tfopt pipeline vs ideal
        t_real, f_real = _fit(model, tfopt_dataset(files, parse, p, tfopt_config(p)), steps)
        t_ideal, f_ideal = _fit(model, ideal, steps, finite=True)
        return (
            {
                "real_epoch1_step_ms": t_real,
                "ideal_step_ms": t_ideal,
                "input_bound_pct": 100.0 * (1.0 - t_ideal / t_real),
            },
            [f_real, f_ideal],
        )

    runs, cold = [], []
    for r in range(p.repeats):
        runs.append(gate.run(lambda: unit(r)))
        cold.append(gate.run(cold_unit))
        bar.update(1)
    return {
        "model": model.name,
        "model_params": int(model.count_params()),
        "model_desc": (
            f"Conv2D {p.model_width}/{2 * p.model_width}/{4 * p.model_width} filters, 3x3 stride 2, "
            f"ReLU -> GlobalAvgPool -> Dense {NUM_CLASSES}; SGD momentum; input "
            f"{p.crop}x{p.crop}x3, batch {p.batch_size}"
        ),
        "steps_per_epoch": steps,
        "repeats": runs,
        "ideal_step_ms": median(x["ideal_step_ms"] for x in runs),
        "tfopt_step_ms": median(x["tfopt_step_ms"] for x in runs),
        "guide_step_ms": median(x["guide_step_ms"] for x in runs),
        "input_bound_pct": median(x["tfopt_input_bound_pct"] for x in runs),
        "guide_input_bound_pct": median(x["guide_input_bound_pct"] for x in runs),
        "epoch1": {
            "repeats": cold,
            "input_bound_pct": median(x["input_bound_pct"] for x in cold),
            "real_epoch1_step_ms": median(x["real_epoch1_step_ms"] for x in cold),
            "ideal_step_ms": median(x["ideal_step_ms"] for x in cold),
        },
    }


def _knobs_name(k: dict) -> str:
    if not k:
        return "AUTOTUNE"
    return (
        f"calls={k['num_parallel_calls']},cycle={k['interleave_cycle_length']},"
        f"prefetch={k['prefetch_buffer']}"
    )


def grid_knobs(p: Params) -> list[dict]:
    """The hand grid: parallel calls x interleave cycle (= parallel reads) x prefetch buffer."""
    return [
        dict(
            num_parallel_calls=calls,
            interleave_cycle_length=cyc,
            num_parallel_reads=cyc,
            prefetch_buffer=pf,
        )
        for calls, cyc, pf in itertools.product(p.grid_calls, p.grid_cycle, p.grid_prefetch)
    ]


def phase_autotune(files, parse, p: Params, gate: QuietGate, bar) -> dict:
    """AUTOTUNE vs a hand grid, cache off (every epoch runs the tuned stages), input only.

    Sweep: every config once per repeat (rotating order); a config's score is its best epoch.
    Confirm: AUTOTUNE vs the winning hand config, ``repeats`` x ``trials`` interleaved epochs,
    best per side per repeat, median of the per-repeat gaps (picking the best of many noisy
    sweep figures alone would flatter the hand grid).
    """
    configs = [{}] + grid_knobs(p)
    steps = p.images // p.batch_size

    def measure(knobs: dict):
        return lambda: run_epoch(
            epochs_of(
                tfopt_dataset(files, parse, p, tfopt_config(p, cache="none", **knobs)), steps
            )()
        )

    sweep: dict[str, list[float]] = {_knobs_name(k): [] for k in configs}
    for r in range(p.repeats):
        shift = (r * len(configs)) // p.repeats  # rotate the order to spread drift
        for k in configs[shift:] + configs[:shift]:
            sweep[_knobs_name(k)].append(gate.run(lambda: (lambda v, f: (v, [f]))(*measure(k)())))
            bar.update(1)
    best_ips = {name: max(v) for name, v in sweep.items()}
    best_knobs = max(configs[1:], key=lambda k: best_ips[_knobs_name(k)])
    best = _knobs_name(best_knobs)

    def unit(r):
        got, loads = _interleaved({"AUTOTUNE": measure({}), best: measure(best_knobs)}, p.trials, r)
        a, b = max(got["AUTOTUNE"]), max(got[best])
        return {
            "autotune_ips": a,
            "best_hand_ips": b,
            "gap_pct": 100.0 * (1.0 - a / b),
            "autotune_trials": got["AUTOTUNE"],
            "best_hand_trials": got[best],
        }, loads

    pairs = []
    for r in range(p.repeats):
        pairs.append(gate.run(lambda: unit(r)))
        bar.update(1)
    return {
        "cache": "none",
        "grid": {
            "num_parallel_calls": list(p.grid_calls),
            "interleave_cycle_length (= num_parallel_reads)": list(p.grid_cycle),
            "prefetch_buffer": list(p.grid_prefetch),
        },
        "sweep_ips": sweep,
        "sweep_best_ips": best_ips,
        "best_hand": best,
        "sweep_gap_pct": 100.0 * (1.0 - best_ips["AUTOTUNE"] / best_ips[best]),
        "confirm": pairs,
        "autotune_ips": median(x["autotune_ips"] for x in pairs),
        "best_hand_ips": median(x["best_hand_ips"] for x in pairs),
        "autotune_gap_pct": median(x["gap_pct"] for x in pairs),
    }


# --------------------------------------------------------------------------------------------


def parse_args(argv=None):
    ap = script_parser(
        __doc__,
        "ingestion",
        "tiny data, 1 repeat: runs in seconds (for tests)",
        workdir=None,
        workdir_help="where the JPEG shards are made and reused (default $TFOPT_DATA_DIR or "
        "~/.cache/tfopt, subdir bench)",
    )
    ap.add_argument("--repeats", type=int, default=None, help="repeats per measurement (default 3)")
    ap.add_argument("--images", type=int, default=None, help="number of images (default 2048)")
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--cached-epochs", type=int, default=None)
    ap.add_argument(
        "--trials",
        type=int,
        default=None,
        help="interleaved trials per side within a repeat, best kept (default 3)",
    )
    ap.add_argument("--model-width", type=int, default=None)
    ap.add_argument(
        "--quiet-threshold",
        type=float,
        default=0.15,
        help="re-run a unit when other processes used more than this share of the cores "
        "(default 0.15; 1 disables)",
    )
    ap.add_argument(
        "--max-wait",
        type=float,
        default=90.0,
        help="seconds the whole run may spend waiting for other processes to quiet down "
        "and re-running disturbed units (default 90)",
    )
    args = ap.parse_args(argv)
    over = dict(SMOKE) if args.smoke else {}
    for name in ("repeats", "trials", "images", "batch_size", "cached_epochs", "model_width"):
        if getattr(args, name) is not None:
            over[name] = getattr(args, name)
    p = Params(**over)
    if p.repeats < 1 or p.trials < 1 or p.cached_epochs < 1:
        ap.error("--repeats, --trials and --cached-epochs must be >= 1")
    if p.images < p.batch_size * 2:
        ap.error("--images must be at least twice --batch-size")
    gate = QuietGate(
        threshold=args.quiet_threshold,
        max_wait=0.0 if args.smoke else args.max_wait,
        retries=0 if args.smoke else 1,
        enabled=not args.smoke and args.quiet_threshold < 1,
    )
    workdir = args.workdir or os.path.join(default_data_dir(), "bench")
    return p, gate, args.out, workdir


def check_sides_agree(files, parse, p: Params) -> None:
    """Same output contract from every side (shape, dtype, value range), or the comparison is
    meaningless; this also traces (and compiles) every pipeline once before anything is timed."""
    kw = guide_kwargs(p)
    batches = {
        "naive": next(iter(guide.naive(files, parse, **kw))),
        "guide": next(iter(guide.optimized(files, parse, **kw))),
        "tfopt": next(iter(tfopt_dataset(files, parse, p, tfopt_config(p)))),
    }
    ref = batches["naive"]
    for side, b in batches.items():
        for a, x in zip(ref, b):
            if a.dtype != x.dtype or a.shape != x.shape:
                raise RuntimeError(
                    f"[B1] naive and {side} batches differ: {a.dtype}{a.shape} vs {x.dtype}{x.shape}"
                )
        lo, hi = float(tf.reduce_min(b[0])), float(tf.reduce_max(b[0]))
        if not (
            -2.15 < lo < -0.5 and 0.5 < hi < 2.65
        ):  # [0, 255] normalized with ImageNet mean/std
            raise RuntimeError(
                f"[B1] {side} images span [{lo:.2f}, {hi:.2f}], not the normalized pixel range"
            )


def first_augment_seconds(p: Params) -> float:
    """Seconds to the first batch crop_flip returns in this process: tracing and XLA compilation,
    paid once per process (the library reuses the compiled kernel in every later pipeline); it
    happens here, before anything is timed."""
    images = np.zeros((p.batch_size, p.resize, p.resize, 3), np.uint8)
    ds = tf.data.Dataset.from_tensors((images, np.zeros(p.batch_size, np.int32)))
    t0 = time.perf_counter()
    next(iter(ds.apply(crop_flip_augment(tfopt_config(p), seed=0))))
    return time.perf_counter() - t0


def main(argv=None) -> int:
    p, gate, out, workdir = parse_args(argv)
    t_start = time.perf_counter()
    files, data_info = ensure_dataset(workdir, p)
    parse = make_parse(p)
    compile_seconds = first_augment_seconds(p)
    check_sides_agree(files, parse, p)

    n_configs = 1 + len(grid_knobs(p))
    total = p.repeats + (1 + p.repeats) + (p.repeats * n_configs + p.repeats)
    res = {
        "benchmark": "B1 ingestion",
        "params": dataclasses.asdict(p),
        "augment_xla": xla_available(),
        "augment_first_batch_seconds": round(compile_seconds, 3),
        "peer": {
            "name": "tf.data guide",
            "module": "bench/peers/tf_data_guide.py",
            "source": guide.GUIDE,
        },
        "dataset": data_info,
    }
    with tqdm(total=total, desc="B1", unit="unit", disable=None, file=sys.stderr) as bar:
        bar.set_postfix_str("throughput")
        res["throughput"] = phase_throughput(files, parse, p, gate, bar)
        bar.set_postfix_str("input-bound")
        res["input_bound"] = phase_input_bound(files, parse, p, gate, bar)
        bar.set_postfix_str("autotune sweep")
        res["autotune"] = phase_autotune(files, parse, p, gate, bar)
    res["quiet_gate"] = gate.summary()
    res["wall_seconds"] = round(time.perf_counter() - t_start, 1)
    figs = figures(res)
    payload = result("B1", "ingestion", COMMAND + (" --smoke" if p.smoke else ""), figs, **res)
    keys = ("epoch1_ratio", "cached_ratio", "input_bound_pct", "autotune_gap_pct")
    payload["targets"] = {
        k: {
            "op": f["op"],
            "value": f["bound"],
            "measured": f["value"],
            "pass": None if f["status"] == "n/a" else f["status"] == "pass",
        }
        for k, f in zip(keys, figs)
    }
    return publish(payload, out, "B1", table=report(payload, p))


if __name__ == "__main__":
    sys.exit(main())
