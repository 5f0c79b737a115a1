"""Benchmark B3's harnesses: the processes it starts (``scaling.py _train ...``, ``_allreduce``).

Nothing imported at module level starts TensorFlow: a harness must pin its core first.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time

from bench._common import (
    _CLK_TCK,
    _proc_stat,
    usable_cores,
)
from bench._scaling_params import MB

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
