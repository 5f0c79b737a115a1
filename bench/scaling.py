"""Benchmark B3 (multi-worker scaling): MultiWorkerMirrored efficiency, all-reduce time, backup cost.

What it does, in one run on one machine (protocol: BENCHMARKS.md, row B3):

1. Scaling efficiency, the compute-heavy ``wide_cnn`` on MNIST, per-process batch B, the same steps
   everywhere (warm-up steps untimed, then the timed steps), three sides per repeat:
     a: 1 ``one_device`` process pinned to the first core (``--cores``, default 0,1), batch B;
     b: 2 ``multi_worker_mirrored`` workers started by ``python -m tfopt.launch --workers 2``,
        each pinned to its own core, global batch 2B (B per worker);
     c: the control: 2 independent ``one_device`` processes, each pinned to its own core, batch
        B each, run concurrently (no all-reduce); their timed windows start together (a file
        barrier after the warm-up).
   Efficiency = throughput(b) / throughput(c) (target >= 0.90); weak scaling = throughput(b) /
   (2 x throughput(a)), information only.
2. All-reduce time of 1, 4, 16, 64 MB float32 tensors between 2 MultiWorkerMirrored workers
   (each pinned to its own core, the strategy made by tfopt's own ``connect``): an all-reduce
   inside ``strategy.run`` in a ``tf.function``, warm-up calls excluded, a tiny all-reduce before
   each timed call so both workers start together, median of the timed calls. Compared with the
   ring model ``2(N-1)/N * size / bandwidth``, bandwidth = loopback TCP measured between the same
   two pinned processes in the same run (a 256 MB copy, before and after the all-reduces).
3. Backup overhead: time per step of ``python -m tfopt.train --strategy one_device --backup-every
   50`` vs the same command without it (``cnn``, tfopt's default batch 128, unpinned: what a user
   runs), sides interleaved. Only in-epoch steps are timed, so the backup every run writes at its
   epoch end is outside both windows; inside the window there is one backup every 50 steps.
   Target <= 3% slower. Information only, free of run-to-run drift: inside the backup run, the
   executions (tf.function calls of tfopt's steps_per_execution steps) that hold a backup vs those
   that do not.

4. Links: side b again, its 2 workers on two simulated hosts (``tfopt launch --hosts 2 --link
   RATE``: network namespaces on a bridge, veth pairs shaped by tc each way) at 1, 10 and 25
   Gbit/s, and on the loopback in the same run; each with the float32 all-reduce, with
   ``--bytes-per-pack`` and with ``--allreduce-dtype bfloat16``; efficiency against the same
   repeat's control (side c). Bytes per step: what each worker's veth sent over the timed window
   (the kernel's counters), beside the ring model's 2(N-1)/N x gradient bytes.

``--phases`` runs a subset; the phases not run keep their results from the existing JSON, which
records where (``kept_from``: date, CPU and flags).

How the processes are measured: every training process is ``tfopt.train.stage.run`` (the
library entry of ``python -m tfopt.train``; its flags are parsed by tfopt's own CLI code) with one
extra Keras callback that timestamps step boundaries (after the loss is fetched, i.e. after the
device finished) and ends the process right after its timed window, skipping the evaluation and
model export that follow training (identical on every side). Time per step = window wall time /
window steps: the mean, so rare backups are counted.

Pinning: each harness process calls ``sched_setaffinity`` on itself (what ``taskset -c K`` does)
before TensorFlow is imported, so every thread it ever starts inherits the one-core mask; a
launched worker picks its core from TF_CONFIG's task index (the launcher runs the same command for
every task). tfopt sets no thread counts for these strategies; TensorFlow sizes its inter-op,
intra-op and tf.data pools from the affinity mask, and reads ``TF_NUM_INTRAOP_THREADS`` /
``TF_NUM_INTEROP_THREADS`` when its context starts (``tf.config.threading`` reports 0, "default",
either way). Pinned processes get both set to 1 (``--intra-threads``/``--inter-threads``; with
one core TensorFlow's default is 1 anyway). Each process records its affinity, those variables
and its threads by name in the JSON.

Noise (a shared machine): sides interleaved (a b c, then c b a, ...), medians over repeats with
their range; each harness reports the machine's busy CPU over its window minus its own and its
siblings' CPU (foreign load); a repeat disturbed by other processes is re-run within a time
budget (``--quiet-threshold``, ``--max-wait``). Prints a markdown table and writes JSON.

    PYTHONPATH=. python bench/scaling.py          # 25-40 min on 2 cores -> bench/results/scaling.json
    PYTHONPATH=. python bench/scaling.py --smoke  # tiny, one repeat (~1 min: 7 TensorFlow start-ups); a test
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if __package__ in (None, ""):  # run as a script: make `bench` and `tfopt` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Nothing imported at module level starts TensorFlow: a harness must pin its core first.
from bench._common import (  # noqa: E402
    QuietGate,
    environment_light,
    lscpu_info,
    publish,
    script_parser,
)

# The benchmark's parts, by job (each under 600 lines); the tests read side_throughput and
# link_row from here.
from bench._scaling_harness import (  # noqa: E402
    harness_allreduce,
    harness_train,
)
from bench._scaling_params import (  # noqa: E402
    PHASES,
    SMOKE,
    TARGETS,
    Params,
)
from bench._scaling_phases import (  # noqa: E402
    link_row,  # noqa: F401
    phase_allreduce,
    phase_backup,
    phase_links,
    phase_scaling,
)
from bench._scaling_report import (  # noqa: E402
    _check,
    figures,
    report,
)
from bench._scaling_sides import (  # noqa: E402
    Ctx,
    side_throughput,  # noqa: F401
)


def parse_args(argv=None):
    ap = script_parser(
        __doc__,
        "scaling",
        "tiny, 1 repeat: about a minute, mostly TensorFlow start-ups (for tests)",
        workdir=None,
        workdir_help="scratch directory for run directories (default: a temp dir)",
    )
    ap.add_argument("--repeats", type=int, default=None, help="repeats per measurement (default 3)")
    ap.add_argument(
        "--phases", default=",".join(PHASES), help=f"comma-separated subset of {','.join(PHASES)}"
    )
    ap.add_argument(
        "--cores", default=None, help="the two cores to pin to (default: the first two usable)"
    )
    ap.add_argument(
        "--model", default=None, help="the registered model of the scaling phase (default wide_cnn)"
    )
    ap.add_argument("--batch", type=int, default=None, help="per-process batch B (default 64)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per process (default 256)")
    ap.add_argument("--warmup-steps", type=int, default=None)
    ap.add_argument("--allreduce-iters", type=int, default=None)
    ap.add_argument("--backup-steps", type=int, default=None)
    ap.add_argument("--backup-batch", type=int, default=None)
    ap.add_argument(
        "--intra-threads",
        type=int,
        default=None,
        help="TF_NUM_INTRAOP_THREADS of the pinned processes (default 1; 0 = TensorFlow's default)",
    )
    ap.add_argument(
        "--inter-threads",
        type=int,
        default=None,
        help="TF_NUM_INTEROP_THREADS of the pinned processes (default 1; 0 = TensorFlow's default)",
    )
    ap.add_argument(
        "--backup-pinned", action="store_true", help="pin the backup runs to one core, like side a"
    )
    ap.add_argument(
        "--isolate",
        choices=("auto", "on", "off"),
        default="auto",
        help="run the TensorFlow servers in a private network namespace (tfopt.launch --isolate); "
        "auto: when this user can",
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
    over = dict(SMOKE) if args.smoke else {}
    for name in (
        "model",
        "repeats",
        "batch",
        "steps",
        "warmup_steps",
        "backup_steps",
        "backup_batch",
        "intra_threads",
        "inter_threads",
    ):
        if getattr(args, name) is not None:
            over[name] = getattr(args, name)
    if args.allreduce_iters is not None:
        over["allreduce_iters"] = args.allreduce_iters
    if args.backup_pinned:
        over["backup_pinned"] = True
    p = Params(**over)
    phases = [x.strip() for x in args.phases.split(",") if x.strip()]
    if not phases or any(x not in PHASES for x in phases):
        ap.error(f"--phases takes a comma-separated subset of {','.join(PHASES)}")
    if p.repeats < 1 or p.steps < 1 or p.backup_steps < p.backup_every or p.allreduce_iters < 1:
        ap.error(
            "--repeats, --steps, --allreduce-iters must be >= 1 and --backup-steps >= the backup interval"
        )
    usable = sorted(os.sched_getaffinity(0))
    cores = [int(c) for c in args.cores.split(",")] if args.cores else usable[:2]
    if len(cores) < 2 or len(set(cores)) < 2 or any(c not in usable for c in cores):
        ap.error(f"B3 needs two distinct usable cores (usable: {usable}); give --cores A,B")
    gate = QuietGate(
        threshold=args.quiet_threshold,
        max_wait=0.0 if args.smoke else args.max_wait,
        retries=0 if args.smoke else 1,
        enabled=not args.smoke and args.quiet_threshold < 1,
    )
    out = args.out
    return p, phases, cores, gate, out, args


def _previous(out: str, phases: list[str]) -> dict | None:
    """The earlier result file a run of some phases only updates (None for a full run)."""
    if set(phases) == set(PHASES) or not os.path.exists(out):
        return None
    with open(out, encoding="utf-8") as f:
        return json.load(f)


def _isolation(mode: str) -> bool:
    if mode == "off":
        return False
    from tfopt.core import ConfigError
    from tfopt.launch import isolation_prefix

    try:
        isolation_prefix()
        return True
    except ConfigError:
        if mode == "on":
            raise
        return False


def main(argv=None) -> int:
    p, phases, cores, gate, out, args = parse_args(argv)
    from tqdm import tqdm

    from tfopt import __version__ as tfopt_version

    t_start = time.perf_counter()
    isolate = _isolation(args.isolate)
    if args.workdir:  # a new directory is made, like the default one
        os.makedirs(args.workdir, exist_ok=True)
    root = tempfile.mkdtemp(prefix="b3-", dir=args.workdir)
    timeout = args.timeout or (240.0 if p.smoke else 900.0)
    ctx = Ctx(p, cores, isolate, root, timeout)
    res: dict = {
        "id": "B3",
        "title": "multi-worker scaling",
        "command": "PYTHONPATH=. python bench/scaling.py",
        "benchmark": "B3 multi-worker scaling",
        "params": dataclasses.asdict(p),
        "phases": phases,
        "cores": cores,
        "isolated_network": isolate,
        "environment": {**environment_light(), "tfopt": tfopt_version},
        "lscpu": lscpu_info(),
        "scaling": None,
        "allreduce": None,
        "backup": None,
        "links": None,
    }
    previous = _previous(out, phases)
    try:
        with tqdm(
            total=p.repeats * len(phases), desc="B3", unit="repeat", disable=None, file=sys.stderr
        ) as bar:
            if "scaling" in phases:
                res["scaling"] = phase_scaling(ctx, gate, bar)
            if "allreduce" in phases:
                res["allreduce"] = phase_allreduce(ctx, gate, bar)
            if "backup" in phases:
                res["backup"] = phase_backup(ctx, gate, bar)
            if "links" in phases:
                res["links"] = phase_links(ctx, gate, bar)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if previous:  # the phases not run now keep their earlier results
        for phase in PHASES:
            if phase not in phases and previous.get(phase):
                res[phase] = previous[phase]
        res["phases"] = [x for x in PHASES if res.get(x)]
        res["kept_from"] = {  # where the kept phases were measured: perhaps another machine
            "phases": [x for x in PHASES if x not in phases and previous.get(x)],
            "date_utc": previous["environment"].get("date_utc"),
            "cpu": previous.get("lscpu", {}).get("model")
            or previous["environment"].get("processor"),
            "lscpu_flags": previous.get("lscpu", {}).get("flags", []),
        }
    res["wall_seconds"] = round(time.perf_counter() - t_start, 1)
    measured = {
        "efficiency": res["scaling"]["efficiency"] if res["scaling"] else None,
        "backup_overhead_pct": res["backup"]["overhead_pct"] if res["backup"] else None,
    }
    res["targets"] = {
        k: {"op": op, "value": v, "measured": measured[k], "pass": _check(k, measured[k])}
        for k, (op, v) in TARGETS.items()
    }
    res["figures"] = figures(res)
    res["quiet_gate"] = gate.summary()
    return publish(res, out, "B3", table=report(res, p))


def _harness_main(role: str, argv: list[str]) -> int:
    try:
        code = {"_train": harness_train, "_allreduce": harness_allreduce}[role](argv)
    except BaseException:  # noqa: BLE001 - a harness reports every failure in its log and exit code
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip TensorFlow's teardown (collective executors, servers): the report is written.
    os._exit(code)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("_train", "_allreduce"):
        _harness_main(sys.argv[1], sys.argv[2:])
    sys.exit(main())
