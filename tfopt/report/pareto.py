"""Pareto frontiers: the variants no other variant beats on both cost and accuracy."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from tfopt.report.collect import Variant


def frontier(points: Sequence[tuple[Hashable, float, float]]) -> list[Hashable]:
    """The keys of the non-dominated points, cheapest first.

    A point ``(key, cost, accuracy)`` is dominated when another point costs no more and is at
    least as accurate, and is strictly better on one of the two. Identical points do not
    dominate each other (both stay).

    Args:
        points: ``(key, cost, accuracy)``; lower cost and higher accuracy are better.

    Returns:
        Keys of the frontier, by increasing cost (then decreasing accuracy).
    """
    ordered = sorted(points, key=lambda p: (p[1], -p[2]))
    out: list[Hashable] = []
    best_acc = float("-inf")
    best_cost = None  # the lowest cost reaching best_acc
    for key, cost, acc in ordered:
        if acc > best_acc:
            out.append(key)
            best_acc, best_cost = acc, cost
        elif acc == best_acc and cost == best_cost:
            out.append(key)  # a duplicate of a frontier point
    return out


def variant_frontier(variants: Sequence[Variant], cost: str) -> list[str]:
    """Names of the .tflite variants on the accuracy-vs-``cost`` frontier (``gzip_bytes`` or ``p50_us``).

    Variants without the cost or the accuracy measured are left out.
    """
    points = [
        (v.name, float(getattr(v, cost)), float(v.accuracy_pct))
        for v in variants
        if v.is_tflite and getattr(v, cost) is not None and v.accuracy_pct is not None
    ]
    return [str(k) for k in frontier(points)]
