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

import argparse
import dataclasses
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if __package__ in (None, ""):  # run as a script: make `bench._common` and `tfopt` importable
    sys.path.insert(0, REPO)

# Nothing imported at module level starts TensorFlow: a harness must pin its core first.
from bench._common import (  # noqa: E402
    _CLK_TCK,
    QuietGate,
    _proc_stat,
    environment_light,
    figure,
    lscpu_info,
    markdown_table,
    median,
    status,
    usable_cores,
    write_json_atomic,
)

SCRIPT = os.path.abspath(__file__)
TARGETS = {
    "efficiency": (">=", 0.90),  # throughput(2 MWMS workers) / throughput(2 independent processes)
    "backup_overhead_pct": ("<=", 3.0),  # % slower per step with --backup-every
}
PHASES = ("scaling", "allreduce", "backup", "links")
MB = 1 << 20


@dataclass(frozen=True)
class Params:
    """Everything that shapes the measurement (recorded in the JSON)."""

    # The scaling phase's model: compute-heavy, as the protocol asks (22M multiply-adds per image
    # for 0.24M parameters; the default ``cnn`` does 4M for 0.22M, mostly in its dense layer, so
    # its all-reduce weighs 5x more per unit of compute).
    model: str = "wide_cnn"
    batch: int = 64  # per-process batch B (side b: global batch 2B)
    limit: int = 2048  # MNIST records per split (the training stream repeats; cached in memory)
    warmup_steps: int = 32  # untimed: tracing, filling the tf.data cache
    steps: int = 96  # timed steps per process
    steps_per_execution: int = 0  # 0 = tfopt's automatic choice
    intra_threads: int = 1  # TF_NUM_INTRAOP_THREADS of pinned processes
    inter_threads: int = 1  # TF_NUM_INTEROP_THREADS of pinned processes
    sizes_mb: tuple = (1, 4, 16, 64)
    allreduce_warmup: int = 3
    allreduce_iters: int = 20
    collective: str = "auto"  # runtime.collective of the all-reduce workers
    bandwidth_mb: int = 256
    bandwidth_copies: int = 3  # loopback copies before and after the all-reduces
    backup_every: int = 50
    backup_model: str = "cnn"  # tfopt's default model
    backup_batch: int = 128  # tfopt's default global batch
    backup_warmup_steps: int = 50
    backup_steps: int = 300
    backup_pinned: bool = False  # False: unpinned, TensorFlow's default threads (what a user runs)
    # links phase: side b on two simulated hosts (tfopt launch --hosts 2 --link RATE)
    link_gbits: tuple = (0, 1, 10, 25)  # 0: the loopback, in the same run (no --hosts)
    link_variants: tuple = ("float32", "packed", "bfloat16")
    pack_bytes: int = 256 << 10  # the "packed" variant's --bytes-per-pack
    repeats: int = 3
    smoke: bool = False


# the links phase's variants: what each adds to the workers' `python -m tfopt.train` flags
LINK_VARIANTS = {
    "float32": [],
    "packed": ["--bytes-per-pack", "{pack}"],
    "bfloat16": ["--allreduce-dtype", "bfloat16"],
}


# smoke: backups every 34 steps, so that tfopt's steps per execution (17, the largest divisor <= 32)
# gives executions with and without a backup, as at the default 50 (25)
SMOKE = {
    "batch": 16,
    "limit": 512,
    "warmup_steps": 8,
    "steps": 16,
    "steps_per_execution": 4,
    "allreduce_warmup": 1,
    "allreduce_iters": 7,
    "bandwidth_mb": 64,
    "bandwidth_copies": 2,
    "backup_every": 34,
    "backup_batch": 16,
    "backup_warmup_steps": 34,
    "backup_steps": 34,
    "link_gbits": (1,),
    "link_variants": ("packed",),
    "repeats": 1,
    "smoke": True,
}


# ============================================================================================
# Harnesses: the processes the benchmark starts (``scaling.py _train ...``, ``_allreduce``)
# ============================================================================================


class _WindowDone(Exception):
    """Raised by the step clock after the timed window: the process has measured what it should."""


def _task() -> tuple[str, int, int]:
    """(name, index, number of training tasks) from TF_CONFIG; ("local", 0, 1) without it."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return "local", 0, 1
    conf = json.loads(raw)
    task = conf.get("task", {})
    n = sum(len(conf.get("cluster", {}).get(role, [])) for role in ("chief", "worker"))
    return (
        f"{task.get('type', 'worker')}-{int(task.get('index', 0))}",
        int(task.get("index", 0)),
        max(n, 1),
    )


def _pin(cores: str, intra: int, inter: int) -> int | None:
    """Pins this process to one core before TensorFlow starts; sets TensorFlow's thread counts.

    ``cores``: ``none`` (leave the affinity alone), ``K`` or ``K0,K1,...`` (the task with index i
    of TF_CONFIG takes the i-th, modulo). ``intra``/``inter`` > 0 set TF_NUM_INTRAOP_THREADS /
    TF_NUM_INTEROP_THREADS, which TensorFlow reads when its context starts.
    """
    if "tensorflow" in sys.modules:
        raise RuntimeError(
            "pin before importing TensorFlow: its thread pools are sized at start-up"
        )
    core = None
    if cores not in ("", "none"):
        choices = [int(c) for c in cores.split(",")]
        core = choices[_task()[1] % len(choices)]
        os.sched_setaffinity(0, {core})
    if intra > 0:
        os.environ["TF_NUM_INTRAOP_THREADS"] = str(intra)
    if inter > 0:
        os.environ["TF_NUM_INTEROP_THREADS"] = str(inter)
    return core


def _threads_by_name() -> dict[str, int]:
    out: dict[str, int] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm", encoding="utf-8") as f:
                name = f.read().strip()
        except OSError:
            continue
        out[name] = out.get(name, 0) + 1
    return dict(sorted(out.items()))


def _cpu_now() -> dict:
    """A point in time: monotonic clock, this process's CPU seconds, the machine's busy CPU seconds."""
    stat = _proc_stat()
    t = os.times()
    return {
        "mono": time.monotonic(),
        "own": t.user + t.system,
        "busy": stat[0] / _CLK_TCK if stat else float("nan"),
        "ncpu": stat[1] if stat else usable_cores(),
        **_link_bytes(),
    }


def _link_bytes() -> dict:
    """Bytes this simulated host has sent and received on its link (the kernel's veth counters),
    or nothing off a simulated host (``ip netns exec`` shows the namespace's own /sys)."""
    out = {}
    for key in ("tx", "rx"):
        try:
            with open(f"/sys/class/net/eth0/statistics/{key}_bytes") as f:
                out[f"link_{key}"] = int(f.read())
        except OSError:
            return {}
    return out


def _window(start: dict, end: dict) -> dict:
    return {
        "start_mono": start["mono"],
        "seconds": end["mono"] - start["mono"],
        "own_cpu_s": end["own"] - start["own"],
        "busy_cpu_s": end["busy"] - start["busy"],
        "ncpu": end["ncpu"],
        **{f"{k}_bytes": end[k] - start[k] for k in ("link_tx", "link_rx") if k in start},
    }


def _process_facts(core) -> dict:
    return {
        "core": core,
        "affinity": sorted(os.sched_getaffinity(0)),
        "pid": os.getpid(),
        "env": {
            k: os.environ.get(k)
            for k in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS")
        },
    }


def _write_report(report_dir: str, name: str, payload: dict) -> None:
    path = os.path.join(report_dir, f"{name}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(payload, f)
    os.replace(path + ".tmp", path)


def _barrier(directory: str, name: str, parties: int, timeout: float) -> float:
    """Waits until ``parties`` processes reached the barrier (files in ``directory``); returns the wait."""
    t0 = time.monotonic()
    open(os.path.join(directory, f"barrier-{name}"), "w").close()  # name: unique per process
    while time.monotonic() - t0 < timeout:
        if sum(1 for f in os.listdir(directory) if f.startswith("barrier-")) >= parties:
            return time.monotonic() - t0
        time.sleep(0.005)
    return float("nan")  # timed out: go on (the overlap of the windows is recorded anyway)


def _split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1 :]
    return argv, []


def harness_train(argv: list[str]) -> int:
    """``scaling.py _train [options] -- <python -m tfopt.train flags>``: one timed training process."""
    own, train_argv = _split_argv(argv)
    ap = argparse.ArgumentParser(prog="scaling.py _train")
    ap.add_argument("--cores", default="none")
    ap.add_argument("--intra", type=int, default=0)
    ap.add_argument("--inter", type=int, default=0)
    ap.add_argument("--warmup", type=int, required=True, help="untimed steps before the window")
    ap.add_argument("--report-dir", required=True)
    ap.add_argument(
        "--barrier", type=int, default=0, help="processes that start their windows together"
    )
    ap.add_argument("--barrier-timeout", type=float, default=300.0)
    args = ap.parse_args(own)
    core = _pin(args.cores, args.intra, args.inter)
    name = _task()[0]
    if name == "local":  # several untied processes may share one report directory
        name = f"local-{os.getpid()}"

    # the flags of `python -m tfopt.train`, parsed by tfopt's own code
    from tfopt.config import cli

    parser = cli.ArgumentParser(prog="python -m tfopt.train")
    cli.add_config_args(parser)
    targs = parser.parse_args(train_argv)
    cfg = cli.config_from_args(targs)

    from tfopt import keras, tf
    from tfopt.train import run

    class StepClock(keras.callbacks.Callback):
        """Timestamps step boundaries; opens the window at the first boundary >= warm-up, ends the
        run at the last step of the fit."""

        def __init__(self):
            super().__init__()
            self.epoch = 0
            self.marks: list[tuple[int, float]] = []
            self.start = None
            self.first_step = None
            self.barrier_wait = 0.0
            self.result = None
            self.spe = None
            self.trainable = None

        def on_train_begin(self, logs=None):
            spe = getattr(self.model, "_steps_per_execution", None)  # tf_keras: a variable
            self.spe = int(spe.numpy()) if spe is not None else None
            # values all-reduced per step
            self.trainable = sum(int(w.shape.num_elements()) for w in self.model.trainable_weights)

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = int(epoch)

        def on_train_batch_end(self, batch, logs=None):
            steps = int(self.params["steps"])
            step = self.epoch * steps + int(batch) + 1
            if self.first_step is None:
                self.first_step = (
                    step  # > steps_per_execution would mean a resumed run: refused below
                )
            if self.start is None:
                if step < args.warmup:
                    return
                if args.barrier > 1:
                    self.barrier_wait = _barrier(
                        args.report_dir, name, args.barrier, args.barrier_timeout
                    )
                self.start = _cpu_now()
                self.marks.append((step, self.start["mono"]))
                return
            now = _cpu_now()
            self.marks.append((step, now["mono"]))
            if step >= steps * int(self.params["epochs"]):
                self.result = _window(self.start, now)
                raise _WindowDone()

    clock = StepClock()
    status_ = "finished"
    try:
        run(cfg, overwrite=targs.overwrite, callbacks=[clock])
    except _WindowDone:
        status_ = "stopped after the timed window"
    if clock.result is None or len(clock.marks) < 2:
        raise RuntimeError(
            f"no timed window: warm-up {args.warmup} >= the run's steps, or the run ended early"
        )
    s0, t0 = clock.marks[0]
    s1, t1 = clock.marks[-1]
    # one row per execution (steps_per_execution steps, one tf.function call) in the window
    execs = [(a[0], b[0], round(b[1] - a[1], 6)) for a, b in zip(clock.marks, clock.marks[1:])]
    backups = _backups_written(cfg.train.output_dir)
    report = {
        "task": name,
        **_process_facts(core),
        "status": status_,
        "threads": _threads_by_name(),
        "tf_threading": {
            "intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
            "inter_op": tf.config.threading.get_inter_op_parallelism_threads(),
        },
        "strategy": cfg.runtime.strategy,
        "global_batch_size": cfg.data.global_batch_size,
        "backup_every": cfg.train.backup_every,
        "first_step": clock.first_step,
        "compiled_steps_per_execution": clock.spe,
        "trainable_values": clock.trainable,
        "runtime": {
            k: getattr(cfg.runtime, k) for k in ("collective", "bytes_per_pack", "allreduce_dtype")
        },
        "window_steps": [s0, s1],
        "step_ms": 1e3 * (t1 - t0) / (s1 - s0),
        "executions": execs,  # [first step (exclusive), last step, seconds]
        "steps_per_execution": sorted({e - b for b, e, _ in execs}),
        "barrier_wait_s": clock.barrier_wait,
        "window": clock.result,
        "backup_steps_kept": backups,
    }
    _write_report(args.report_dir, name, report)
    return 0


def _backups_written(output_dir: str) -> list[int]:
    """Global steps of the backups still on disk in the run's work directory (tfopt keeps the newest 2)."""
    from tfopt.runs import PARTIAL_SUFFIX

    found = []
    for base in (output_dir + PARTIAL_SUFFIX, output_dir):
        directory = os.path.join(base, "backup", "0")
        if os.path.isdir(directory):
            for f in os.listdir(directory):
                if f.startswith("ckpt-") and f.endswith(".index"):
                    found.append(int(f[len("ckpt-") : -len(".index")]))
    return sorted(found)


def _recv_exact(conn: socket.socket, n: int, buf: bytearray) -> None:
    view = memoryview(buf)
    while n > 0:
        got = conn.recv_into(view, min(len(buf), n))
        if got == 0:
            raise ConnectionError("peer closed the bandwidth connection")
        n -= got


def _send_n(conn: socket.socket, n: int, buf: bytes) -> None:
    view = memoryview(buf)
    while n > 0:
        k = min(len(buf), n)
        conn.sendall(view[:k])
        n -= k


def loopback_bandwidth(
    directory: str, index: int, nbytes: int, copies: int, tag: str, timeout: float = 120.0
) -> dict:
    """Loopback TCP between task 0 (sender) and task 1 (receiver), both in their pinned processes.

    ``uni``: task 0 sends ``nbytes`` and waits for a 1-byte ack (bytes/s, one per copy).
    ``duplex``: both send ``nbytes`` to each other at once, as the 2 workers of a ring all-reduce
    do (bytes/s per direction). Tasks other than 0 and 1 take no part.
    """
    if index > 1:
        return {}
    port_file = os.path.join(directory, f"bw-{tag}.port")
    chunk = bytearray(MB)
    data = bytes(MB)
    if index == 1:
        srv = socket.create_server(("127.0.0.1", 0))
        srv.settimeout(timeout)
        with open(port_file + ".tmp", "w") as f:
            f.write(str(srv.getsockname()[1]))
        os.replace(port_file + ".tmp", port_file)
        conn, _ = srv.accept()
        srv.close()
    else:
        t0 = time.monotonic()
        while not os.path.exists(port_file):
            if time.monotonic() - t0 > timeout:
                raise TimeoutError("the receiving task never opened its bandwidth port")
            time.sleep(0.01)
        with open(port_file) as f:
            conn = socket.create_connection(("127.0.0.1", int(f.read())), timeout=timeout)
    conn.settimeout(timeout)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    uni, duplex = [], []
    try:
        for _ in range(copies):
            if index == 0:
                t0 = time.perf_counter()
                _send_n(conn, nbytes, data)
                _recv_exact(conn, 1, chunk)
                uni.append(nbytes / (time.perf_counter() - t0))
            else:
                _recv_exact(conn, nbytes, chunk)
                conn.sendall(b"k")
        for _ in range(copies):
            if index == 0:  # handshake: both start together
                conn.sendall(b"g")
                _recv_exact(conn, 1, chunk)
            else:
                _recv_exact(conn, 1, chunk)
                conn.sendall(b"g")
            t0 = time.perf_counter()
            sender = threading.Thread(target=_send_n, args=(conn, nbytes, data))
            sender.start()
            _recv_exact(conn, nbytes, chunk)
            sender.join()
            duplex.append(nbytes / (time.perf_counter() - t0))
    finally:
        conn.close()
    return {"uni_Bps": uni, "duplex_Bps": duplex} if index == 0 else {"duplex_Bps": duplex}


def harness_allreduce(argv: list[str]) -> int:
    """``scaling.py _allreduce [options]``, run by the launcher as every worker: loopback bandwidth,
    then all-reduce times of each size, then loopback bandwidth again."""
    ap = argparse.ArgumentParser(prog="scaling.py _allreduce")
    ap.add_argument("--cores", default="none")
    ap.add_argument("--intra", type=int, default=0)
    ap.add_argument("--inter", type=int, default=0)
    ap.add_argument("--report-dir", required=True)
    ap.add_argument("--sizes-mb", default="1,4,16,64")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--collective", default="auto")
    ap.add_argument("--bandwidth-mb", type=int, default=256)
    ap.add_argument("--copies", type=int, default=3)
    args = ap.parse_args(argv)
    core = _pin(args.cores, args.intra, args.inter)
    name, index, _ = _task()
    nbytes = args.bandwidth_mb * MB
    bw_before = loopback_bandwidth(args.report_dir, index, nbytes, args.copies, "before")

    from tfopt import tf
    from tfopt.config import RunConfig, RuntimeConfig
    from tfopt.runtime import connect, parse_tf_config

    cluster = parse_tf_config(os.environ.get("TF_CONFIG"))
    strategy = connect(
        RunConfig(
            runtime=RuntimeConfig(strategy="multi_worker_mirrored", collective=args.collective)
        ),
        cluster,
    )
    n_workers = strategy.num_replicas_in_sync

    def make(n_floats: int):
        @tf.function
        def allreduce(x):
            def replica_fn(v):
                v = tf.identity(v)  # placed on the replica's device, as a gradient is
                r = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, v)
                return r[
                    :1
                ]  # only the first element comes back: the fetch does not time a 64 MB copy

            return strategy.run(replica_fn, args=(x,))

        return allreduce

    def call(fn, x) -> float:
        return float(strategy.experimental_local_results(fn(x))[0].numpy()[0])

    sizes = [int(s) for s in args.sizes_mb.split(",")]
    sync, one = make(1), tf.ones([1])
    inputs = {mb: tf.fill([mb * MB // 4], float(index + 1)) for mb in sizes}
    fns = {mb: make(mb * MB // 4) for mb in sizes}
    expected = n_workers * (n_workers + 1) / 2
    correct = True
    for mb in sizes:  # warm-up: traces, collective instance set-up
        for _ in range(args.warmup):
            correct &= call(fns[mb], inputs[mb]) == expected
    times: dict[int, list[float]] = {mb: [] for mb in sizes}
    start = _cpu_now()
    for it in range(args.iters):
        for mb in sizes if it % 2 == 0 else sizes[::-1]:
            call(sync, one)  # both workers leave this within a one-way latency of each other
            t0 = time.perf_counter()
            got = call(fns[mb], inputs[mb])
            times[mb].append(1e3 * (time.perf_counter() - t0))
            correct &= got == expected
    window = _window(start, _cpu_now())
    bw_after = loopback_bandwidth(args.report_dir, index, nbytes, args.copies, "after")
    report = {
        "task": name,
        **_process_facts(core),
        "threads": _threads_by_name(),
        "workers": n_workers,
        "collective": args.collective,
        "strategy_class": type(strategy).__name__,
        "correct_sums": bool(correct),
        "sizes_mb": sizes,
        "allreduce_ms": {str(mb): [round(t, 4) for t in v] for mb, v in times.items()},
        "bandwidth": {"bytes": nbytes, "before": bw_before, "after": bw_after},
        "window": window,
    }
    _write_report(args.report_dir, name, report)
    return 0


# ============================================================================================
# The orchestrator
# ============================================================================================


class Ctx:
    """Where and how the orchestrator starts processes."""

    def __init__(self, p: Params, cores: list[int], isolate: bool, root: str, timeout: float):
        self.p, self.cores, self.isolate, self.root, self.timeout = p, cores, isolate, root, timeout
        self.n = 0
        env = dict(os.environ)
        env.pop("TF_CONFIG", None)
        env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env["PYTHONUNBUFFERED"] = "1"
        self.env = env

    def fresh(self, label: str) -> str:
        self.n += 1
        path = os.path.join(self.root, f"{self.n:03d}-{label}")
        os.makedirs(path)
        return path


def _tail(path: str, n: int = 40) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def _stop(procs: list) -> None:
    """Stops our own children that still run, by their process groups: SIGTERM first (a launcher
    passes it on to its tasks, which run in sessions of their own), SIGKILL after a grace period."""
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        alive = [p for p in procs if p.poll() is None]
        for p in alive:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        end = time.monotonic() + grace
        while any(p.poll() is None for p in alive) and time.monotonic() < end:
            time.sleep(0.05)


def _run_procs(cmds: list[list[str]], ctx: Ctx, workdir: str) -> None:
    """Starts every command at once and waits for all; a failure or a timeout stops the others."""
    procs, logs = [], []
    try:
        for i, cmd in enumerate(cmds):
            logs.append(os.path.join(workdir, f"proc-{i}.log"))
            with open(logs[-1], "w") as f:
                f.write("$ " + " ".join(cmd) + "\n")
                f.flush()
                procs.append(
                    subprocess.Popen(
                        cmd,
                        env=ctx.env,
                        cwd=REPO,
                        stdout=f,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )
        deadline = time.monotonic() + ctx.timeout + 20  # a launcher's own --timeout fires first
        failed = None
        while (
            failed is None and any(p.poll() is None for p in procs) and time.monotonic() < deadline
        ):
            time.sleep(0.1)
            failed = next((i for i, p in enumerate(procs) if p.poll() not in (None, 0)), None)
        failed = next((i for i, p in enumerate(procs) if p.poll() not in (None, 0)), failed)
        if failed is None and any(p.poll() is None for p in procs):
            failed = next(i for i, p in enumerate(procs) if p.poll() is None)
            what = f"did not finish within {ctx.timeout:.0f} s"
        elif failed is not None:
            what = f"exited with code {procs[failed].returncode}"
    finally:
        _stop(procs)
    if failed is not None:
        raise RuntimeError(
            f"[B3] a benchmark process {what}; its log ({logs[failed]}) ends with:\n"
            f"{_tail(logs[failed])}"
        )


def _reports(workdir: str) -> list[dict]:
    out = []
    for f in sorted(os.listdir(workdir)):
        if f.endswith(".json"):
            with open(os.path.join(workdir, f), encoding="utf-8") as fh:
                out.append(json.load(fh))
    return out


def _harness(role: str, *opts) -> list[str]:
    return [sys.executable, SCRIPT, role, *[str(o) for o in opts]]


def _launch(ctx: Ctx, workers: int, command: list[str], extra: tuple = ()) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tfopt.launch",
        *extra,
        "--workers",
        str(workers),
        "--timeout",
        str(int(ctx.timeout)),
        "--grace",
        "5",
        "--isolate" if ctx.isolate else "--no-isolate",
        "--",
        *command,
    ]


def _train_flags(
    p: Params,
    strategy: str,
    batch: int,
    total_steps: int,
    out: str,
    backup_every: int = 0,
    spe: int = 0,
    model: str | None = None,
) -> list[str]:
    flags = [
        "--strategy",
        strategy,
        "--model",
        model or p.model,
        "--dataset",
        "mnist",
        "--batch-size",
        str(batch),
        "--limit",
        str(p.limit),
        "--epochs",
        "1",
        "--steps-per-epoch",
        str(total_steps),
        "--quiet",
        "--set",
        "train.tensorboard=false",
        "-o",
        out,
    ]
    if backup_every:
        flags += ["--backup-every", str(backup_every)]
    if spe:
        flags += ["--steps-per-execution", str(spe)]
    return flags


def foreign_load(reports: list[dict]) -> float:
    """Share of the machine's cores that processes other than ours used during the timed windows.

    For each process: (machine busy CPU - its own CPU - its siblings' CPU in the overlapping part
    of their windows, assumed uniform) / (wall x cores). The worst process counts.
    """
    loads = []
    for i, r in enumerate(reports):
        w = r["window"]
        if not w["seconds"] > 0 or math.isnan(w["busy_cpu_s"]):
            continue
        s0, s1 = w["start_mono"], w["start_mono"] + w["seconds"]
        siblings = 0.0
        for j, q in enumerate(reports):
            v = q["window"]
            if j != i and v["seconds"] > 0:
                overlap = max(
                    0.0, min(s1, v["start_mono"] + v["seconds"]) - max(s0, v["start_mono"])
                )
                siblings += v["own_cpu_s"] * overlap / v["seconds"]
        loads.append(
            min(
                1.0,
                max(
                    0.0, (w["busy_cpu_s"] - w["own_cpu_s"] - siblings) / (w["seconds"] * w["ncpu"])
                ),
            )
        )
    return max(loads) if loads else float("nan")


def _window_overlap(reports: list[dict]) -> float:
    """Common part of the processes' timed windows / the longest window (1 = perfectly concurrent)."""
    starts = [r["window"]["start_mono"] for r in reports]
    ends = [r["window"]["start_mono"] + r["window"]["seconds"] for r in reports]
    return max(0.0, min(ends) - max(starts)) / max(r["window"]["seconds"] for r in reports)


def _slim(r: dict) -> dict:
    """A process report for the JSON (the window's raw counters kept: foreign load is recomputable)."""
    keep = (
        "task",
        "core",
        "affinity",
        "env",
        "threads",
        "tf_threading",
        "strategy",
        "global_batch_size",
        "backup_every",
        "first_step",
        "compiled_steps_per_execution",
        "window_steps",
        "step_ms",
        "steps_per_execution",
        "executions",
        "barrier_wait_s",
        "window",
        "backup_steps_kept",
        "trainable_values",
        "runtime",
        "status",
    )
    return {k: r[k] for k in keep if k in r}


def _check_reports(reports: list[dict], expected: int, what: str) -> None:
    if len(reports) != expected:
        raise RuntimeError(f"[B3] {what}: {len(reports)} process report(s), expected {expected}")
    for r in reports:
        spe = r.get("compiled_steps_per_execution") or max(r["steps_per_execution"] or [1])
        if r["first_step"] > spe:  # a run that resumed from an old backup would skip steps
            raise RuntimeError(
                f"[B3] {what}: {r['task']} started at step {r['first_step']}: it resumed a run"
            )


# -- phase 1: scaling ---------------------------------------------------------------------------

SIDES = {
    "a": "1 one_device process pinned to 1 core, batch B",
    "b": "2 multi_worker_mirrored workers (tfopt.launch), 1 core each, global batch 2B",
    "c": "control: 2 independent one_device processes, 1 core each, batch B each, concurrent",
}


def run_side(side: str, ctx: Ctx, launch_flags: tuple = (), train_flags: tuple = ()) -> dict:
    """Runs one side of the scaling comparison; returns its throughput and process reports.

    ``launch_flags`` go to side b's launcher (e.g. ``--hosts 2``), ``train_flags`` to its workers.
    """
    p = ctx.p
    total = p.warmup_steps + p.steps
    wd = ctx.fresh(f"scaling-{side}")
    pin = [
        "--intra",
        p.intra_threads,
        "--inter",
        p.inter_threads,
        "--warmup",
        p.warmup_steps,
        "--report-dir",
        wd,
    ]
    c0, c1 = ctx.cores[0], ctx.cores[1]
    if side == "a":
        cmds = [
            _harness(
                "_train",
                "--cores",
                c0,
                *pin,
                "--",
                *_train_flags(
                    p,
                    "one_device",
                    p.batch,
                    total,
                    os.path.join(wd, "run"),
                    spe=p.steps_per_execution,
                ),
            )
        ]
        n, combine = 1, "sum"
    elif side == "b":
        cmds = [
            _launch(
                ctx,
                2,
                _harness(
                    "_train",
                    "--cores",
                    f"{c0},{c1}",
                    *pin,
                    "--",
                    *_train_flags(
                        p,
                        "multi_worker_mirrored",
                        2 * p.batch,
                        total,
                        os.path.join(wd, "run"),
                        spe=p.steps_per_execution,
                    ),
                    *train_flags,
                ),
                launch_flags,
            )
        ]
        n, combine = 2, "sync"
    else:
        cmds = [
            _harness(
                "_train",
                "--cores",
                core,
                *pin,
                "--barrier",
                2,
                "--barrier-timeout",
                ctx.timeout / 2,
                "--",
                *_train_flags(
                    p,
                    "one_device",
                    p.batch,
                    total,
                    os.path.join(wd, f"run{k}"),
                    spe=p.steps_per_execution,
                ),
            )
            for k, core in enumerate((c0, c1))
        ]
        n, combine = 2, "sum"
    t0 = time.perf_counter()
    _run_procs(cmds, ctx, wd)
    wall = time.perf_counter() - t0
    reports = _reports(wd)
    _check_reports(reports, n, f"side {side}")
    pinned = sorted(tuple(r["affinity"]) for r in reports)
    if pinned != sorted((c,) for c in ctx.cores[:n]):
        raise RuntimeError(
            f"[B3] side {side}: processes ran on cores {pinned}, expected one each of {ctx.cores[:n]}"
        )
    step_ms = [r["step_ms"] for r in reports]
    out = {
        "step_ms": step_ms,
        "batch_per_process": p.batch,
        "combine": combine,
        "examples_per_sec": side_throughput(step_ms, p.batch, combine),
        "foreign_load": foreign_load(reports),
        "wall_s": round(wall, 1),
        "processes": [_slim(r) for r in reports],
    }
    if n > 1:
        out["window_overlap"] = _window_overlap(reports)
    shutil.rmtree(wd, ignore_errors=True)
    return out


def side_throughput(step_ms: list[float], batch: int, combine: str) -> float:
    """Examples/s of a side: ``sum`` of independent processes' rates, or ``sync``: synchronous
    workers, one global step (batch x workers) per step of the slowest."""
    if combine == "sync":
        return len(step_ms) * batch / (max(step_ms) / 1e3)
    return sum(batch / (ms / 1e3) for ms in step_ms)


def _spread(values) -> list[float]:
    vals = [v for v in values if not math.isnan(v)]
    return [min(vals), max(vals)] if vals else []


def phase_scaling(ctx: Ctx, gate: QuietGate, bar) -> dict:
    p = ctx.p

    def unit(r: int):
        order = ["a", "b", "c"] if r % 2 == 0 else ["c", "b", "a"]
        rec: dict = {"order": order}
        for side in order:
            bar.set_postfix_str(f"scaling {r + 1}/{p.repeats}: side {side}")
            rec[side] = run_side(side, ctx)
        ta, tb, tc = (rec[s]["examples_per_sec"] for s in "abc")
        rec["efficiency"] = tb / tc
        rec["weak_scaling"] = tb / (2 * ta)
        return rec, [rec[s]["foreign_load"] for s in order]

    runs = []
    for r in range(p.repeats):
        runs.append(gate.run(lambda r=r: unit(r)))
        bar.update(1)
    return {
        "model": p.model,
        "dataset": "mnist",
        "per_process_batch": p.batch,
        "warmup_steps": p.warmup_steps,
        "timed_steps": p.steps,
        "steps_per_execution": p.steps_per_execution or "auto",
        "cores": ctx.cores[:2],
        "sides": SIDES,
        "repeats": runs,
        **{f"{s}_examples_per_sec": median(x[s]["examples_per_sec"] for x in runs) for s in "abc"},
        "efficiency": median(x["efficiency"] for x in runs),
        "efficiency_range": _spread(x["efficiency"] for x in runs),
        "weak_scaling": median(x["weak_scaling"] for x in runs),
        "weak_scaling_range": _spread(x["weak_scaling"] for x in runs),
    }


# -- phase 4: links ------------------------------------------------------------------------------


def link_row(side: dict, control: dict, gbit: float, variant: str) -> dict:
    """One side b measured on two simulated hosts, beside the same repeat's control (side c).

    The bytes are the kernel's counters of each host's veth, over the timed window: what the
    workers sent each other per step (the all-reduce, plus gRPC's own messages). The ring model
    sends 2(N-1)/N x the gradient bytes per worker per step (N = 2: the gradients once).
    """
    procs = side["processes"]
    sent = [
        pr["window"]["link_tx_bytes"] / (pr["window_steps"][1] - pr["window_steps"][0])
        for pr in procs
        if "link_tx_bytes" in pr["window"]
    ]
    width = 2 if variant == "bfloat16" else 4
    model_bytes = 2 * (2 - 1) / 2 * procs[0]["trainable_values"] * width
    return {
        "gbit": gbit,
        "variant": variant,
        "examples_per_sec": side["examples_per_sec"],
        "step_ms": max(side["step_ms"]),
        "efficiency": side["examples_per_sec"] / control["examples_per_sec"],
        # None on the loopback: a process there may read the counters of the host's own eth0
        "link_bytes_per_step": median(sent) if sent and gbit else None,
        "ring_model_bytes_per_step": model_bytes,
        "ring_model_ms": 1e3 * model_bytes / (gbit * 1e9 / 8) if gbit else None,
        "side": side,
    }


def phase_links(ctx: Ctx, gate: QuietGate, bar) -> dict:
    """Side b on two simulated hosts at each link rate and variant, against the control (side c)."""
    p = ctx.p

    def unit(r: int):
        rates = list(p.link_gbits) if r % 2 == 0 else list(reversed(p.link_gbits))
        bar.set_postfix_str(f"links {r + 1}/{p.repeats}: control")
        control = run_side("c", ctx)
        rows = []
        for gbit in rates:
            for variant in p.link_variants:
                bar.set_postfix_str(f"links {r + 1}/{p.repeats}: {gbit} Gbit/s {variant}")
                flags = [f.format(pack=p.pack_bytes) for f in LINK_VARIANTS[variant]]
                hosts = ("--hosts", "2", "--link", f"{gbit}gbit") if gbit else ()
                side = run_side("b", ctx, hosts, tuple(flags))
                if gbit and not all("link_tx_bytes" in pr["window"] for pr in side["processes"]):
                    raise RuntimeError(
                        "[B3] links: the workers did not run on simulated hosts (no veth "
                        "counters); tfopt launch --hosts needs root and ip netns"
                    )
                rows.append(link_row(side, control, gbit, variant))
        loads = [control["foreign_load"]] + [x["side"]["foreign_load"] for x in rows]
        return {"control": control, "rows": rows}, loads

    runs = []
    for r in range(p.repeats):
        runs.append(gate.run(lambda r=r: unit(r)))
        bar.update(1)
    table = []
    for gbit in p.link_gbits:
        for variant in p.link_variants:
            cells = [
                x
                for run in runs
                for x in run["rows"]
                if (x["gbit"], x["variant"]) == (gbit, variant)
            ]
            table.append(
                {
                    "gbit": gbit,
                    "variant": variant,
                    "efficiency": median(x["efficiency"] for x in cells),
                    "efficiencies": [x["efficiency"] for x in cells],
                    "examples_per_sec": median(x["examples_per_sec"] for x in cells),
                    "step_ms": median(x["step_ms"] for x in cells),
                    "link_bytes_per_step": cells[0]["link_bytes_per_step"]
                    and median(x["link_bytes_per_step"] for x in cells),
                    "ring_model_bytes_per_step": cells[0]["ring_model_bytes_per_step"],
                    "ring_model_ms": cells[0]["ring_model_ms"],
                }
            )
    return {
        "model": p.model,
        "hosts": 2,
        "pack_bytes": p.pack_bytes,
        "c_examples_per_sec": median(x["control"]["examples_per_sec"] for x in runs),
        "table": table,
        "repeats": runs,
        "environment": {**environment_light(), "lscpu_flags": lscpu_info().get("flags", [])},
    }


# -- phase 2: all-reduce -----------------------------------------------------------------------


def ring_model_ms(size_bytes: float, workers: int, bandwidth_Bps: float) -> float:
    """Lower bound of a ring all-reduce: 2(N-1)/N x size / bandwidth, in ms."""
    return 1e3 * 2 * (workers - 1) / workers * size_bytes / bandwidth_Bps


def phase_allreduce(ctx: Ctx, gate: QuietGate, bar) -> dict:
    p = ctx.p
    sizes = list(p.sizes_mb)

    def unit(r: int):
        bar.set_postfix_str(f"all-reduce {r + 1}/{p.repeats}")
        wd = ctx.fresh("allreduce")
        cmd = _launch(
            ctx,
            2,
            _harness(
                "_allreduce",
                "--cores",
                f"{ctx.cores[0]},{ctx.cores[1]}",
                "--intra",
                p.intra_threads,
                "--inter",
                p.inter_threads,
                "--report-dir",
                wd,
                "--sizes-mb",
                ",".join(map(str, sizes)),
                "--warmup",
                p.allreduce_warmup,
                "--iters",
                p.allreduce_iters,
                "--collective",
                p.collective,
                "--bandwidth-mb",
                p.bandwidth_mb,
                "--copies",
                p.bandwidth_copies,
            ),
        )
        t0 = time.perf_counter()
        _run_procs([cmd], ctx, wd)
        wall = time.perf_counter() - t0
        reports = _reports(wd)
        if len(reports) != 2:
            raise RuntimeError(f"[B3] all-reduce: {len(reports)} report(s), expected 2")
        if not all(r["correct_sums"] for r in reports):
            raise RuntimeError("[B3] all-reduce: a worker got a wrong sum")
        sender = next(r for r in reports if "uni_Bps" in r["bandwidth"]["before"])
        bw = sender["bandwidth"]
        uni = bw["before"]["uni_Bps"] + bw["after"]["uni_Bps"]
        duplex = bw["before"]["duplex_Bps"] + bw["after"]["duplex_Bps"]
        bandwidth = median(uni)
        workers = reports[0]["workers"]
        rec = {
            "bandwidth_uni_Bps": uni,
            "bandwidth_duplex_Bps": duplex,
            "bandwidth_Bps": bandwidth,
            "bandwidth_duplex_median_Bps": median(duplex),
            "workers": workers,
            "sizes": {},
            "foreign_load": foreign_load(reports),
            "wall_s": round(wall, 1),
            "processes": [
                {
                    k: r[k]
                    for k in (
                        "task",
                        "core",
                        "affinity",
                        "env",
                        "threads",
                        "collective",
                        "strategy_class",
                        "window",
                    )
                }
                for r in reports
            ],
        }
        for mb in sizes:
            per_worker = [median(r["allreduce_ms"][str(mb)]) for r in reports]
            ms = max(per_worker)
            model = ring_model_ms(mb * MB, workers, bandwidth)
            rec["sizes"][str(mb)] = {
                "ms": ms,
                "ms_per_worker": per_worker,
                "ms_all": [r["allreduce_ms"][str(mb)] for r in reports],
                "model_ms": model,
                "ratio_to_model": ms / model,
                "bus_bandwidth_Bps": 2 * (workers - 1) / workers * mb * MB / (ms / 1e3),
            }
        shutil.rmtree(wd, ignore_errors=True)
        return rec, [rec["foreign_load"]]

    runs = []
    for r in range(p.repeats):
        runs.append(gate.run(lambda r=r: unit(r)))
        bar.update(1)
    summary = {}
    for mb in sizes:
        k = str(mb)
        summary[k] = {
            f: median(x["sizes"][k][f] for x in runs)
            for f in ("ms", "model_ms", "ratio_to_model", "bus_bandwidth_Bps")
        }
        summary[k]["ratio_to_model_range"] = _spread(x["sizes"][k]["ratio_to_model"] for x in runs)
    return {
        "sizes_mb": sizes,
        "dtype": "float32",
        "warmup_calls": p.allreduce_warmup,
        "timed_calls": p.allreduce_iters,
        "collective": p.collective,
        "bandwidth_copy_bytes": p.bandwidth_mb * MB,
        "cores": ctx.cores[:2],
        "repeats": runs,
        "bandwidth_Bps": median(x["bandwidth_Bps"] for x in runs),
        "bandwidth_duplex_Bps": median(x["bandwidth_duplex_median_Bps"] for x in runs),
        "sizes": summary,
    }


# -- phase 3: backup overhead -----------------------------------------------------------------


def run_backup_side(with_backups: bool, ctx: Ctx) -> dict:
    p = ctx.p
    wd = ctx.fresh("backup-on" if with_backups else "backup-off")
    pin = (
        ["--cores", ctx.cores[0], "--intra", p.intra_threads, "--inter", p.inter_threads]
        if p.backup_pinned
        else []
    )
    cmd = _harness(
        "_train",
        *pin,
        "--warmup",
        p.backup_warmup_steps,
        "--report-dir",
        wd,
        "--",
        *_train_flags(
            p,
            "one_device",
            p.backup_batch,
            p.backup_warmup_steps + p.backup_steps,
            os.path.join(wd, "run"),
            backup_every=p.backup_every if with_backups else 0,
            model=p.backup_model,
        ),
    )
    t0 = time.perf_counter()
    _run_procs([cmd], ctx, wd)
    wall = time.perf_counter() - t0
    reports = _reports(wd)
    _check_reports(reports, 1, "backup " + ("on" if with_backups else "off"))
    r = reports[0]
    shutil.rmtree(wd, ignore_errors=True)
    return {
        "step_ms": r["step_ms"],
        "backup_every": p.backup_every if with_backups else 0,
        "steps_per_execution": r["steps_per_execution"],
        "window_steps": r["window_steps"],
        "backup_steps_kept": r["backup_steps_kept"],
        "foreign_load": foreign_load(reports),
        "wall_s": round(wall, 1),
        "process": _slim(r),
    }


def backup_cost_within(executions: list, every: int) -> dict | None:
    """The cost of one backup from the backup run alone, free of run-to-run drift.

    tfopt writes a backup at the step boundary that reaches a multiple of ``every``, right after
    the clock's mark there, so an execution whose first step follows a multiple of ``every`` holds
    one backup and the others hold none. Per-backup cost = median(with) - median(without), over
    executions of the common length; percent = that cost / (``every`` steps without backups).
    None when every execution holds a backup (steps per execution = ``every``).
    """
    lengths = [e - b for b, e, _ in executions]
    if not lengths:
        return None
    n = max(set(lengths), key=lengths.count)
    with_ = [sec for b, e, sec in executions if e - b == n and b % every == 0]
    without = [sec for b, e, sec in executions if e - b == n and b % every != 0]
    if not with_ or not without:
        return None
    cost = median(with_) - median(without)
    step = median(without) / n
    return {
        "steps_per_execution": n,
        "executions_with": len(with_),
        "executions_without": len(without),
        "per_backup_ms": 1e3 * cost,
        "pct": 100.0 * cost / (every * step),
    }


def phase_backup(ctx: Ctx, gate: QuietGate, bar) -> dict:
    p = ctx.p

    def unit(r: int):
        order = ["off", "on"] if r % 2 == 0 else ["on", "off"]
        rec: dict = {"order": order}
        for side in order:
            bar.set_postfix_str(f"backup {r + 1}/{p.repeats}: {side}")
            rec[side] = run_backup_side(side == "on", ctx)
        rec["overhead_pct"] = 100.0 * (rec["on"]["step_ms"] / rec["off"]["step_ms"] - 1.0)
        rec["within_run"] = backup_cost_within(rec["on"]["process"]["executions"], p.backup_every)
        return rec, [rec[s]["foreign_load"] for s in order]

    runs = []
    for r in range(p.repeats):
        runs.append(gate.run(lambda r=r: unit(r)))
        bar.update(1)
    return {
        "strategy": "one_device",
        "model": p.backup_model,
        "global_batch_size": p.backup_batch,
        "backup_every": p.backup_every,
        "warmup_steps": p.backup_warmup_steps,
        "timed_steps": p.backup_steps,
        "pinned": p.backup_pinned,
        "repeats": runs,
        "off_step_ms": median(x["off"]["step_ms"] for x in runs),
        "on_step_ms": median(x["on"]["step_ms"] for x in runs),
        "overhead_pct": median(x["overhead_pct"] for x in runs),
        "overhead_pct_range": _spread(x["overhead_pct"] for x in runs),
        "within_run_per_backup_ms": median(
            x["within_run"]["per_backup_ms"] for x in runs if x["within_run"]
        ),
        "within_run_pct": median(x["within_run"]["pct"] for x in runs if x["within_run"]),
    }


# -- report ----------------------------------------------------------------------------------------


def figures(res: dict) -> list[dict]:
    """The published B3 figures (``bench/_common.figure``), one value per repeat."""
    sc, ar, bk = res.get("scaling"), res.get("allreduce"), res.get("backup")
    out = []
    if sc:
        runs = sc["repeats"]
        out.append(
            figure(
                "efficiency: 2 MWMS workers / 2 independent processes (the control)",
                [x["efficiency"] for x in runs],
                "x",
                target=TARGETS["efficiency"],
                digits=3,
                anchor="Horovod: ~0.90",
                detail=f"{sc['b_examples_per_sec']:.0f} vs {sc['c_examples_per_sec']:.0f} ex/s",
            )
        )
        out.append(
            figure(
                "(info) weak scaling: 2 MWMS workers / (2 x 1 pinned process)",
                [x["weak_scaling"] for x in runs],
                "x",
                digits=3,
            )
        )
    if ar:
        for mb in ar["sizes_mb"]:
            out.append(
                figure(
                    f"(info) all-reduce {mb} MB, measured / ring model 2(N-1)/N x size / bandwidth",
                    [x["sizes"][str(mb)]["ratio_to_model"] for x in ar["repeats"]],
                    "x",
                    digits=1,
                    anchor="ring all-reduce: >= 1x the model",
                    detail=f"{ar['sizes'][str(mb)]['ms']:.2f} ms vs {ar['sizes'][str(mb)]['model_ms']:.2f} ms",
                )
            )
    for row in (res.get("links") or {}).get("table", []):
        where = (
            f"on 2 simulated hosts, {row['gbit']:g} Gbit/s link"
            if row["gbit"]
            else "on one host's loopback (same run)"
        )
        sent = (
            f"{row['link_bytes_per_step'] / 1e6:.2f} MB/step sent on the link (ring model "
            f"{row['ring_model_bytes_per_step'] / 1e6:.2f} MB, {row['ring_model_ms']:.2f} ms at the rate); "
            if row["gbit"]
            else ""
        )
        out.append(
            figure(
                f"(info) efficiency, 2 MWMS workers {where}, {row['variant']} all-reduce",
                row["efficiencies"],
                "x",
                digits=3,
                anchor="Horovod: ~0.90 (GPUs over RoCE)",
                detail=f"{sent}{row['step_ms']:.0f} ms/step",
            )
        )
    if bk:
        out.append(
            figure(
                f"backup overhead per step, --backup-every {bk['backup_every']} vs none",
                [x["overhead_pct"] for x in bk["repeats"]],
                "%",
                target=TARGETS["backup_overhead_pct"],
                detail=f"{bk['on_step_ms']:.1f} vs {bk['off_step_ms']:.1f} ms/step",
            )
        )
        out.append(
            figure(
                "(info) the same inside the backup run: executions with vs without a backup",
                [x["within_run"]["pct"] for x in bk["repeats"] if x["within_run"]],
                "%",
            )
        )
    return out


def _check(key: str, value) -> bool | None:
    op, bound = TARGETS[key]
    if value is None or math.isnan(value):
        return None
    return value >= bound if op == ">=" else value <= bound


def report(res: dict, p: Params) -> str:
    sc, ar, bk = res.get("scaling"), res.get("allreduce"), res.get("backup")
    R = p.repeats

    def rng(v, fmt):
        return f" (range {fmt.format(v[0])} to {fmt.format(v[1])})" if len(v) == 2 and R > 1 else ""

    rows = []
    if sc:
        rows.append(
            [
                "efficiency: 2 MWMS workers / 2 independent processes (control)",
                f"{sc['efficiency']:.3f}",
                ">= 0.90",
                status(res["targets"]["efficiency"]["pass"]),
                f"b {sc['b_examples_per_sec']:.0f} ex/s vs c {sc['c_examples_per_sec']:.0f} ex/s"
                + rng(sc["efficiency_range"], "{:.3f}"),
            ]
        )
        rows.append(
            [
                "(info) weak scaling: 2 MWMS workers / (2 x 1 pinned process)",
                f"{sc['weak_scaling']:.3f}",
                "-",
                "-",
                f"a {sc['a_examples_per_sec']:.0f} ex/s" + rng(sc["weak_scaling_range"], "{:.3f}"),
            ]
        )
    if bk:
        rows.append(
            [
                f"backup overhead per step, --backup-every {bk['backup_every']}",
                f"{bk['overhead_pct']:.2f}%",
                "<= 3%",
                status(res["targets"]["backup_overhead_pct"]["pass"]),
                f"{bk['on_step_ms']:.1f} vs {bk['off_step_ms']:.1f} ms/step"
                + rng(bk["overhead_pct_range"], "{:.2f}%"),
            ]
        )
        rows.append(
            [
                "(info) the same from inside the backup run: executions with vs without a backup",
                f"{bk['within_run_pct']:.2f}%",
                "-",
                "-",
                f"{bk['within_run_per_backup_ms']:.0f} ms per backup, one every {bk['backup_every']} steps",
            ]
        )
    parts = []
    if rows:
        parts.append(
            markdown_table(
                ["B3 multi-worker scaling", f"median of {R}", "target", "status", "detail"], rows
            )
        )
    if ar:
        arows = [
            [
                f"{mb} MB",
                f"{ar['sizes'][str(mb)]['ms']:.2f}",
                f"{ar['sizes'][str(mb)]['model_ms']:.2f}",
                f"{ar['sizes'][str(mb)]['ratio_to_model']:.2f}x",
                f"{ar['sizes'][str(mb)]['bus_bandwidth_Bps'] / 1e9:.2f}",
            ]
            for mb in ar["sizes_mb"]
        ]
        parts.append(
            markdown_table(
                [
                    "all-reduce, 2 workers, float32",
                    "measured ms",
                    "ring model ms",
                    "measured / model",
                    "bus GB/s",
                ],
                arows,
            )
        )
    lk = res.get("links")
    if lk:
        parts.append(
            markdown_table(
                [
                    "2 MWMS workers on 2 simulated hosts",
                    "efficiency",
                    "ex/s",
                    "ms/step",
                    "MB/step on the link",
                    "ring model MB",
                    "ring model ms",
                ],
                [
                    [
                        f"{row['gbit']:g} Gbit/s, {row['variant']}"
                        if row["gbit"]
                        else f"loopback, {row['variant']}",
                        f"{row['efficiency']:.3f}",
                        f"{row['examples_per_sec']:.0f}",
                        f"{row['step_ms']:.0f}",
                        f"{row['link_bytes_per_step'] / 1e6:.2f}" if row["gbit"] else "-",
                        f"{row['ring_model_bytes_per_step'] / 1e6:.2f}",
                        f"{row['ring_model_ms']:.2f}" if row["gbit"] else "-",
                    ]
                    for row in lk["table"]
                ],
            )
        )
    notes = []
    if p.smoke:
        notes.append(
            "SMOKE MODE: tiny batches and step counts, one repeat; these figures mean nothing."
        )
    kept = res.get("kept_from")
    if kept and kept.get("phases"):
        notes.append(
            f"Kept from the run of {kept['date_utc'][:10]} on {kept['cpu']}: the "
            f"{', '.join(kept['phases'])} phase(s); the rest measured now, on the machine below."
        )
    env = res["environment"]
    notes.append(
        f"{env['processor']}, {env['usable_cores']} usable cores (cores {res['cores'][:2]} used), "
        f"TF {env.get('tensorflow')}; medians over {R} repeats, sides interleaved."
    )
    if sc:
        notes.append(
            f"Scaling: `{p.model}` on MNIST, B = {p.batch} per process, {p.warmup_steps} warm-up + {p.steps} timed "
            f"steps per process on every side; throughput = examples/s over the timed window (b: {2 * p.batch} per "
            "global step of the slower worker; a, c: sum of the processes). Processes pinned with "
            f"sched_setaffinity before TensorFlow starts, TF_NUM_INTRAOP_THREADS={p.intra_threads}, "
            f"TF_NUM_INTEROP_THREADS={p.inter_threads}; c's windows overlapped "
            f"{100 * median(x['c'].get('window_overlap', float('nan')) for x in sc['repeats']):.0f}% (median)."
        )
    if ar:
        notes.append(
            f"All-reduce: median of {p.allreduce_iters} timed calls after {p.allreduce_warmup} warm-up per size "
            f"(collective={p.collective}); model = 2(N-1)/N x size / loopback TCP bandwidth "
            f"{ar['bandwidth_Bps'] / 1e9:.2f} GB/s (one direction; {ar['bandwidth_duplex_Bps'] / 1e9:.2f} GB/s per "
            f"direction when both send at once), measured between the same two pinned processes with "
            f"{p.bandwidth_mb} MB copies."
        )
    if lk:
        notes.append(
            f"Links: side b launched with `tfopt launch --hosts 2 --link RATE`, each worker in a network "
            "namespace of its own, joined through a bridge by veth pairs shaped with tc (tbf) each way; "
            f"efficiency against the same repeat's control (c, {lk['c_examples_per_sec']:.0f} ex/s). "
            "MB/step: bytes each worker sent on its veth over the timed window (the kernel's counters), "
            "per step; ring model: 2(N-1)/N x gradient bytes per worker, and that over the link rate. "
            f"packed: --bytes-per-pack {lk['pack_bytes']}; bfloat16: --allreduce-dtype bfloat16."
        )
    if bk:
        spe_on = sorted({n for x in bk["repeats"] for n in x["on"]["steps_per_execution"]})
        spe_off = sorted({n for x in bk["repeats"] for n in x["off"]["steps_per_execution"]})
        notes.append(
            f"Backups: one_device, `{p.backup_model}`, batch {p.backup_batch}, "
            f"{'pinned to 1 core' if p.backup_pinned else 'unpinned (default threads)'}, {p.backup_warmup_steps} "
            f"warm-up + {p.backup_steps} timed in-epoch steps; steps per execution (tfopt's choice) "
            f"{spe_on} with backups, {spe_off} without."
        )
    q = res["quiet_gate"]
    notes.append(
        (
            f"Shared machine: repeats re-run when other processes used > {100 * q['threshold']:.0f}% of the "
            "cores "
            if q["enabled"]
            else "Shared machine: re-running disturbed repeats was off "
        )
        + f"({q['reruns']} re-runs, {q['extra_seconds']:.0f} s waiting and re-running, "
        f"{q['kept_disturbed_units']} of {q['units']} repeats kept disturbed); foreign load in kept "
        f"samples: median {100 * q['kept_foreign_load_median']:.0f}%, "
        f"max {100 * q['kept_foreign_load_max']:.0f}%."
    )
    notes.append(
        "Physical limit: 2 cores cap compute parallelism at 2x; each worker's all-reduce (its gRPC and "
        "collective threads) runs on the worker's one core, between its compute."
    )
    return "\n\n".join(parts) + "\n\n" + "\n".join("- " + n for n in notes)


# ----------------------------------------------------------------------------------------------


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeats", type=int, default=None, help="repeats per measurement (default 3)")
    ap.add_argument("--out", default=None, help="JSON output (default bench/results/scaling.json)")
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
    ap.add_argument(
        "--workdir",
        default=None,
        help="scratch directory for run directories (default: a temp dir)",
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
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="tiny, 1 repeat: about a minute, mostly TensorFlow start-ups (for tests)",
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
    out = args.out or os.path.join(REPO, "bench", "results", "scaling.json")
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
    res["quiet_gate"] = gate.summary()
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
    text = report(res, p)
    res["table_markdown"] = text
    write_json_atomic(out, res)
    print(text)
    print(f"\n[B3] {res['wall_seconds']:.0f} s wall; JSON written to {out}")
    return 0


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
