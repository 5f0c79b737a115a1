"""The export stage's named choices and their parsers (no TensorFlow import: CLIs fail fast)."""
from __future__ import annotations

from typing import Sequence

from tfopt.errors import ConfigError

MODES = ("float32", "dynamic", "float16", "int8", "int16x8")
IO_TYPES = ("float", "int8", "uint8")
SPARSITY_CHOICES = ("auto", "on", "off")
KERNELS = ("xnnpack", "builtin", "both")


def check_choice(what: str, value: str, choices: Sequence[str], flag: str) -> str:
    """Returns ``value`` or raises ConfigError naming the valid choices and the flag."""
    if value not in choices:
        raise ConfigError(f"unknown {what} {value!r}; choose one of {', '.join(choices)} ({flag})")
    return value


def parse_modes(text: str | Sequence[str]) -> list[str]:
    """Parses ``"float32,int8"`` (or a list) into known modes, keeping order, dropping repeats.

    Raises:
        ConfigError: an unknown mode, or no mode at all.
    """
    items = text.split(",") if isinstance(text, str) else list(text)
    modes: list[str] = []
    for item in (i.strip() for i in items):
        if item and item not in modes:
            modes.append(check_choice("mode", item, MODES, "--modes"))
    if not modes:
        raise ConfigError(f"no mode given; choose from {', '.join(MODES)} (--modes float32,int8)")
    return modes


def parse_threads(text: str | Sequence[int]) -> list[int]:
    """Parses ``"1,2"`` into distinct thread counts (each >= 1).

    Raises:
        ConfigError: not a comma-separated list of positive integers.
    """
    items = text.split(",") if isinstance(text, str) else list(text)
    out: list[int] = []
    for item in items:
        try:
            n = int(str(item).strip())
        except ValueError:
            raise ConfigError(f"thread count {item!r} is not an integer; give e.g. --threads 1,2") from None
        if n < 1:
            raise ConfigError(f"thread count {n} must be >= 1; give e.g. --threads 1,2")
        if n not in out:
            out.append(n)
    if not out:
        raise ConfigError("no thread count given; use e.g. --threads 1,2")
    return out
