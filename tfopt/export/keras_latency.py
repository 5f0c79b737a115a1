"""Batch-1 latency of a Keras model itself, at a fixed TensorFlow thread count.

    python -m tfopt.export.keras_latency MODEL.keras --threads 1 --runs 200 --warmup 20

prints one JSON line: ``{"p50_ms", "p95_ms", "mean_ms", "min_ms", "runs", "warmup", "threads",
"inter_op_threads", "tensorflow"}``. This is the float baseline the .tflite latencies are
compared with: ``model(x, training=False)`` inside a ``tf.function`` (traced during warm-up),
one example, the input fixed, each call timed on its own, like the LiteRT ``invoke()`` timings
in :mod:`tfopt.export.benchmark`.

TensorFlow fixes its thread pools when its runtime starts, so a thread count can only be chosen
for a new process: :func:`measure` starts this module as a child with ``TF_NUM_INTRAOP_THREADS=N``
and ``TF_NUM_INTEROP_THREADS=1`` (the child also sets them through ``tf.config.threading``
before any op runs, and reports what TensorFlow says it uses). Exit codes of the child: 0 done,
2 a user error (one line on stderr).

Starting TensorFlow takes seconds: :class:`Timer` starts the child early (the export stage does
it while it converts), lets it load the model and wait, and sends it the word to time when the
caller's own timings are over, so that nothing else runs while either measures.
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile

from tfopt.errors import ConfigError, ModelError

_TIMEOUT_S = 600.0


def _load(path: str, *, threads: int, trust_model: bool):
    """Runs in the child: starts TensorFlow at ``threads`` threads and loads the model as export sees it."""
    from tfopt._keras import tf
    from tfopt.export import native_stderr

    with native_stderr.filtered():  # the runtime starts here: CUDA probe notices
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        tf.config.list_physical_devices()
    from tfopt.models.io import load_model
    from tfopt.optimize.common import strip_wrappers

    # As the export stage sees it: pruning/clustering wrappers stripped, QAT wrappers kept.
    return strip_wrappers(load_model(path, trust_model=trust_model))


def _time_model(model, *, runs: int, warmup: int) -> dict:
    """Runs in the child: traces ``model`` at batch 1, warms up, times ``runs`` single-example calls."""
    import time

    import numpy as np

    from tfopt._keras import tf

    shape = [1, *[int(d) for d in model.input_shape[1:]]]
    x = tf.constant(np.random.default_rng(0).random(shape, dtype=np.float32))
    fn = tf.function(lambda t: model(t, training=False))
    out = fn(x)  # traces
    for _ in range(warmup):
        out = fn(x)
    times = np.empty(runs)
    clock = time.perf_counter
    for i in range(runs):
        t0 = clock()
        out = fn(x)  # eager execution is synchronous on CPU: the call returns with the result computed
        times[i] = clock() - t0
    del out
    ms = times * 1e3
    return {"p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95)),
            "mean_ms": float(ms.mean()), "min_ms": float(ms.min()), "runs": runs, "warmup": warmup,
            "threads": int(tf.config.threading.get_intra_op_parallelism_threads()),
            "inter_op_threads": int(tf.config.threading.get_inter_op_parallelism_threads()),
            "tensorflow": tf.__version__}


class Timer:
    """A child process that starts TensorFlow and loads a Keras model now, and times it when told.

    ``Timer(path, threads=1)`` returns at once; the child imports TensorFlow and loads the model
    in the background, then waits. :meth:`ready` blocks until it waits (call it before timing
    anything else, so that the child's start-up never competes with a measurement);
    :meth:`result` lets it time the model and returns what :func:`measure` returns. Use it as a
    context manager (or call :meth:`close`): a child never told to time is stopped.

    Raises:
        ConfigError: ``threads``/``runs`` < 1 or ``warmup`` < 0 (from the constructor).
        ModelError: the child failed or timed out (from :meth:`ready` and :meth:`result`).
    """

    def __init__(self, path: str, *, threads: int = 1, runs: int = 200, warmup: int = 20, trust_model: bool = False,
                 timeout: float = _TIMEOUT_S):
        _check(threads, runs, warmup)
        self.path, self.threads, self.timeout = path, threads, timeout
        env = dict(os.environ, TF_NUM_INTRAOP_THREADS=str(threads), TF_NUM_INTEROP_THREADS="1")
        # The child must import this tfopt, wherever the parent found it (a source checkout included).
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
        cmd = [sys.executable, "-m", "tfopt.export.keras_latency", path, "--threads", str(threads), "--runs",
               str(runs), "--warmup", str(warmup), "--wait"] + (["--trust-model"] if trust_model else [])
        self._stderr = tempfile.TemporaryFile(mode="w+")  # a pipe nobody reads could fill and stall the child
        self._proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._stderr, bufsize=0)
        self._ready = False
        self._out = b""  # what the child printed and ready() read

    def __enter__(self) -> "Timer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def ready(self) -> None:
        """Blocks until the child has loaded the model and waits (at once when it already does)."""
        if self._ready:
            return
        while b'{"ready"' not in self._out:
            ready, _, _ = select.select([self._proc.stdout], [], [], self.timeout)
            if not ready:
                self.close()
                raise ModelError(f"loading the Keras model {self.path} for timing took over {self.timeout:.0f} s")
            chunk = os.read(self._proc.stdout.fileno(), 65536)
            if not chunk:  # the child exited before it was ready
                self._fail(f"exit code {self._proc.wait()}")
            self._out += chunk
        self._ready = True

    def result(self) -> dict:
        """Lets the child time the model; returns its JSON (see :func:`measure`)."""
        self.ready()
        try:
            out, _ = self._proc.communicate(b"time\n", timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self.close()
            raise ModelError(f"timing the Keras model {self.path} at {self.threads} thread(s) took over "
                             f"{self.timeout:.0f} s; lower --runs") from None
        lines = [ln for ln in (self._out + out).decode(errors="replace").splitlines()
                 if ln.startswith("{") and not ln.startswith('{"ready"')]
        if self._proc.returncode != 0 or not lines:
            self._fail(f"exit code {self._proc.returncode}")
        self.close()
        return json.loads(lines[-1])

    def close(self) -> None:
        """Stops the child if it still runs and releases its files."""
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        for f in (self._proc.stdin, self._proc.stdout, self._stderr):
            if f and not f.closed:
                f.close()

    def _fail(self, fallback: str) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._stderr.seek(0)
        tail = (self._stderr.read().strip().splitlines() or [fallback])[-1][:300]
        self.close()
        raise ModelError(f"timing the Keras model {self.path} at {self.threads} thread(s) failed: {tail}")


def measure(path: str, *, threads: int = 1, runs: int = 200, warmup: int = 20, trust_model: bool = False,
            timeout: float = _TIMEOUT_S) -> dict:
    """Times a Keras model at batch 1 in a fresh process with ``threads`` intra-op threads.

    Args:
        path: The ``.keras`` file (or SavedModel directory) to time.
        threads: TensorFlow intra-op threads (inter-op is 1).
        runs: Timed calls.
        warmup: Untimed calls after tracing.
        trust_model: Load models that can run code (see ``tfopt.models.io.load_model``).
        timeout: Seconds before the child is killed.

    Returns:
        The child's JSON: ``p50_ms``, ``p95_ms``, ``mean_ms``, ``min_ms``, ``runs``, ``warmup``,
        ``threads``, ``inter_op_threads``, ``tensorflow``.

    Raises:
        ConfigError: ``threads``/``runs`` < 1 or ``warmup`` < 0.
        ModelError: the child failed (its last stderr line is quoted) or timed out.
    """
    with Timer(path, threads=threads, runs=runs, warmup=warmup, trust_model=trust_model, timeout=timeout) as timer:
        return timer.result()


def _check(threads: int, runs: int, warmup: int) -> None:
    if threads < 1 or runs < 1 or warmup < 0:
        raise ConfigError(f"threads={threads} and runs={runs} must be >= 1 and warmup={warmup} >= 0 "
                          "(--threads, --runs, --warmup)")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m tfopt.export.keras_latency``: prints one JSON line; returns the exit code."""
    from tfopt import cli

    p = cli.ArgumentParser(prog="python -m tfopt.export.keras_latency",
                           description="Batch-1 latency of a Keras model at a fixed TensorFlow thread count.")
    p.add_argument("model", help="a .keras file")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    p.add_argument("--runs", type=int, default=200, help="timed calls (default 200)")
    p.add_argument("--warmup", type=int, default=20, help="untimed calls after tracing (default 20)")
    p.add_argument("--trust-model", action="store_true", help="load a model file that can run code (only if trusted)")
    p.add_argument("--wait", action="store_true", help="load the model, print {\"ready\": true}, and time it "
                   "only once a line arrives on stdin (how Timer runs it)")
    args = p.parse_args(argv)

    def body() -> int:
        _check(args.threads, args.runs, args.warmup)
        if not os.path.exists(args.model):
            raise ModelError(f"model {args.model!r} does not exist; give a .keras file")
        # Thread pools are sized when TensorFlow's runtime starts: the variables must be set first.
        if os.environ.get("TF_NUM_INTRAOP_THREADS") != str(args.threads):
            os.environ["TF_NUM_INTRAOP_THREADS"] = str(args.threads)
            os.environ["TF_NUM_INTEROP_THREADS"] = "1"
        model = _load(args.model, threads=args.threads, trust_model=args.trust_model)
        if args.wait:
            print(json.dumps({"ready": True}), flush=True)
            if not sys.stdin.readline():  # the parent closed: nothing to time
                return 0
        result = _time_model(model, runs=args.runs, warmup=args.warmup)
        print(json.dumps(result), flush=True)
        return 0

    return cli.run_main("tfopt.export.keras_latency", body)


if __name__ == "__main__":
    sys.exit(main())

