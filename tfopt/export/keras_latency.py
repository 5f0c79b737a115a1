"""Batch-1 latency of a Keras model itself, at a fixed TensorFlow thread count.

    python -m tfopt.export.keras_latency MODEL.keras --threads 1 --runs 200 --warmup 20

prints one JSON line: ``{"p50_ms", "p95_ms", "mean_ms", "min_ms", "runs", "warmup", "threads",
"inter_op_threads", "tensorflow"}``. This is the float baseline the .tflite latencies are
compared with: ``model(x, training=False)`` inside a ``tf.function`` (traced before the warm-up),
one example, the input fixed, each call timed on its own, like the LiteRT ``invoke()`` timings
in :mod:`tfopt.export.benchmark`.

TensorFlow fixes its thread pools when its runtime starts, so a thread count can only be chosen
for a new process: :func:`measure` starts this module as a child with ``TF_NUM_INTRAOP_THREADS=N``
and ``TF_NUM_INTEROP_THREADS=1`` (the child also sets them through ``tf.config.threading``
before any op runs, and reports what TensorFlow says it uses). Exit codes of the child: 0 done,
2 a user error (one line on stderr).

Starting TensorFlow takes seconds: :class:`Timer` starts the child early (the export stage does
it while it converts), lets it load the model and wait, and sends it the word to time when the
caller's own timings are over, so that nothing else runs while either measures. A child that
has timed its model stays, idle, for the next Timer of the same process at the same thread
count (a pipeline's later export stages skip TensorFlow's start); it stops with the process.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import tempfile
import time

from tfopt.core.errors import ConfigError, ModelError

_TIMEOUT_S = 600.0


def _load(path: str, *, threads: int, trust_model: bool):
    """Runs in the child: starts TensorFlow at ``threads`` threads and loads the model as export sees it."""
    from tfopt.core._keras import tf

    from tfopt.core import native_stderr

    with native_stderr.filtered():  # the runtime starts here: CUDA probe notices
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        tf.config.list_physical_devices()
    from tfopt.compress.common import strip_wrappers
    from tfopt.models.io import load_model

    # As the export stage sees it: pruning/clustering wrappers stripped, QAT wrappers kept.
    return strip_wrappers(load_model(path, trust_model=trust_model))


def _prepare(model):
    """Runs in the child: the traced batch-1 call of ``model`` and its fixed input."""
    from tfopt.core._keras import tf

    import numpy as np

    shape = [1, *[int(d) for d in model.input_shape[1:]]]
    x = tf.constant(np.random.default_rng(0).random(shape, dtype=np.float32))
    fn = tf.function(lambda t: model(t, training=False))
    fn(x)  # traces
    return fn, x


def _time(fn, x, *, runs: int, warmup: int) -> dict:
    """Runs in the child: warms up, then times ``runs`` single-example calls of the traced ``fn``.

    Eager execution is synchronous on CPU: each call returns with its result computed.
    """
    from tfopt.core._keras import tf

    from tfopt.core.timing import time_calls

    return {
        **time_calls(lambda: fn(x), warmup=warmup, runs=runs),
        "threads": int(tf.config.threading.get_intra_op_parallelism_threads()),
        "inter_op_threads": int(tf.config.threading.get_inter_op_parallelism_threads()),
        "tensorflow": tf.__version__,
    }


def _serve(threads: int) -> int:
    """Runs in the child: loads and times the models named on stdin, one JSON answer per request."""
    from tfopt.core._keras import keras

    fn = x = None
    for line in sys.stdin:
        request = json.loads(line)
        if "load" in request:
            fn = x = None
            keras.backend.clear_session()  # the previous model's graphs go
            fn, x = _prepare(
                _load(
                    request["load"], threads=threads, trust_model=request.get("trust_model", False)
                )
            )
            print(json.dumps({"loaded": request["load"]}), flush=True)
        else:
            print(
                json.dumps(_time(fn, x, runs=request["runs"], warmup=request["warmup"])), flush=True
            )
    return 0  # stdin closed: the parent is done (or gone)


#: A serving child per thread count, idle between two models (one process starts TensorFlow once).
_IDLE: dict[int, _Child] = {}


@atexit.register
def _stop_idle_children() -> None:
    while _IDLE:
        _IDLE.popitem()[1].kill()


class _Child:
    """``python -m tfopt.export.keras_latency --serve --threads N``: JSON requests in, JSON lines out."""

    def __init__(self, threads: int):
        env = dict(os.environ, TF_NUM_INTRAOP_THREADS=str(threads), TF_NUM_INTEROP_THREADS="1")
        # The child must import this tfopt, wherever the parent found it (a source checkout included).
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (root, os.environ.get("PYTHONPATH", "")) if p
        )
        self._stderr = tempfile.TemporaryFile(
            mode="w+"
        )  # a pipe nobody reads could fill and stall the child
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tfopt.export.keras_latency",
                "--serve",
                "--threads",
                str(threads),
            ],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            bufsize=0,
        )
        self._buffer = b""

    def alive(self) -> bool:
        """True while the process runs."""
        return self.proc.poll() is None

    def send(self, request: dict) -> None:
        """Writes one request line (raises BrokenPipeError when the child is gone)."""
        self.proc.stdin.write((json.dumps(request) + "\n").encode())

    def receive(self, timeout: float) -> dict | None:
        """The next JSON line the child prints; None when ``timeout`` passes first.

        Raises:
            EOFError: the child closed its output (it exited) first.
        """
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                if line.startswith(b"{"):
                    return json.loads(line)
            ready, _, _ = select.select(
                [self.proc.stdout], [], [], max(0.0, deadline - time.monotonic())
            )
            if not ready:
                return None
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                raise EOFError
            self._buffer += chunk

    def last_error(self, fallback: str) -> str:
        """The last line the child wrote to stderr (or ``fallback``)."""
        self._stderr.seek(0)
        return (self._stderr.read().strip().splitlines() or [fallback])[-1][:300]

    def kill(self) -> None:
        """Stops the process and releases its files."""
        if self.alive():
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self._stderr):
            if f and not f.closed:
                f.close()


def _child_for(threads: int, request: dict) -> _Child:
    """The idle child at ``threads`` (a new one when there is none, or it is gone), sent ``request``."""
    child = _IDLE.pop(threads, None)
    if child is not None:
        try:
            child.send(request)
            return child
        except BrokenPipeError:
            child.kill()
    child = _Child(threads)
    child.send(request)
    return child


class Timer:
    """Times one Keras model in a child process at a fixed thread count: loads it now, times it when told.

    ``Timer(path, threads=1)`` returns at once; the child (started now, or an idle one of this
    process at the same thread count, which has TensorFlow running already) loads the model and
    traces its call in the background, then waits. :meth:`ready` blocks until it waits (call it
    before timing anything else, so that the child's work never competes with a measurement);
    :meth:`result` lets it time the model and returns what :func:`measure` returns; the child then
    stays idle (no CPU) for the next Timer of this process and stops when the process exits. Use
    it as a context manager (or call :meth:`close`): a child never told to time is stopped.

    Raises:
        ConfigError: ``threads``/``runs`` < 1 or ``warmup`` < 0 (from the constructor).
        ModelError: the child failed or timed out (from :meth:`ready` and :meth:`result`).
    """

    def __init__(
        self,
        path: str,
        *,
        threads: int = 1,
        runs: int = 200,
        warmup: int = 20,
        trust_model: bool = False,
        timeout: float = _TIMEOUT_S,
    ):
        _check(threads, runs, warmup)
        self.path, self.threads, self.runs, self.warmup, self.timeout = (
            path,
            threads,
            runs,
            warmup,
            timeout,
        )
        self._child: _Child | None = _child_for(threads, {"load": path, "trust_model": trust_model})
        self._ready = False

    @property
    def pid(self) -> int | None:
        """The child's process id while this Timer holds it."""
        return self._child.proc.pid if self._child else None

    def __enter__(self) -> Timer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def ready(self) -> None:
        """Blocks until the child has loaded the model and waits (at once when it already does)."""
        if not self._ready:
            self._answer("loading", "loaded")
            self._ready = True

    def result(self) -> dict:
        """Lets the child time the model; returns its JSON (see :func:`measure`)."""
        self.ready()
        self._child.send({"runs": self.runs, "warmup": self.warmup})
        out = self._answer(f"timing at {self.threads} thread(s)", "p50_ms")
        child, self._child = self._child, None
        if self.threads in _IDLE:  # another Timer's child already waits: one is enough
            child.kill()
        else:
            _IDLE[self.threads] = child
        return out

    def close(self) -> None:
        """Stops the child unless it finished its work and waits for the next model."""
        if self._child is not None:
            self._child.kill()
            self._child = None

    def _answer(self, what: str, key: str) -> dict:
        try:
            message = self._child.receive(self.timeout)
        except EOFError:
            message = {}
        if message and key in message:
            return message
        if message is None:
            self.close()
            raise ModelError(
                f"{what} the Keras model {self.path} took over {self.timeout:.0f} s; lower --runs"
            )
        if self._child.alive():  # it answered something else: stop it
            self._child.proc.kill()
        self._child.proc.wait()  # its stderr is complete
        tail = self._child.last_error(f"exit code {self._child.proc.returncode}")
        self.close()
        raise ModelError(
            f"timing the Keras model {self.path} at {self.threads} thread(s) failed: {tail}"
        )


def measure(
    path: str,
    *,
    threads: int = 1,
    runs: int = 200,
    warmup: int = 20,
    trust_model: bool = False,
    timeout: float = _TIMEOUT_S,
) -> dict:
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
    with Timer(
        path, threads=threads, runs=runs, warmup=warmup, trust_model=trust_model, timeout=timeout
    ) as timer:
        return timer.result()


def _check(threads: int, runs: int, warmup: int) -> None:
    if threads < 1 or runs < 1 or warmup < 0:
        raise ConfigError(
            f"threads={threads} and runs={runs} must be >= 1 and warmup={warmup} >= 0 "
            "(--threads, --runs, --warmup)"
        )


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m tfopt.export.keras_latency``: prints one JSON line; returns the exit code."""
    from tfopt.config import cli

    p = cli.ArgumentParser(
        prog="python -m tfopt.export.keras_latency",
        description="Batch-1 latency of a Keras model at a fixed TensorFlow thread count.",
    )
    p.add_argument("model", nargs="?", help="a .keras file")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    p.add_argument("--runs", type=int, default=200, help="timed calls (default 200)")
    p.add_argument(
        "--warmup", type=int, default=20, help="untimed calls after tracing (default 20)"
    )
    p.add_argument(
        "--trust-model",
        action="store_true",
        help="load a model file that can run code (only if trusted)",
    )
    p.add_argument(
        "--serve",
        action="store_true",
        help='read JSON requests on stdin instead ({"load": PATH} '
        'loads and traces a model, {"runs": N, "warmup": W} times it): how Timer runs it',
    )
    args = p.parse_args(argv)

    def body() -> int:
        _check(args.threads, args.runs, args.warmup)
        # Thread pools are sized when TensorFlow's runtime starts: the variables must be set first.
        if os.environ.get("TF_NUM_INTRAOP_THREADS") != str(args.threads):
            os.environ["TF_NUM_INTRAOP_THREADS"] = str(args.threads)
            os.environ["TF_NUM_INTEROP_THREADS"] = "1"
        if args.serve:
            return _serve(args.threads)
        if not args.model:
            raise ConfigError("give the .keras file to time (or --serve)")
        if not os.path.exists(args.model):
            raise ModelError(f"model {args.model!r} does not exist; give a .keras file")
        fn, x = _prepare(_load(args.model, threads=args.threads, trust_model=args.trust_model))
        print(json.dumps(_time(fn, x, runs=args.runs, warmup=args.warmup)), flush=True)
        return 0

    return cli.run_main("tfopt.export.keras_latency", body)


if __name__ == "__main__":
    sys.exit(main())
