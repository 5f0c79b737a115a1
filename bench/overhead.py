"""Benchmark B7 (framework overhead): ``python -m tfopt.train`` vs a bare tf_keras ``fit`` of the same model.

What it does, in one run on one machine (protocol: BENCHMARKS.md, row B7):

Three sides train the default ``cnn`` on real MNIST (the first ``--limit`` records of tfopt's
train and validation splits; default 4096, i.e. 32 steps per epoch), global batch 128, 3 epochs,
Adam with the same cosine decay, from the same initial weights:

  tfopt         ``tfopt.train.stage.run`` (the library entry of ``python -m tfopt.train``, its flags
                parsed by tfopt's own CLI code, every default kept: its tf.data pipeline, validation,
                progress bar, metrics files, TensorBoard, the epoch-end backup, its automatic
                ``steps_per_execution``);
  bare_tuned    the peer (``bench/peers/bare_fit.py``: the Keras guide's ``fit`` on NumPy arrays with
                ``validation_data``) with tfopt's ``steps_per_execution``;
  bare_default  the same peer with Keras' defaults (one step per ``tf.function`` call);

in three cells: float32 under ``one_device`` and under ``mirrored`` (2 logical CPU devices, tfopt's
factory on both sides), and ``mixed_bfloat16`` under ``one_device`` (tfopt and the tuned bare fit:
the CPU may have no bf16 hardware, the ratio still means something). ``--precisions`` and
``--strategies`` pick a subset.

What is timed: every process adds one Keras callback (the same on every side, first in the list)
that timestamps epoch begins, execution ends (``on_train_batch_end``, after the device finished:
eager calls are synchronous on CPU) and the end of training. The first epoch (tracing, the
tf.data cache filling) is warm-up. Per-step time = the time from each later epoch's begin to its
last step, summed, over their steps: steps only, what the target is about. Epoch cycle time (info)
= from the second epoch's begin to the end of training, over the same steps: it adds what runs at
each epoch end (validation on both sides; tfopt's metrics files, TensorBoard and backup). Each
process ends right after training (the test evaluation and model export that follow are not
measured on either side).

Figures (medians over ``--repeats`` interleaved repeats, with their range): tfopt per-step time /
tuned bare per-step time - 1 in % per strategy and precision (target <= 2%); the same against bare
defaults and for the epoch cycle (info); tfopt's mirrored vs one_device throughput (info). Each
side runs in its own process (a fresh TensorFlow); within a repeat the sides' order rotates.
Shared machine: a repeat disturbed by other processes (> ``--quiet-threshold`` of the cores,
/proc/stat over each timed window) is re-run within a time budget.

    PYTHONPATH=. python bench/overhead.py            # ~15-20 min on 2 cores -> bench/results/overhead.json
    PYTHONPATH=. python bench/overhead.py --limit 0  # the whole 50k training split (~1 h on a slow 2-core VM)
    PYTHONPATH=. python bench/overhead.py --smoke    # tiny, one repeat (~1 min: 5 TensorFlow start-ups); a test
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if __package__ in (None, ""):  # run as a script: make `bench` and `tfopt` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Nothing imported at module level starts TensorFlow: `mirrored` must split the CPU first.
from bench._common import (  # noqa: E402
    CpuSample,
    QuietGate,
    publish,
    result,
    script_parser,
)

# The benchmark's parts, by job (each under 600 lines).
from bench._overhead_params import (  # noqa: E402
    PRECISIONS,
    SCRIPT,
    SIDES,
    SMOKE,
    STRATEGIES,
    Params,
)
from bench._overhead_report import (  # noqa: E402
    cycle_ms,
    examples_per_sec,
    figures,
    report_text,
    step_ms,
)

# ============================================================================================
# The harness: one training process (``overhead.py _run --side S ... -- <tfopt.train flags>``)
# ============================================================================================


class _Done(Exception):
    """Raised by the clock when training ended: skips tfopt's test evaluation and model export."""


def _clock(keras, stop: bool, trace: bool = False):
    """The timing callback every side runs first (see the module docstring); ``stop`` ends the run,
    ``trace`` also keeps the end time of every execution (for diagnosis; not in the published JSON)."""

    class Clock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epoch = 0
            self.epoch_begin: list[float] = []
            self.last_step: list[int] = []
            self.last_step_end: list[float] = []
            self.executions: list[int] = []
            self.trace: list[list[float]] | None = [] if trace else None
            self.train_end = None
            self.sample = None
            self.facts: dict = {}

        def on_train_begin(self, logs=None):
            from tfopt.runtime import weights_digest

            spe = getattr(self.model, "_steps_per_execution", None)  # tf_keras: a variable
            self.facts = {
                "initial_weights_sha256": weights_digest(self.model),
                "steps_per_execution": int(spe.numpy()) if spe is not None else None,
                "steps_per_epoch": int(self.params["steps"]),
                "epochs": int(self.params["epochs"]),
                "policy": keras.mixed_precision.global_policy().name,
                "distribute_strategy": type(self.model.distribute_strategy).__name__,
                "replicas": int(self.model.distribute_strategy.num_replicas_in_sync),
                "params": int(self.model.count_params()),
            }

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = int(epoch)
            if self.epoch == 1:  # the timed part starts: watch the machine from here
                self.sample = CpuSample().__enter__()
            self.epoch_begin.append(time.perf_counter())
            self.last_step.append(0)
            self.last_step_end.append(float("nan"))
            self.executions.append(0)
            if self.trace is not None:
                self.trace.append([])

        def on_train_batch_end(self, batch, logs=None):
            self.last_step_end[-1] = time.perf_counter()
            self.last_step[-1] = int(batch) + 1
            self.executions[-1] += 1
            if self.trace is not None:
                self.trace[-1].append(self.last_step_end[-1])

        def on_train_end(self, logs=None):
            self.train_end = time.perf_counter()
            if self.sample is not None:
                self.sample.__exit__(None, None, None)
            if stop:
                raise _Done()

        def report(self) -> dict:
            t0 = self.epoch_begin[0]
            s = self.sample
            return {
                **self.facts,
                "epoch_begin_s": [t - t0 for t in self.epoch_begin],
                "last_step_end_s": [t - t0 for t in self.last_step_end],
                "steps": self.last_step,
                "executions": self.executions,
                "train_end_s": self.train_end - t0,
                **(
                    {"trace_s": [[t - t0 for t in e] for e in self.trace]}
                    if self.trace is not None
                    else {}
                ),
                "window": None
                if s is None
                else {"wall_s": s.wall, "own_cpu_s": s.own_cpu, "foreign_load": s.foreign},
            }

    return Clock()


def harness(argv: list[str]) -> int:
    """``overhead.py _run --side S --report FILE [--steps-per-execution N] -- <tfopt.train flags>``."""
    cut = argv.index("--")
    ap = argparse.ArgumentParser(prog="overhead.py _run")
    ap.add_argument("--side", choices=SIDES, required=True)
    ap.add_argument("--report", required=True)
    ap.add_argument("--steps-per-execution", type=int, default=0, help="bare_tuned: tfopt's choice")
    ap.add_argument(
        "--trace", action="store_true", help="keep every execution's end time (diagnosis)"
    )
    args = ap.parse_args(argv[:cut])

    # Both sides take their settings from the same `python -m tfopt.train` flags, parsed by tfopt.
    from tfopt.config import cli

    parser = cli.ArgumentParser(prog="python -m tfopt.train")
    cli.add_config_args(parser)
    targs = parser.parse_args(argv[cut + 1 :])
    cfg = cli.config_from_args(targs)

    started = time.perf_counter()
    if args.side == "tfopt":
        from tfopt import keras
        from tfopt.train import run

        clock = _clock(keras, stop=True, trace=args.trace)
        try:
            run(cfg, overwrite=targs.overwrite, callbacks=[clock])
        except _Done:
            pass
    else:
        from bench.peers import bare_fit
        from tfopt import keras

        strategy = bare_fit.make_strategy(
            cfg.runtime.strategy, cfg.runtime.cpu_replicas
        )  # before any TF work
        arrays, shape, classes = bare_fit.load_arrays(cfg.data)
        steps = len(arrays["train"][0]) // cfg.data.global_batch_size
        model = bare_fit.build(
            strategy,
            precision=cfg.runtime.precision,
            model_name=cfg.model.name,
            image_shape=shape,
            num_classes=classes,
            dropout=cfg.model.dropout,
            seed=cfg.train.seed,
            learning_rate=cfg.train.learning_rate,
            total_steps=cfg.train.epochs * steps,
            steps_per_execution=args.steps_per_execution if args.side == "bare_tuned" else None,
        )
        clock = _clock(keras, stop=False, trace=args.trace)
        bare_fit.fit(
            model,
            arrays,
            batch_size=cfg.data.global_batch_size,
            epochs=cfg.train.epochs,
            callbacks=[clock],
        )
    if clock.train_end is None:
        raise RuntimeError("training did not finish")
    report = {
        "side": args.side,
        "strategy": cfg.runtime.strategy,
        "precision": cfg.runtime.precision,
        "global_batch_size": cfg.data.global_batch_size,
        "process_s": time.perf_counter() - started,
        **clock.report(),
    }
    with open(args.report + ".tmp", "w", encoding="utf-8") as f:
        json.dump(report, f)
    os.replace(args.report + ".tmp", args.report)
    return 0


# ============================================================================================
# The orchestrator
# ============================================================================================


def train_flags(p: Params, strategy: str, precision: str, out: str) -> list[str]:
    """The ``python -m tfopt.train`` flags of one cell (every other setting is tfopt's default)."""
    flags = [
        "--strategy",
        strategy,
        "--precision",
        precision,
        "--model",
        p.model,
        "--dataset",
        "mnist",
        "--batch-size",
        str(p.batch),
        "--epochs",
        str(p.epochs),
        "-o",
        out,
    ]
    return flags + (["--limit", str(p.limit)] if p.limit else [])


def _tail(path: str, n: int = 40) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


class Runner:
    """Starts one process per side and collects its report."""

    def __init__(self, p: Params, root: str, timeout: float):
        self.p, self.root, self.timeout, self.n = p, root, timeout, 0
        env = dict(os.environ)
        env.pop("TF_CONFIG", None)
        env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        self.env = env
        self.spe: dict[tuple, int] = {}  # (strategy, precision) -> tfopt's steps_per_execution

    def side(self, side: str, strategy: str, precision: str) -> dict:
        self.n += 1
        wd = os.path.join(self.root, f"{self.n:03d}-{side}-{strategy}-{precision}")
        os.makedirs(wd)
        report, log = os.path.join(wd, "report.json"), os.path.join(wd, "log.txt")
        own = ["--side", side, "--report", report]
        if side == "bare_tuned":
            own += ["--steps-per-execution", str(self.spe[(strategy, precision)])]
        cmd = [
            sys.executable,
            SCRIPT,
            "_run",
            *own,
            "--",
            *train_flags(self.p, strategy, precision, os.path.join(wd, "run")),
        ]
        with open(log, "w") as f:
            try:
                code = subprocess.run(
                    cmd,
                    env=self.env,
                    cwd=REPO,
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    timeout=self.timeout,
                ).returncode
            except subprocess.TimeoutExpired:
                code = f"a timeout ({self.timeout:.0f} s)"
        if code != 0 or not os.path.isfile(report):
            raise RuntimeError(
                f"[B7] {side} ({strategy}, {precision}) failed with {code}; its log ({log}) ends "
                f"with:\n{_tail(log)}"
            )
        with open(report, encoding="utf-8") as f:
            out = json.load(f)
        shutil.rmtree(wd, ignore_errors=True)
        if side == "tfopt":
            self.spe.setdefault((strategy, precision), out["steps_per_execution"])
        out.update(
            step_ms=step_ms(out), cycle_ms=cycle_ms(out), examples_per_sec=examples_per_sec(out)
        )
        return out


def order(sides: tuple, r: int) -> list[str]:
    """The sides' order in repeat ``r``: tfopt first in repeat 0 (the tuned bare fit takes its
    steps_per_execution), then rotated, so that no side always runs first or last."""
    k = r % len(sides)
    return list(sides[k:] + sides[:k])


def measure(p: Params, runner: Runner, gate: QuietGate, bar) -> list[dict]:
    """Every cell, ``p.repeats`` times, sides interleaved; one record per cell and repeat."""
    out = []
    for r in range(p.repeats):
        for prec, strat, sides in p.cells if r % 2 == 0 else p.cells[::-1]:

            def unit(r=r, prec=prec, strat=strat, sides=tuple(sides)):
                rec = {"repeat": r, "precision": prec, "strategy": strat, "order": order(sides, r)}
                for side in rec["order"]:
                    bar.set_postfix_str(f"{r + 1}/{p.repeats} {strat} {prec} {side}")
                    rec[side] = runner.side(side, strat, prec)
                return rec, [rec[s]["window"]["foreign_load"] for s in sides]

            out.append(gate.run(unit))
            bar.update(1)
    return out


def parse_args(argv=None):
    ap = script_parser(
        __doc__,
        "overhead",
        "tiny data, one repeat, float32 only (for tests)",
        workdir=None,
        workdir_help="scratch directory for the runs (default: a temp dir)",
    )
    ap.add_argument("--repeats", type=int, default=None, help="repeats per cell (default 3)")
    ap.add_argument(
        "--epochs", type=int, default=None, help="epochs per run, the first is warm-up (default 3)"
    )
    ap.add_argument(
        "--limit",
        type=int,
        default=None,
        help="records per split (default 4096: 32 steps per epoch; 0 = the whole 50k training split)",
    )
    ap.add_argument(
        "--strategies", default=None, help=f"comma-separated subset of {','.join(STRATEGIES)}"
    )
    ap.add_argument(
        "--precisions", default=None, help=f"comma-separated subset of {','.join(PRECISIONS)}"
    )
    ap.add_argument("--timeout", type=float, default=None, help="seconds any one process may take")
    ap.add_argument(
        "--quiet-threshold",
        type=float,
        default=0.15,
        help="re-run a repeat when other processes used more than this share of the cores "
        "(default 0.15; 1 disables)",
    )
    ap.add_argument(
        "--max-wait",
        type=float,
        default=120.0,
        help="seconds the whole run may spend waiting for quiet and re-running (default 120)",
    )
    args = ap.parse_args(argv)
    over: dict = dict(SMOKE) if args.smoke else {}
    cells = over.get("cells", Params.cells)
    for index, (name, choices) in enumerate(
        (("precisions", PRECISIONS), ("strategies", STRATEGIES))
    ):
        value = getattr(args, name)
        if value is not None:
            picked = tuple(x.strip() for x in value.split(",") if x.strip())
            if not picked or any(x not in choices for x in picked):
                ap.error(f"--{name} takes a comma-separated subset of {','.join(choices)}")
            cells = tuple(c for c in cells if c[index] in picked)
    over["cells"] = cells
    for name in ("repeats", "epochs", "limit"):
        if getattr(args, name) is not None:
            over[name] = getattr(args, name)
    p = Params(**over)
    if p.repeats < 1 or p.epochs < 2 or p.limit < 0 or not p.cells:
        ap.error(
            "--repeats must be >= 1, --epochs >= 2 (the first epoch is warm-up), --limit >= 0, and "
            "--precisions/--strategies must leave a measured cell"
        )
    gate = QuietGate(
        threshold=args.quiet_threshold,
        max_wait=0.0 if args.smoke else args.max_wait,
        retries=0 if args.smoke else 1,
        enabled=not args.smoke and args.quiet_threshold < 1,
    )
    return p, gate, args


def main(argv=None) -> int:
    p, gate, args = parse_args(argv)
    from tqdm import tqdm

    from tfopt import __version__ as tfopt_version

    t_start = time.perf_counter()
    out = args.out
    if args.workdir:  # a new directory is made, like the default one
        os.makedirs(args.workdir, exist_ok=True)
    root = tempfile.mkdtemp(prefix="b7-", dir=args.workdir)
    runner = Runner(p, root, args.timeout or (300.0 if p.smoke else 1200.0))
    units = p.repeats * len(p.cells)
    try:
        with tqdm(total=units, desc="B7", unit="repeat", disable=None, file=sys.stderr) as bar:
            runs = measure(p, runner, gate, bar)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    command = "PYTHONPATH=. python bench/overhead.py" + (" --smoke" if p.smoke else "")
    res = result(
        "B7",
        "framework overhead",
        command,
        figures(runs, p),
        benchmark="B7 framework overhead",
        params=dataclasses.asdict(p),
        sides=SIDES,
        runs=runs,
        quiet_gate=gate.summary(),
        wall_seconds=round(time.perf_counter() - t_start, 1),
    )
    res["environment"]["tfopt"] = tfopt_version
    return publish(res, out, "B7", table=report_text(res, p))


def _harness_main(argv: list[str]) -> int:
    try:
        code = harness(argv)
    except BaseException:  # noqa: BLE001 - the harness reports every failure in its log and exit code
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip TensorFlow's teardown: the report is written


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_run":
        _harness_main(sys.argv[2:])
    sys.exit(main())
