"""What this machine's CPU is and what one core of it can compute at most.

The one home of CPU-flag parsing: the precision policy's bf16 check, the report's environment
section and the benchmarks' ``lscpu`` records all read them here. :func:`peaks` measures one
core's peak multiply-add rates (fp32 FMA, int8 dot product) and its clock with a microbenchmark
of machine code (:mod:`tfopt.core._x86_kernels`), the denominators of every roofline figure. No
TensorFlow import.

Run ``python -m tfopt.core.cpu`` to print the peaks of this machine (``--refresh`` re-measures).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import time

from tfopt.core.fileio import write_json


def parse_cpuinfo(text: str) -> dict:
    """The model and flags of the first processor in ``/proc/cpuinfo`` text (x86 and arm64 names).

    Returns:
        ``{"model": str, "flags": set[str]}``.
    """
    model, flags = "", set()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if model or flags:  # the first processor's block is enough
                break
            continue
        key = key.strip().lower()
        if key in ("model name", "hardware", "cpu model") and not model:
            model = value.strip()
        elif key in ("flags", "features"):
            flags.update(value.split())
    return {"model": model, "flags": flags}


def _read_cpuinfo(path: str = "/proc/cpuinfo") -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:  # not Linux
        return ""


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU feature flags listed in ``/proc/cpuinfo`` text.

    Args:
        cpuinfo: The text to parse; None reads ``/proc/cpuinfo`` (no flags where it cannot be read).
    """
    return parse_cpuinfo(_read_cpuinfo() if cpuinfo is None else cpuinfo)["flags"]


def lscpu_fields() -> dict[str, str]:
    """Every field ``lscpu --json`` prints (vulnerability lines dropped); empty without lscpu."""
    try:
        out = subprocess.run(
            ["lscpu", "--json"], capture_output=True, text=True, timeout=10, check=True
        ).stdout
        rows = json.loads(out).get("lscpu", [])
    except (OSError, ValueError, subprocess.SubprocessError):
        return {}
    fields = {}
    for row in rows:
        key = str(row.get("field", "")).rstrip(":").strip()
        if key and row.get("data") is not None and not key.startswith("Vulnerability"):
            fields[key] = str(row["data"])
    return fields


def cpu_info() -> dict:
    """The CPU's model, its flags (sorted) and every other ``lscpu`` field, JSON-ready.

    Returns:
        ``{"model", "flags", "fields", "source"}``: ``source`` is ``lscpu`` when it answered,
        else ``/proc/cpuinfo``.
    """
    fields = lscpu_fields()
    parsed = parse_cpuinfo(_read_cpuinfo())
    flags = fields.pop("Flags", "").split() or sorted(parsed["flags"])
    return {
        "model": fields.get("Model name") or parsed["model"] or platform.processor() or "unknown",
        "flags": sorted(flags),
        "fields": fields,
        "source": "lscpu" if fields else "/proc/cpuinfo",
    }


# How wide each ISA's multiply-add instructions are: the multiply-adds one instruction does (fp32
# FMA lanes; int8 products summed per instruction). Measured rates come from :func:`peaks`; this
# table names what is known without measuring, for the report and where no microbenchmark runs.
ISA_MACS = {
    "avx2": {"fp32": 8, "int8": 16, "int8_instruction": "vpmaddwd ymm (16-bit products)"},
    "avx512": {"fp32": 16, "int8": 32, "int8_instruction": "vpmaddwd zmm (16-bit products)"},
    "avx_vnni": {"fp32": 8, "int8": 32, "int8_instruction": "vpdpbusd ymm"},
    "avx512_vnni": {"fp32": 16, "int8": 64, "int8_instruction": "vpdpbusd zmm"},
    "amx": {"fp32": 16, "int8": 1024, "int8_instruction": "tdpbssd (16x64 int8 tile)"},
    "neon": {"fp32": 4, "int8": 8, "int8_instruction": "smlal (16-bit products)"},
    "neon_dotprod": {"fp32": 4, "int8": 16, "int8_instruction": "sdot"},
}

PEAK_SCHEMA = 1
_REPEATS = 21  # the fastest of 21 short runs: another process on the core only slows a run down
_SECONDS = 0.001  # per run


def isa(flags: set[str], machine: str | None = None) -> str:
    """The widest multiply-add ISA in ``flags`` (a key of :data:`ISA_MACS`), or ``""``."""
    machine = machine or platform.machine()
    if machine in ("aarch64", "arm64"):
        return "neon_dotprod" if "asimddp" in flags else "neon"
    for name, needs in (
        ("amx", {"amx_int8"}),
        ("avx512_vnni", {"avx512f", "avx512_vnni"}),
        ("avx512", {"avx512f", "avx512bw"}),
        ("avx_vnni", {"avx2", "avx_vnni"}),
        ("avx2", {"avx2", "fma"}),
    ):
        if needs <= flags:
            return name
    return ""


# How each ISA is named where a figure says whose it is; the ones with an integer dot product.
_ISA_WORDS = {
    "amx": "AMX",
    "avx512_vnni": "AVX-512 VNNI",
    "avx512": "AVX-512, no VNNI",
    "avx_vnni": "AVX-VNNI",
    "avx2": "AVX2, no VNNI",
    "neon_dotprod": "NEON dotprod",
    "neon": "NEON, no dotprod",
    "": "no AVX2",
}
INT8_DOT = {"amx", "avx512_vnni", "avx_vnni", "neon_dotprod"}


def host_label(flags: set[str] | None = None, machine: str | None = None) -> str:
    """Whose figures these are: the architecture and multiply-add ISA, e.g.
    ``x86-64 AVX2, no VNNI`` or ``arm64 NEON dotprod``.

    Args:
        flags: CPU flags (None reads this machine's).
        machine: ``platform.machine()`` (None: this machine's).
    """
    machine = machine or platform.machine()
    flags = cpu_flags() if flags is None else flags
    arch = {"x86_64": "x86-64", "amd64": "x86-64", "aarch64": "arm64"}.get(machine.lower(), machine)
    return f"{arch} {_ISA_WORDS[isa(flags, machine)]}"


def host_words(threads: int | None = None) -> str:
    """This machine, as a figure measured on it names it: ``AMD EPYC, x86-64 AVX2, no VNNI, 1
    thread`` (the thread count only when given)."""
    words = f"{cpu_info()['model']}, {host_label()}"
    return words + (f", {threads} thread{'s' if threads != 1 else ''}" if threads else "")


def has_int8_dot(flags: set[str] | None = None, machine: str | None = None) -> bool:
    """Whether the CPU has integer dot-product instructions (VNNI, AVX-VNNI, AMX, ARM dotprod):
    where it lacks them, int8 kernels are slower relative to float than on most phones."""
    machine = machine or platform.machine()
    return isa(cpu_flags() if flags is None else flags, machine) in INT8_DOT


def _runnable(kernel, flags: set[str]) -> bool:
    return kernel.needs <= flags


def _time_kernel(run, iterations: int) -> float:
    best = float("inf")
    for _ in range(_REPEATS):
        t0 = time.perf_counter()
        run(iterations)
        best = min(best, time.perf_counter() - t0)
    return best


def _calibrated(run, work_per_iteration: int) -> tuple[int, float]:
    """Iterations that take about ``_SECONDS``, and the fastest time of them."""
    iterations = 1000
    while True:
        took = _time_kernel(run, iterations)
        if took >= _SECONDS or iterations >= 1 << 32:
            return iterations, took
        iterations = int(iterations * min(100.0, 1.5 * _SECONDS / max(took, 1e-7)))


def measure_here() -> dict:
    """Runs the microbenchmarks in this process (x86-64 Linux only): see :func:`peaks`.

    A kernel the CPU's flags do not list is never run, so an unsupported instruction cannot fault.
    """
    import ctypes
    import mmap

    from tfopt.core import _x86_kernels as kx

    flags = cpu_flags()
    out = {"machine": platform.machine(), "isa": isa(flags)}
    if platform.machine() not in ("x86_64", "AMD64") or not sys.platform.startswith("linux"):
        return {**out, "unknown": f"no peak microbenchmark for {platform.machine()} yet"}
    prot = mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC
    runners = {}
    try:
        page = mmap.mmap(-1, 4096 * len(kx.KERNELS), prot=prot)
    except (OSError, ValueError) as e:  # W^X policies refuse executable anonymous memory
        return {**out, "unknown": f"executable memory refused: {e}"}
    base = ctypes.addressof(ctypes.c_char.from_buffer(page))
    signature = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_uint64)
    for i, (name, kernel) in enumerate(kx.KERNELS.items()):
        page[4096 * i : 4096 * i + len(kernel.code)] = kernel.code
        if _runnable(kernel, flags):
            runners[name] = signature(base + 4096 * i)
    iterations, took = _calibrated(runners["clock"], kx.CLOCK_CHAIN)
    hz = kx.CLOCK_CHAIN * iterations / took
    out["clock_ghz"] = round(hz / 1e9, 3)
    order = {
        "fp32": ("fma_zmm", "fma_ymm"),
        "int8": ("vnni_zmm", "vnni_ymm", "madd_zmm", "madd_ymm"),
    }
    for kind, names in order.items():
        name = next((n for n in names if n in runners), None)
        if name is None:
            out[kind] = None
            continue
        kernel = kx.KERNELS[name]
        iterations, took = _calibrated(runners[name], kx.ACCUMULATORS)
        per_second = kx.ACCUMULATORS * iterations / took
        out[kind] = {
            "kernel": name,
            "instruction": kernel.instruction.format(k="N").replace("{vex} ", ""),
            "macs_per_instruction": kernel.macs,
            "instructions_per_cycle": round(per_second / hz, 2),
            "gmacs": round(per_second * kernel.macs / 1e9, 1),
        }
    if "amx_int8" in flags:  # tiles can outrun VNNI: a VNNI rate would be no bound at all
        out["int8"] = None
        out["unknown"] = "int8 peak: AMX tiles (amx_int8) are not measured"
    page.close()
    return out


def _cache_path() -> str:
    info = parse_cpuinfo(_read_cpuinfo())
    key = "|".join([platform.machine(), info["model"], *sorted(info["flags"]), str(PEAK_SCHEMA)])
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return os.path.join(root, "tfopt", f"cpu-peaks-{digest}.json")


def peaks(refresh: bool = False, timeout: float = 60.0) -> dict:
    """One core's peak multiply-add rates and clock, measured once per machine and cached.

    The microbenchmark runs in a child process (a fault there cannot take the caller down) and
    takes well under a second: 12 independent FMA (``vfmadd231ps``) or dot-product
    (``vpdpbusd``, else ``vpmaddwd``) instructions per loop on zeroed registers, the widest the
    CPU's flags list, and a chain of dependent adds for the clock. Each figure is the fastest of
    five runs. The cache (``~/.cache/tfopt/cpu-peaks-*.json``) is keyed by the CPU's model and
    flags, so a machine whose CPU changed measures again.

    Args:
        refresh: Measure again even when a cached figure exists.
        timeout: Seconds the child may take.

    Returns:
        ``{"clock_ghz", "isa", "fp32", "int8", ...}``: ``fp32`` and ``int8`` are
        ``{"gmacs", "instructions_per_cycle", "macs_per_instruction", "instruction", "kernel"}``
        or None where the rate is unknown (``unknown`` then says why). ``source`` is
        ``measured`` or ``cache``.
    """
    path = _cache_path()
    if not refresh:
        try:
            with open(path, encoding="utf-8") as f:
                cached = json.load(f)
            if cached.get("schema") == PEAK_SCHEMA:
                return {**cached, "source": "cache"}
        except (OSError, ValueError):
            pass
    try:
        child = subprocess.run(
            [sys.executable, "-m", "tfopt.core.cpu", "--here"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        result = json.loads(child.stdout) if child.returncode == 0 else None
        reason = f"the microbenchmark exited {child.returncode}: {child.stderr.strip()[-200:]}"
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        result, reason = None, f"the microbenchmark did not run: {e}"
    if result is None:  # never invent a peak: the bound is reported as unknown
        return {
            "schema": PEAK_SCHEMA,
            "fp32": None,
            "int8": None,
            "unknown": reason,
            "source": "failed",
        }
    result.update(schema=PEAK_SCHEMA, measured=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    try:
        write_json(path, result)
    except OSError:  # a read-only home still gets the figure, just not cached
        pass
    return {**result, "source": "measured"}


def peak_summary(peaks: dict) -> str:
    """One line naming the peaks the bounds use, e.g. ``fp32 89 GMAC/s (vfmadd231ps zmm), ...``."""
    parts = []
    for kind in ("fp32", "int8"):
        p = peaks.get(kind)
        parts.append(
            f"{kind} {p['gmacs']:.0f} GMAC/s ({p['instruction'].split(',')[0].replace('N', '')}, "
            f"{p['instructions_per_cycle']:.2f}/cycle)"
            if p
            else f"{kind} unknown"
        )
    clock = f" at {peaks['clock_ghz']:.2f} GHz" if peaks.get("clock_ghz") else ""
    why = f" ({peaks['unknown']})" if peaks.get("unknown") else ""
    return f"one core's peaks{clock}: {', '.join(parts)}{why}"


def main(argv: list[str] | None = None) -> int:
    """``python -m tfopt.core.cpu [--refresh]``: prints this machine's peaks as JSON."""
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--here"]:
        print(json.dumps(measure_here()))
        return 0
    if set(argv) - {"--refresh"}:
        code = 0 if set(argv) & {"-h", "--help"} else 2
        print(
            "usage: python -m tfopt.core.cpu [--refresh]\n\nMeasures one core's fp32 FMA and int8 "
            "dot-product peaks and its clock (cached per CPU model; --refresh measures again) "
            "and prints them as JSON.",
            file=sys.stdout if code == 0 else sys.stderr,
        )
        return code
    print(json.dumps(peaks(refresh="--refresh" in argv), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
