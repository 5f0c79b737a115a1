"""Where the figures were measured (library versions, CPU) and what the chosen .tflite runs (its ops).

The versions come from the stages' records (what each stage ran with); the CPU is read on the
machine building the report, which is the machine that ran the pipeline when the runner builds
the report at its end. Latency on a CPU depends on its SIMD extensions (AVX2, AVX-512, AVX-VNNI,
AMX), so those flags are listed apart from the rest.
"""

from __future__ import annotations

import contextlib
import io
import os
import platform
import re
from collections import Counter

from tfopt.core import cpu
from tfopt.report.collect import PipelineRun

# The flags that decide which XNNPACK / oneDNN kernels run.
SIMD_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
    "asimd",
    "asimddp",
    "sve",
    "i8mm",
    "bf16",
)


def cpu_info() -> dict:
    """The CPU model, logical cores, every flag and the SIMD flags that matter for inference kernels."""
    full = cpu.cpu_info()
    info: dict = {"model": full["model"], "flags": full["flags"], "source": full["source"]}
    flags = set(info["flags"])
    info["simd"] = [f for f in SIMD_FLAGS if f in flags]
    info["logical_cores"] = os.cpu_count()
    try:
        info["usable_cores"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        info["usable_cores"] = info["logical_cores"]
    info["machine"] = platform.machine()
    return info


def environment(run: PipelineRun) -> dict:
    """Versions (from the records), strategy, platform and CPU.

    Returns:
        ``{"versions", "versions_differ", "strategy", "replicas", "platform", "python", "cpu"}``;
        ``versions_differ`` lists the packages whose version is not the same in every record.
    """
    versions: dict[str, set] = {}
    strategy: dict = {}
    for stage in run.stages:
        rec = stage.record
        if rec is None:
            continue
        for k, v in (rec.versions or {}).items():
            versions.setdefault(k, set()).add(str(v))
        if not strategy and rec.strategy and stage.kind == "train":
            strategy = dict(rec.strategy)
    return {
        "versions": {k: ", ".join(sorted(v)) for k, v in versions.items()},
        "versions_differ": sorted(k for k, v in versions.items() if len(v) > 1),
        "strategy": strategy or {"name": run.state.get("strategy")},
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu_info(),
    }


_OP = re.compile(r"^\s*Op#(\d+)\s+([A-Z0-9_]+)\((.*)\)\s*->\s*\[(.*)\]\s*$")
_TENSOR = re.compile(r"^\s*T#(\d+)\((.*?)\)\s+shape(?:_signature)?:(\[[^\]]*\]),\s*type:(\w+)")
_REF = re.compile(r"T#(\d+)")


def _short(name: str) -> str:
    """``model/conv0/Relu;model/conv0/BiasAdd;...`` -> ``conv0/Relu`` (the first name, model scope dropped)."""
    first = name.split(";")[0]
    parts = first.split("/")
    return "/".join(parts[1:3]) if len(parts) > 2 else first


def parse_ops(text: str) -> list[dict]:
    """The analyzer's op lines, in execution order, with each op's output tensor (name, shape, type)."""
    tensors: dict[int, tuple[str, str, str]] = {}
    for line in text.splitlines():
        m = _TENSOR.match(line)
        if m:
            tensors.setdefault(int(m.group(1)), (m.group(2), m.group(3), m.group(4)))
    ops = []
    for line in text.splitlines():
        m = _OP.match(line)
        if not m:
            continue
        outs = [int(t) for t in _REF.findall(m.group(4))]
        ins = [int(t) for t in _REF.findall(m.group(3))]
        name, shape, dtype = tensors.get(outs[0], ("", "", "")) if outs else ("", "", "")
        in_types = sorted({tensors[t][2] for t in ins if t in tensors})
        ops.append(
            {
                "index": int(m.group(1)),
                "op": m.group(2),
                "output": _short(name),
                "shape": shape,
                "type": dtype,
                "input_types": in_types,
            }
        )
    return ops


def analyze_tflite(path: str) -> dict:
    """TFLite's model analyzer on one .tflite: its full text and the ops it runs, counted.

    ``tf.lite.experimental.Analyzer.analyze`` prints its report with Python's ``print``; it is
    captured here.

    Returns:
        ``{"file", "text", "ops": [{"index", "op", "output", "shape", "type", "input_types"}],
        "op_counts": {op: n}, "subgraphs", "model_bytes"}``.
    """
    from tfopt.core._keras import tf

    with open(path, "rb") as f:
        content = f.read()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        tf.lite.experimental.Analyzer.analyze(model_content=content)
    text = buf.getvalue().strip()
    ops = parse_ops(text)
    counts = Counter(op["op"] for op in ops)
    size = re.search(r"Model size:\s*(\d+) bytes", text)
    return {
        "file": path,
        "text": text,
        "ops": ops,
        "op_counts": dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))),
        "subgraphs": len(re.findall(r"^Subgraph#\d+", text, flags=re.M)),
        "model_bytes": int(size.group(1)) if size else None,
    }
