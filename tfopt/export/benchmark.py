"""What a model costs: LiteRT latency, file size, gzip size, and the Keras model's params/FLOPs.

Latency is measured in-process with the LiteRT interpreter at batch 1: the input is set once,
then ``warmup`` untimed and ``runs`` timed ``invoke()`` calls; p50 and p95 are reported per thread
count. ``kernel_report`` says which kernels run (how much of the graph the XNNPACK delegate took),
because that decides whether int8 is faster than float on a CPU. ``litert_benchmark`` runs the
``litert-benchmark`` command (the CompiledModel API) as a cross-check when it is installed.
``keras_latency`` times the Keras model itself (``model(x, training=False)`` in a ``tf.function``,
batch 1) in a child process per thread count (:mod:`tfopt.export.keras_latency`): the float
baseline every .tflite is compared with.
"""

from __future__ import annotations

import gc
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from tfopt.core import native_stderr
from tfopt.core.errors import ConfigError
from tfopt.core.timing import time_calls
from tfopt.export.evaluate import TFLiteModel

GZIP_LEVEL = 9


def file_sizes(content: bytes) -> dict:
    """Raw and gzip (level 9) size in bytes: what the device stores and what a download costs."""
    return {
        "size_bytes": len(content),
        "gzip_bytes": len(gzip.compress(content, GZIP_LEVEL, mtime=0)),
    }


def kernel_report(model: TFLiteModel) -> dict:
    """Which kernels run: XNNPACK delegate partitions, delegated ops, and ops left on LiteRT's own kernels.

    A delegate node covers the original nodes between its input and output tensors; they are
    found by walking back from its outputs until its inputs.
    """
    from tfopt.core._compat import interpreter_ops_details  # imports TensorFlow: only when asked

    ops = interpreter_ops_details(model.interpreter)  # the only view of the execution plan
    delegates = [op for op in ops if op["op_name"] == "DELEGATE"]
    originals = [op for op in ops if op["op_name"] != "DELEGATE"]
    producer = {int(t): op for op in originals for t in op["outputs"]}
    delegated: set[int] = set()
    for d in delegates:
        boundary = {int(t) for t in d["inputs"]}
        stack = [int(t) for t in d["outputs"]]
        while stack:
            t = stack.pop()
            op = producer.get(t)
            if t in boundary or op is None or op["index"] in delegated:
                continue
            delegated.add(op["index"])
            stack.extend(int(i) for i in op["inputs"] if int(i) >= 0)
    cpu_ops = [op["op_name"] for op in originals if op["index"] not in delegated]
    return {
        "xnnpack": model.xnnpack,
        "delegate_partitions": len(delegates),
        "delegated_ops": len(delegated),
        "total_ops": len(originals),
        "builtin_kernel_ops": sorted(set(cpu_ops)),
    }


def _example_input(model: TFLiteModel, seed: int = 0) -> np.ndarray:
    shape = [1 if d < 0 else d for d in model.input_signature]
    x = np.random.default_rng(seed).random(shape, dtype=np.float32)  # in [0, 1), like scaled images
    return model.quantize_input(x)


def _compiled_call(content: bytes, threads: int, q: np.ndarray):
    """A CompiledModel (ai-edge-litert, CPU) of ``content`` with its input set: its run, and its report."""
    # CompiledModel announces (on fd 2) the accelerators and vendor plugins that are not installed
    # when it builds its environment, at the first buffer or run: all of that inside the filter.
    with native_stderr.filtered():
        try:
            from ai_edge_litert.compiled_model import CompiledModel
            from ai_edge_litert.options import CpuOptions, Options
        except ImportError:
            import importlib.metadata as md

            raise ConfigError(
                f"--runtime compiled needs ai-edge-litert's CompiledModel, which ai-edge-litert "
                f"{md.version('ai-edge-litert')} lacks; use --runtime interpreter or pip install "
                "'ai-edge-litert>=2.3'"
            ) from None
        cm = CompiledModel.from_buffer(
            content, options=Options(cpu_options=CpuOptions(num_threads=threads))
        )
        inputs, outputs = cm.create_input_buffers(0), cm.create_output_buffers(0)
        inputs[0].write(np.ascontiguousarray(q))
        cm.run_by_index(0, inputs, outputs)  # first run: XNNPACK packs the weights

    held = {"model": cm, "buffers": (inputs, outputs)}

    def call():
        held["model"].run_by_index(0, inputs, outputs)

    def close():  # it says goodbye to each accelerator on fd 2 too
        with native_stderr.filtered():
            fully = held["model"].is_fully_accelerated()
            environment = held["model"].environment
            held.clear()
            inputs.clear()
            outputs.clear()
            cm.close()
            environment.close()
            gc.collect()  # the wrappers' last references, so the environment goes inside the filter
        native_stderr.filter_until_exit()  # the buffers' shared environment goes at exit
        return fully

    return call, close


class Timer:
    """One .tflite, ready to be timed at batch 1: its input set, its kernels known.

    Args:
        model: A .tflite path or flatbuffer.
        threads: Interpreter threads.
        xnnpack: Keep LiteRT's default XNNPACK delegate (False: builtin kernels only).
        runtime: ``interpreter`` (LiteRT's Interpreter), ``latest`` (the Interpreter with
            ``experimental_default_delegate_latest_features``) or ``compiled`` (ai-edge-litert's
            CompiledModel on the CPU, default CpuOptions); ``xnnpack`` applies to the interpreter.

    Raises:
        ModelError: the model cannot be loaded.
    """

    def __init__(
        self,
        model: str | bytes,
        *,
        threads: int = 1,
        xnnpack: bool = True,
        runtime: str = "interpreter",
    ):
        m = TFLiteModel(
            model, num_threads=threads, xnnpack=xnnpack, latest_features=runtime == "latest"
        )
        q = _example_input(m)
        m.invoke_raw(q)  # sets the input and sizes the tensors; later calls only invoke
        self.call, self.kernels, self._close = m.interpreter.invoke, kernel_report(m), None
        self.threads, self.runtime = threads, runtime
        if runtime == "compiled":  # the same graph partition, run by CompiledModel
            self.call, self._close = _compiled_call(m.content, threads, q)

    def close(self) -> dict:
        """Releases the runtime; returns the kernel report."""
        if self._close is not None:
            self.kernels = {
                **self.kernels,
                "runtime": "compiled",
                "fully_accelerated": self._close(),
            }
            self._close = None
        return self.kernels


def latency(
    model: str | bytes,
    *,
    threads: int = 1,
    warmup: int = 20,
    runs: int = 200,
    xnnpack: bool = True,
    runtime: str = "interpreter",
) -> dict:
    """Batch-1 latency of one .tflite with the LiteRT interpreter (see :class:`Timer`).

    Args:
        model: A .tflite path or flatbuffer.
        threads: Interpreter threads.
        warmup: Untimed runs first (caches, lazy packing of weights).
        runs: Timed runs.
        xnnpack: Keep LiteRT's default XNNPACK delegate (False: builtin kernels only).
        runtime: ``interpreter``, ``latest`` or ``compiled`` (see :class:`Timer`).

    Returns:
        ``{"p50_ms", "p95_ms", "mean_ms", "min_ms", "runs", "warmup", "threads", "kernels"}``.

    Raises:
        ConfigError: ``runs`` < 1 or ``warmup`` < 0.
        ModelError: the model cannot be loaded.
    """
    check_runs(runs, warmup)
    timer = Timer(model, threads=threads, xnnpack=xnnpack, runtime=runtime)
    timed = time_calls(timer.call, warmup=warmup, runs=runs)
    return {**timed, "threads": threads, "runtime": runtime, "kernels": timer.close()}


def check_runs(runs: int, warmup: int) -> None:
    """Raises ConfigError unless ``runs`` >= 1 and ``warmup`` >= 0."""
    if runs < 1 or warmup < 0:
        raise ConfigError(f"runs={runs} must be >= 1 and warmup={warmup} >= 0 (--runs, --warmup)")


def litert_benchmark(
    path: str, *, threads: int = 1, runs: int = 200, warmup: int = 20, timeout: float = 120.0
) -> dict | None:
    """Runs the ``litert-benchmark`` command and returns its JSON latency figures.

    Returns None when the command is not installed or fails (it is a cross-check, not required).
    """
    exe = shutil.which("litert-benchmark")
    if exe is None:
        venv_exe = os.path.join(
            os.path.dirname(os.path.abspath(sys.executable)), "litert-benchmark"
        )
        exe = venv_exe if os.path.exists(venv_exe) else None
    if exe is None:
        return None
    with tempfile.TemporaryDirectory(prefix="tfopt-litert-") as tmp:
        out = os.path.join(tmp, "result.json")
        try:
            proc = subprocess.run(
                [
                    exe,
                    "--model",
                    path,
                    "--num_threads",
                    str(threads),
                    "--num_runs",
                    str(runs),
                    "--warmup_runs",
                    str(warmup),
                    "--result_json",
                    out,
                ],
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        if proc.returncode != 0 or not os.path.exists(out):
            return None
        with open(out, encoding="utf-8") as f:
            latency_ms = json.load(f).get("latency", {})
    return {
        "p50_ms": latency_ms.get("median_ms"),
        "p95_ms": latency_ms.get("p95_ms"),
        "mean_ms": latency_ms.get("avg_ms"),
        "runs": runs,
        "threads": threads,
        "tool": "litert-benchmark",
    }


def keras_cost(model) -> dict:
    """Parameters and FLOPs (per example, multiply-add = 2) of a Keras model.

    FLOPs come from TensorFlow's profiler on the model's frozen graph at batch 1.
    """
    from tfopt.core._keras import tf

    from tfopt.core._compat import convert_variables_to_constants_v2

    shape = [1, *[int(d) for d in model.input_shape[1:]]]
    flops = None
    try:
        fn = tf.function(lambda x: model(x, training=False)).get_concrete_function(
            tf.TensorSpec(shape, tf.float32)
        )
        frozen = convert_variables_to_constants_v2(fn)
        builder = tf.compat.v1.profiler.ProfileOptionBuilder
        opts = builder(builder.float_operation()).with_empty_output().build()
        previous = tf.get_logger().level
        tf.get_logger().setLevel("ERROR")  # the v1 profiler warns about its own deprecation
        try:
            info = tf.compat.v1.profiler.profile(
                graph=frozen.graph, run_meta=tf.compat.v1.RunMetadata(), cmd="op", options=opts
            )
        finally:
            tf.get_logger().setLevel(previous)
        flops = int(info.total_float_ops)
    except (
        ValueError,
        tf.errors.OpError,
    ):  # a model that cannot be traced/frozen at batch 1: params only
        flops = None
    return {"params": int(model.count_params()), "flops": flops}


def weights_bytes(model) -> int:
    """Bytes of every weight of a Keras model (trainable or not, each variable once) at its dtype."""
    seen: set[int] = set()
    total = 0
    for v in model.weights:
        if id(v) in seen:
            continue
        seen.add(id(v))
        total += int(np.prod(v.shape)) * v.dtype.size
    return total


class KerasLatency:
    """:func:`keras_latency`, its children started now and told to time later.

    One :class:`tfopt.export.keras_latency.Timer` per thread count starts TensorFlow and loads the
    model while the caller does other work; :meth:`ready` waits for all of them (call it before
    timing anything else); :meth:`result` times the model at each count, one child after the
    other. Use it as a context manager: children never told to time are stopped.
    """

    def __init__(
        self,
        path: str,
        *,
        threads: tuple[int, ...] = (1, 2),
        warmup: int = 20,
        runs: int = 200,
        trust_model: bool = False,
    ):
        from tfopt.export.keras_latency import Timer

        self._timers: dict[str, Timer] = {}
        try:
            for t in threads:
                self._timers[f"{t}t"] = Timer(
                    path, threads=t, runs=runs, warmup=warmup, trust_model=trust_model
                )
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> KerasLatency:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def ready(self) -> None:
        """Blocks until every child has loaded the model and waits."""
        for timer in self._timers.values():
            timer.ready()

    def result(self) -> dict:
        """``{"1t": {...}, "2t": ...}``: what :func:`keras_latency` returns."""
        return {key: timer.result() for key, timer in self._timers.items()}

    def close(self) -> None:
        """Stops the children that still run."""
        for timer in self._timers.values():
            timer.close()


def keras_latency(
    path: str,
    *,
    threads: tuple[int, ...] = (1, 2),
    warmup: int = 20,
    runs: int = 200,
    trust_model: bool = False,
) -> dict:
    """Batch-1 latency of the Keras model in ``path`` per TensorFlow intra-op thread count.

    Each count is measured in its own child process (thread pools are fixed when TensorFlow
    starts), one after the other so that they do not compete for the cores.

    Returns:
        ``{"1t": {"p50_ms", "p95_ms", "mean_ms", "min_ms", "runs", "warmup", "threads", ...}, "2t": ...}``.

    Raises:
        ConfigError: bad ``threads``, ``runs`` or ``warmup``.
        ModelError: a child failed.
    """
    with KerasLatency(
        path, threads=threads, warmup=warmup, runs=runs, trust_model=trust_model
    ) as timers:
        return timers.result()
