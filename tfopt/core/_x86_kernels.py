"""Machine code of the peak-rate microbenchmarks :func:`tfopt.core.cpu.peaks` runs (x86-64, System V).

Each kernel is ``uint64_t kernel(uint64_t iterations)``: it zeroes the registers it uses (zeros
keep floating-point math off the slow denormal path), then runs ``iterations`` times a loop of
12 independent instructions (12 accumulators hide a 4-6 cycle latency behind 2 issues per cycle),
``dec rdi; jnz``. ``clock`` is one chain of 48 dependent ``add rax, rdx`` per iteration: one
cycle each, so it times the core's clock. The bytes are what GNU ``as`` makes of :func:`listing`
(tests/test_cpu_peaks.py reassembles them where ``as`` is installed).
"""

from __future__ import annotations

from dataclasses import dataclass

ACCUMULATORS = 12
CLOCK_CHAIN = 48


@dataclass(frozen=True)
class Kernel:
    """One microbenchmark: its instruction, the CPU flags it needs and the work one instruction does."""

    name: str
    instruction: str  # Intel syntax, {k} for the accumulator
    wide: bool  # zmm (AVX-512) registers, else ymm
    needs: frozenset[str]  # /proc/cpuinfo flags
    macs: int  # multiply-adds one instruction does
    code: bytes


def listing(kernel: Kernel) -> list[str]:
    """The kernel's assembly source (Intel syntax), the text its bytes were assembled from."""
    if kernel.name == "clock":
        body = ["add rax, rdx"] * CLOCK_CHAIN
        return ["xor eax, eax", "xor edx, edx", "1:", *body, "dec rdi", "jnz 1b", "ret"]
    reg = "zmm" if kernel.wide else "ymm"
    sources = (30, 31) if kernel.wide else (14, 15)
    zero = "vpxord {r}, {r}, {r}" if kernel.wide else "vpxor {r}, {r}, {r}"
    regs = [f"{reg}{i}" for i in (*range(ACCUMULATORS), *sources)]
    return [
        *(zero.format(r=r) for r in regs),
        "1:",
        *(kernel.instruction.format(k=k) for k in range(ACCUMULATORS)),
        "dec rdi",
        "jnz 1b",
        "vzeroupper",
        "ret",
    ]


KERNELS = {
    "fma_zmm": Kernel(
        "fma_zmm",
        "vfmadd231ps zmm{k}, zmm30, zmm31",
        True,
        frozenset({"avx512f"}),
        16,
        bytes.fromhex(
            "62f17d48efc062f17548efc962f16d48efd262f16548efdb62f15d48efe462f15548efed62f14d48"
            "eff662f14548efff62513d48efc062513548efc962512d48efd262512548efdb62010d40eff66201"
            "0540efff62920d40b8c762920d40b8cf62920d40b8d762920d40b8df62920d40b8e762920d40b8ef"
            "62920d40b8f762920d40b8ff62120d40b8c762120d40b8cf62120d40b8d762120d40b8df48ffcf75"
            "b3c5f877c3"
        ),
    ),
    "fma_ymm": Kernel(
        "fma_ymm",
        "vfmadd231ps ymm{k}, ymm14, ymm15",
        False,
        frozenset({"avx", "fma"}),
        8,
        bytes.fromhex(
            "c5fdefc0c5f5efc9c5edefd2c5e5efdbc5ddefe4c5d5efedc5cdeff6c5c5efffc4413defc0c44135"
            "efc9c4412defd2c44125efdbc4410deff6c44105efffc4c20db8c7c4c20db8cfc4c20db8d7c4c20d"
            "b8dfc4c20db8e7c4c20db8efc4c20db8f7c4c20db8ffc4420db8c7c4420db8cfc4420db8d7c4420d"
            "b8df48ffcf75bfc5f877c3"
        ),
    ),
    "vnni_zmm": Kernel(
        "vnni_zmm",
        "vpdpbusd zmm{k}, zmm30, zmm31",
        True,
        frozenset({"avx512_vnni", "avx512f"}),
        64,
        bytes.fromhex(
            "62f17d48efc062f17548efc962f16d48efd262f16548efdb62f15d48efe462f15548efed62f14d48"
            "eff662f14548efff62513d48efc062513548efc962512d48efd262512548efdb62010d40eff66201"
            "0540efff62920d4050c762920d4050cf62920d4050d762920d4050df62920d4050e762920d4050ef"
            "62920d4050f762920d4050ff62120d4050c762120d4050cf62120d4050d762120d4050df48ffcf75"
            "b3c5f877c3"
        ),
    ),
    "vnni_ymm": Kernel(
        "vnni_ymm",
        "{{vex}} vpdpbusd ymm{k}, ymm14, ymm15",
        False,
        frozenset({"avx", "avx_vnni"}),
        32,
        bytes.fromhex(
            "c5fdefc0c5f5efc9c5edefd2c5e5efdbc5ddefe4c5d5efedc5cdeff6c5c5efffc4413defc0c44135"
            "efc9c4412defd2c44125efdbc4410deff6c44105efffc4c20d50c7c4c20d50cfc4c20d50d7c4c20d"
            "50dfc4c20d50e7c4c20d50efc4c20d50f7c4c20d50ffc4420d50c7c4420d50cfc4420d50d7c4420d"
            "50df48ffcf75bfc5f877c3"
        ),
    ),
    "madd_zmm": Kernel(
        "madd_zmm",
        "vpmaddwd zmm{k}, zmm30, zmm31",
        True,
        frozenset({"avx512bw", "avx512f"}),
        32,
        bytes.fromhex(
            "62f17d48efc062f17548efc962f16d48efd262f16548efdb62f15d48efe462f15548efed62f14d48"
            "eff662f14548efff62513d48efc062513548efc962512d48efd262512548efdb62010d40eff66201"
            "0540efff62910d40f5c762910d40f5cf62910d40f5d762910d40f5df62910d40f5e762910d40f5ef"
            "62910d40f5f762910d40f5ff62110d40f5c762110d40f5cf62110d40f5d762110d40f5df48ffcf75"
            "b3c5f877c3"
        ),
    ),
    "madd_ymm": Kernel(
        "madd_ymm",
        "vpmaddwd ymm{k}, ymm14, ymm15",
        False,
        frozenset({"avx2", "avx"}),
        16,
        bytes.fromhex(
            "c5fdefc0c5f5efc9c5edefd2c5e5efdbc5ddefe4c5d5efedc5cdeff6c5c5efffc4413defc0c44135"
            "efc9c4412defd2c44125efdbc4410deff6c44105efffc4c10df5c7c4c10df5cfc4c10df5d7c4c10d"
            "f5dfc4c10df5e7c4c10df5efc4c10df5f7c4c10df5ffc4410df5c7c4410df5cfc4410df5d7c4410d"
            "f5df48ffcf75bfc5f877c3"
        ),
    ),
    "clock": Kernel(
        "clock",
        "add rax, rdx",
        False,
        frozenset(),
        0,
        bytes.fromhex(
            "31c031d24801d04801d04801d04801d04801d04801d04801d04801d04801d04801d04801d04801d0"
            "4801d04801d04801d04801d04801d04801d04801d04801d04801d04801d04801d04801d04801d048"
            "01d04801d04801d04801d04801d04801d04801d04801d04801d04801d04801d04801d04801d04801"
            "d04801d04801d04801d04801d04801d04801d04801d04801d04801d048ffcf0f8567ffffffc3"
        ),
    ),
}
