"""The ops of a .tflite: each one's multiply-adds and kernel class, and each one timed alone.

Per-op latency comes from one-op models: every op is cut out of its .tflite (the same tensors,
weights, quantization parameters and fused activation) and timed with the LiteRT interpreter the
whole model runs in (XNNPACK, the same thread count). Why one-op models and not an op profiler:
ai-edge-litert 2.3's ``litert-benchmark`` command has no op-profiling flag (its ``--help`` lists
none), its Python ``Interpreter`` exposes no profiler, and the C API's profiler
(``LiteRtCompiledModelGetProfiler``) is reachable only through ctypes and unpublished option
structures; TFLite's ``benchmark_model --enable_op_profiling`` is a separate binary that no
package installs. One-op models time the very kernels the model runs, through the public
interpreter API; what they miss (caches warm from the previous op, the delegate's fusion across
ops) is why :mod:`tfopt.export.roofline` scales their sum to the whole model's p50.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from tfopt.core import native_stderr
from tfopt.core._compat import (
    interpreter_ops_details,
    read_tflite_model,
    tflite_schema,
    write_tflite_model,
)
from tfopt.core.timing import time_calls
from tfopt.export.evaluate import _interpreter_class

# Kernel classes a roofline distinguishes: the multiply-adds of a regular convolution or a
# matrix product, of a depthwise convolution, and ops whose cost is memory traffic.
CONV, DEPTHWISE, OTHER = "conv/FC", "depthwise", "elementwise/other"
CLASSES = (CONV, DEPTHWISE, OTHER)
_CONV_OPS = ("CONV_2D", "FULLY_CONNECTED", "BATCH_MATMUL", "TRANSPOSE_CONV")
_INT_WEIGHTS = {9: "int8", 17: "int4", 20: "int2"}  # TensorType codes of integer weights
_TYPES = {0: "float32", 1: "float16", 3: "uint8", 7: "int16", 9: "int8", 17: "int4"}


@dataclass(frozen=True)
class OpCost:
    """One op of subgraph 0: what it computes and on which kind of arithmetic."""

    index: int
    op: str  # builtin name, e.g. CONV_2D
    kind: str  # one of CLASSES
    macs: int  # multiply-adds at batch 1 (0 outside CONV and DEPTHWISE)
    arithmetic: str  # "int8" (integer weights: full-integer, dynamic range, 16x8) or "fp32"
    activations: str  # the first input's type: float32, int8, int16, ...


def model_ops(content: bytes) -> list[tuple[str, str]]:
    """``(op name, first output tensor name)`` of every op of subgraph 0, in execution order."""
    Interpreter, OpResolverType = _interpreter_class()
    with native_stderr.filtered():
        interpreter = Interpreter(
            model_content=content,
            experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
        )
    names = {t["index"]: t["name"] for t in interpreter.get_tensor_details()}
    return [
        (op["op_name"], names.get(int(op["outputs"][0]), "") if len(op["outputs"]) else "")
        for op in interpreter_ops_details(interpreter)
    ]


def _builtin_names() -> dict[int, str]:
    ops = tflite_schema().BuiltinOperator
    return {v: k for k, v in vars(ops).items() if k.isupper() and isinstance(v, int)}


def _prod(shape) -> int:
    return int(np.prod([max(1, int(d)) for d in shape])) if len(shape) else 1


def op_costs(content: bytes) -> list[OpCost]:
    """Multiply-adds, kernel class and arithmetic of every op of subgraph 0, in execution order.

    Counting (batch 1): CONV_2D ``out x KH x KW x Cin``, DEPTHWISE_CONV_2D ``out x KH x KW``,
    FULLY_CONNECTED ``out x Cin``, BATCH_MATMUL ``out x K``, TRANSPOSE_CONV ``in x KH x KW x Cout``.
    An op with integer weights counts as int8 arithmetic (XNNPACK and LiteRT's hybrid kernels
    quantize a float input on the fly); weights behind a DEQUANTIZE are float by then.
    """
    model = read_tflite_model(content)
    graph = model.subgraphs[0]
    names = _builtin_names()
    codes = [max(c.builtinCode, c.deprecatedBuiltinCode) for c in model.operatorCodes]
    out = []
    for i, op in enumerate(graph.operators):
        name = names.get(codes[op.opcodeIndex], f"OP_{codes[op.opcodeIndex]}")
        shape = [list(graph.tensors[t].shape) if t >= 0 else [] for t in op.inputs]
        types = [graph.tensors[t].type if t >= 0 else None for t in op.inputs]
        result = list(graph.tensors[op.outputs[0]].shape) if len(op.outputs) else []
        macs, kind, weights = 0, OTHER, None
        if name == "CONV_2D" and len(shape) > 1 and len(shape[1]) == 4:
            macs, kind, weights = _prod(result) * _prod(shape[1][1:]), CONV, types[1]
        elif name == "DEPTHWISE_CONV_2D" and len(shape) > 1 and len(shape[1]) == 4:
            macs, kind, weights = _prod(result) * _prod(shape[1][1:3]), DEPTHWISE, types[1]
        elif name == "FULLY_CONNECTED" and len(shape) > 1 and len(shape[1]) == 2:
            macs, kind, weights = _prod(result) * int(shape[1][1]), CONV, types[1]
        elif name == "BATCH_MATMUL" and len(shape) > 1 and len(shape[0]) >= 2:
            adj_x = bool(getattr(op.builtinOptions, "adjX", False))
            k = int(shape[0][-2] if adj_x else shape[0][-1])
            macs, kind, weights = _prod(result) * k, CONV, types[1]
        elif name == "TRANSPOSE_CONV" and len(shape) > 2 and len(shape[1]) == 4:
            macs = _prod(shape[2]) * _prod(shape[1][:3])
            kind, weights = CONV, types[1]
        activations = types[0] if types and types[0] is not None else None
        if name == "TRANSPOSE_CONV" and len(types) > 2:
            activations = types[2]
        out.append(
            OpCost(
                index=i,
                op=name,
                kind=kind,
                macs=int(macs),
                arithmetic="int8" if weights in _INT_WEIGHTS else "fp32",
                activations=_TYPES.get(activations, str(activations)),
            )
        )
    return out


def _one_op(model, index: int):
    """A shallow copy of ``model`` holding only op ``index`` of subgraph 0 (``model`` is not changed)."""
    graph = model.subgraphs[0]
    op = copy.copy(graph.operators[index])
    used = [t for t in [*op.inputs, *op.outputs, *(op.intermediates or [])] if t >= 0]
    remap = {old: new for new, old in enumerate(dict.fromkeys(used))}
    tensors = [graph.tensors[old] for old in remap]
    op.inputs = [remap[t] if t >= 0 else -1 for t in op.inputs]
    op.outputs = [remap[t] for t in op.outputs]
    if op.intermediates is not None and len(op.intermediates):
        op.intermediates = [remap[t] for t in op.intermediates]
    keep = {t.buffer for t in tensors}
    empty = tflite_schema().BufferT()
    buffers = [buf if b in keep else empty for b, buf in enumerate(model.buffers)]

    def constant(t: int) -> bool:
        buf = buffers[tensors[t].buffer]
        return buf.data is not None and len(buf.data) > 0

    one = copy.copy(graph)
    one.tensors = tensors
    one.inputs = [t for t in op.inputs if t >= 0 and not constant(t)]
    one.outputs = list(op.outputs)
    one.operators = [op]
    out = copy.copy(model)
    out.subgraphs = [one]
    out.buffers = buffers
    out.signatureDefs = None  # they name tensors of the whole graph
    return out


def single_op_model(content: bytes, index: int) -> bytes:
    """The op ``index`` of subgraph 0 alone as a .tflite: its tensors, weights and options unchanged.

    Its non-constant inputs become the model's inputs, its outputs the model's outputs. Buffers
    keep their indices; the ones the op does not read are left empty.
    """
    return write_tflite_model(_one_op(read_tflite_model(content), index))


class OpRunner:
    """A one-op model in the LiteRT interpreter (XNNPACK), its inputs filled with random values."""

    def __init__(self, content: bytes, threads: int, seed: int = 0):
        Interpreter, OpResolverType = _interpreter_class()
        with native_stderr.filtered():
            self.interpreter = Interpreter(
                model_content=content,
                num_threads=threads,
                experimental_op_resolver_type=OpResolverType.AUTO,
            )
            self.interpreter.allocate_tensors()
        rng = np.random.default_rng(seed)
        for detail in self.interpreter.get_input_details():
            dtype = np.dtype(detail["dtype"])
            shape = [max(1, int(d)) for d in detail["shape"]]
            if dtype.kind == "f":
                value = rng.random(shape).astype(dtype)  # like images scaled to [0, 1)
            elif dtype in (np.int8, np.uint8, np.int16):
                info = np.iinfo(dtype)
                value = rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)
            else:
                raise ValueError(
                    f"input of type {dtype} (only float and quantized inputs are timed alone)"
                )
            self.interpreter.set_tensor(detail["index"], value)
        self.interpreter.invoke()  # first run: XNNPACK packs the weights

    def p50_ms(self, runs: int, warmup: int) -> float:
        """The op's median latency over ``runs`` invokes after ``warmup`` untimed ones."""
        return time_calls(self.interpreter.invoke, warmup=warmup, runs=runs)["p50_ms"]


def time_alone(
    content: bytes, *, threads: int = 1, runs: int = 30, warmup: int = 5
) -> list[float | None]:
    """Every op of subgraph 0 timed alone: its p50 in ms, None where it cannot run alone."""
    model = read_tflite_model(content)
    times: list[float | None] = []
    with native_stderr.filtered():  # one filter for all the interpreters
        for index in range(len(model.subgraphs[0].operators)):
            try:
                runner = OpRunner(write_tflite_model(_one_op(model, index)), threads)
            except (ValueError, RuntimeError):  # what the interpreter raises for a model it refuses
                times.append(None)
                continue
            times.append(runner.p50_ms(runs, warmup))
    return times
