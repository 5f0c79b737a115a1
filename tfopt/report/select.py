"""Choosing the edge model: a rule of constraints, and why every other variant lost.

A rule is comma-separated constraints ``KEY OP NUMBER``, e.g. ``acc_drop<=0.5,p50_us<=50``, and
optionally one objective ``min:KEY`` or ``max:KEY`` (default ``min:gzip_kb``). Among the .tflite
variants that satisfy every constraint, the one with the best objective wins (by default the
smallest gzip size: what a device downloads); ties go to the lower p50 latency at 1 thread, then
to the name. A latency objective counts values within ``LATENCY_TIE`` (5%) of the best as ties,
since two timings of one model on a shared machine differ by that much: among them the smallest
gzip size wins. Every other variant gets the reason it lost: the first constraint it fails with its
value, or that it passes but has a worse objective. Keras variants are references, never chosen.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from tfopt.core.errors import ConfigError
from tfopt.report.collect import Variant

# key -> (what it is, unit, how to read it from a variant)
KEYS: dict[str, tuple[str, str, Callable[[Variant], float | None]]] = {
    "acc": ("test accuracy", "%", lambda v: v.accuracy_pct),
    "acc_drop": (
        "accuracy lost against the teacher's Keras model",
        "pt",
        lambda v: None if v.delta_pt is None else -v.delta_pt,
    ),
    "agreement": ("top-1 agreement with its own Keras model", "%", lambda v: v.agreement_pct),
    "size_kb": (
        ".tflite size",
        "KiB",
        lambda v: None if v.size_bytes is None else v.size_bytes / 1024,
    ),
    "gzip_kb": (
        "gzip -9 size",
        "KiB",
        lambda v: None if v.gzip_bytes is None else v.gzip_bytes / 1024,
    ),
    "p50_us": ("p50 latency at 1 thread", "us", lambda v: v.p50_us),
    "p95_us": ("p95 latency at 1 thread", "us", lambda v: v.p95_us),
    "p50_us_2t": ("p50 latency at 2 threads", "us", lambda v: v.p50_us_2t),
    "params": ("parameters", "", lambda v: None if v.params is None else float(v.params)),
}
OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "<": operator.lt,
    ">": operator.gt,
}
EXAMPLE = "acc_drop<=0.5,p50_us<=50,min:gzip_kb"
LATENCY_KEYS = ("p50_us", "p95_us", "p50_us_2t")
LATENCY_TIE = (
    0.05  # relative: latencies this close to the best are ties (timing noise), broken by gzip size
)
DEFAULT_OBJECTIVE = ("min", "gzip_kb")
_TOKEN = re.compile(
    r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=|<|>)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$"
)


@dataclass(frozen=True)
class Constraint:
    """``key op value``, e.g. ``acc_drop <= 0.5``."""

    key: str
    op: str
    value: float

    def __str__(self) -> str:
        return f"{self.key}{self.op}{self.value:g}"

    def measure(self, variant: Variant) -> float | None:
        """The variant's value of ``key`` (None when not measured)."""
        return KEYS[self.key][2](variant)

    def holds(self, variant: Variant) -> bool:
        """True when the variant's value is measured and satisfies the constraint."""
        value = self.measure(variant)
        return value is not None and OPS[self.op](value, self.value)


def _help() -> str:
    keys = ", ".join(f"{k} ({unit})" if unit else k for k, (_, unit, _) in KEYS.items())
    return (
        f"valid keys: {keys}; operators: {', '.join(OPS)}; objective: min:KEY or max:KEY; "
        f"example: --select '{EXAMPLE}'"
    )


def parse_objective(rule: str | None) -> tuple[str, str]:
    """The rule's objective ``(min|max, KEY)`` (default ``("min", "gzip_kb")``).

    Raises:
        ConfigError: a bad or repeated objective.
    """
    found = []
    for token in (rule or "").split(","):
        direction, colon, key = token.strip().partition(":")
        if not colon:
            continue
        if direction not in ("min", "max") or key.strip() not in KEYS:
            raise ConfigError(
                f"selection rule objective {token.strip()!r} is not min:KEY or max:KEY; " + _help()
            )
        found.append((direction, key.strip()))
    if len(found) > 1:
        raise ConfigError(
            f"selection rule {rule!r} has {len(found)} objectives; give at most one; " + _help()
        )
    return found[0] if found else DEFAULT_OBJECTIVE


def parse_rule(rule: str | None) -> list[Constraint]:
    """Parses ``acc_drop<=0.5,p50_us<=50`` into constraints (empty/None: no constraint).

    An objective token (``min:KEY``/``max:KEY``) is checked here and returned by
    :func:`parse_objective`.

    Raises:
        ConfigError: one line naming the bad token, the valid keys and operators, and an example.
    """
    if rule is None or not rule.strip():
        return []
    parse_objective(rule)
    out: list[Constraint] = []
    for token in rule.split(","):
        if not token.strip():
            raise ConfigError(
                f"selection rule {rule!r} has an empty constraint (two commas or a trailing comma); "
                + _help()
            )
        if ":" in token:
            continue
        m = _TOKEN.match(token)
        if not m:
            raise ConfigError(
                f"selection rule constraint {token.strip()!r} is not KEY OP NUMBER; " + _help()
            )
        key, op, number = m.groups()
        if key not in KEYS:
            raise ConfigError(
                f"selection rule constraint {token.strip()!r}: unknown key {key!r}; " + _help()
            )
        value = float(number)
        if not math.isfinite(value):
            raise ConfigError(
                f"selection rule constraint {token.strip()!r}: the number is not finite; " + _help()
            )
        out.append(Constraint(key, op, value))
    return out


def _fmt(value: float | None, key: str) -> str:
    if value is None:
        return "not measured"
    unit = KEYS[key][1]
    text = f"{value:.0f}" if key == "params" else f"{value:.2f}"
    return f"{text} {unit}".strip()


@dataclass
class Selection:
    """The chosen variant and every other variant's reason.

    Attributes:
        rule: The rule as given.
        constraints: Its parsed constraints, as text.
        objective: ``min:KEY`` or ``max:KEY``: what decides among the passing variants.
        chosen: The chosen variant's name, or None when none passes.
        statement: One sentence saying what was chosen and why (or that nothing passes).
        passing: Names of the .tflite variants satisfying every constraint, best first.
        rejected: Variant name -> why it was not chosen.
    """

    rule: str
    constraints: list[str]
    objective: str
    chosen: str | None
    statement: str
    passing: list[str]
    rejected: dict[str, str]

    def to_dict(self) -> dict:
        """JSON-friendly dict."""
        return asdict(self)


def _order(objective: tuple[str, str]) -> Callable[[Variant], tuple]:
    direction, key = objective
    sign = 1.0 if direction == "min" else -1.0
    inf = float("inf")

    def order(v: Variant) -> tuple:
        value = KEYS[key][2](v)
        return (
            sign * value if value is not None else inf,
            v.p50_us if v.p50_us is not None else inf,
            v.name,
        )

    return order


def choose(variants: Sequence[Variant], rule: str | None) -> Selection:
    """Chooses among the .tflite variants satisfying every constraint the one with the best objective.

    Args:
        variants: Every variant of the run (Keras ones are listed as references, never chosen).
        rule: The rule text (see :func:`parse_rule`); None or empty: every .tflite variant passes.

    Returns:
        The selection; ``chosen`` is None (and ``statement`` says so) when no variant passes.

    Raises:
        ConfigError: a bad rule.
    """
    constraints = parse_rule(rule)
    objective = parse_objective(rule)
    direction, key = objective
    best_word = {"min": "lowest", "max": "highest"}[direction]
    passing, rejected = _screen(variants, constraints)
    passing.sort(key=_order(objective))
    tied = _latency_ties(passing, objective)
    if len(tied) > 1:  # the smallest of the tied first, then the rest in objective order
        tied.sort(key=_order(DEFAULT_OBJECTIVE))
        passing = tied[:1] + [v for v in passing if v is not tied[0]]
    text = rule.strip() if rule and rule.strip() else ""
    where = f"the rule {text!r}" if text else "no rule (every .tflite variant passes)"
    if not passing:
        count = sum(1 for v in variants if v.is_tflite)
        statement = (
            f"No .tflite variant satisfies {where}: all {count} fail a constraint (reasons below); "
            "nothing is chosen. Relax the rule (--select) or improve the models."
        )
        return Selection(
            text, [str(c) for c in constraints], f"{direction}:{key}", None, statement, [], rejected
        )
    best = passing[0]
    measure = KEYS[key][2]
    what = KEYS[key][0]
    rejected.update(_runners_up(passing, tied, key, direction))
    if len(tied) > 1:
        leader = min(tied, key=_order(objective))
        statement = (
            f"{best.name} is chosen: its {what} ({_fmt(measure(best), key)}) ties with the {best_word} "
            f"({_fmt(measure(leader), key)}, {leader.name}; within {LATENCY_TIE:.0%}, timing noise) and it "
            f"is the smallest of the {len(tied)} tied by gzip -9 size ({_kib(best.gzip_bytes)}), among "
            f"the {len(passing)} .tflite variant(s) satisfying {where}."
        )
    else:
        statement = (
            f"{best.name} is chosen: the {best_word} {what} ({_fmt(measure(best), key)}) of the "
            f"{len(passing)} .tflite variant(s) satisfying {where}."
        )
    return Selection(
        text,
        [str(c) for c in constraints],
        f"{direction}:{key}",
        best.name,
        statement,
        [v.name for v in passing],
        {v.name: rejected[v.name] for v in variants if v.name in rejected},
    )


def _screen(variants: Sequence[Variant], constraints) -> tuple[list[Variant], dict[str, str]]:
    """The .tflite variants meeting every constraint, and why each other variant does not."""
    rejected: dict[str, str] = {}
    passing: list[Variant] = []
    for v in variants:
        if not v.is_tflite:
            rejected[v.name] = (
                "a Keras model: the reference, not an edge model (only .tflite variants are chosen)"
            )
            continue
        failed = next((c for c in constraints if not c.holds(v)), None)
        if failed is None:
            passing.append(v)
        else:
            value = failed.measure(v)
            rejected[v.name] = (
                f"fails {failed}: {failed.key} is {_fmt(value, failed.key)}"
                if value is not None
                else f"fails {failed}: {failed.key} not measured"
            )
    return passing, rejected


def _runners_up(
    passing: list[Variant], tied: list[Variant], key: str, direction: str
) -> dict[str, str]:
    """Why each passing variant after the first (the chosen one) was not chosen."""
    best, measure, what = passing[0], KEYS[key][2], KEYS[key][0]
    why: dict[str, str] = {}
    for v in passing[1:]:
        same = measure(v) == measure(best)
        if v in tied:
            why[v.name] = (
                f"passes and its {what} ({_fmt(measure(v), key)}) ties with the chosen one's "
                f"({_fmt(measure(best), key)}: within {LATENCY_TIE:.0%}), but its gzip -9 size is "
                f"larger ({_kib(v.gzip_bytes)} vs {_kib(best.gzip_bytes)})"
            )
        else:
            why[v.name] = (
                f"passes but has the same {what} and a higher p50 latency than the chosen one"
                if same
                else f"passes but its {what} is {'higher' if direction == 'min' else 'lower'} than "
                f"the chosen one's ({_fmt(measure(v), key)} vs {_fmt(measure(best), key)})"
            )
    return why


def tie_rule(objective: str) -> str:
    """How ties of ``objective`` (``min:KEY``/``max:KEY``) are broken, in words."""
    if objective.partition(":")[2] in LATENCY_KEYS:
        return f"latencies within {LATENCY_TIE:.0%} of the best tie, and the smallest gzip -9 size of them wins"
    return "ties: the lower p50 latency at 1 thread"


def _latency_ties(ranked: list[Variant], objective: tuple[str, str]) -> list[Variant]:
    """The variants of ``ranked`` (best first) whose latency objective is within ``LATENCY_TIE`` of the best."""
    direction, key = objective
    measure = KEYS[key][2]
    best = measure(ranked[0]) if ranked else None
    if key not in LATENCY_KEYS or best is None:
        return ranked[:1]
    bound = best * (1 + LATENCY_TIE) if direction == "min" else best / (1 + LATENCY_TIE)
    return [
        v
        for v in ranked
        if measure(v) is not None
        and (measure(v) <= bound if direction == "min" else measure(v) >= bound)
    ]


def _kib(n: int | None) -> str:
    return "not measured" if n is None else f"{n / 1024:.1f} KiB"
