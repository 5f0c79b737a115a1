"""The teacher as a float Keras model against the chosen edge model, each figure against its target.

(Benchmark B8 in docs/benchmarks.md reads these figures; the report speaks of them in plain words.)

- size: the teacher's float32 weight bytes / the chosen .tflite's bytes, target >= 20x smaller;
- latency: the teacher's Keras p50 at 1 thread / the chosen .tflite's p50 at 1 thread (XNNPACK),
  target >= 10x faster;
- accuracy: the teacher's accuracy minus the chosen model's, on the same test examples, target
  <= 0.5 points lost.
"""

from __future__ import annotations

from tfopt.report.collect import Variant

SIZE_TARGET = 20.0
SPEED_TARGET = 10.0
ACC_LOSS_TARGET_PT = 0.5


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else float(a) / float(b)


def _row(
    name: str, value: float | None, target: str, ok: bool | None, detail: str, unit: str
) -> dict:
    return {
        "name": name,
        "value": value,
        "unit": unit,
        "target": target,
        "status": "n/a" if ok is None else ("PASS" if ok else "MISS"),
        "detail": detail,
    }


def b8(teacher: Variant | None, chosen: Variant | None) -> dict:
    """The three figures with PASS / MISS (``n/a`` when a figure is missing or nothing was chosen).

    Returns:
        ``{"teacher", "chosen", "rows": [{"name", "value", "unit", "target", "status", "detail"}],
        "passed", "trouble"}``; ``passed`` is True when all three pass, False when one misses or
        :func:`trouble` found a reason not to judge them (then every status is ``not judged``),
        None when one is n/a.
    """
    t, c = teacher, chosen
    size = _ratio(t and t.size_bytes, c and c.size_bytes)
    speed = _ratio(t and t.p50_us, c and c.p50_us)
    loss = (
        None
        if not t or not c or t.accuracy_pct is None or c.accuracy_pct is None
        else (t.accuracy_pct - c.accuracy_pct)
    )

    def kib(v):
        return "?" if v is None else f"{v / 1024:.1f} KiB"

    def us(v):
        return "?" if v is None else f"{v:.1f} us"

    def pct(v):
        return "?" if v is None else f"{v:.2f}%"

    rows = [
        _row(
            "size: teacher float32 weights / chosen .tflite",
            size,
            f">= {SIZE_TARGET:g}x",
            None if size is None else size >= SIZE_TARGET,
            f"{kib(t and t.size_bytes)} / {kib(c and c.size_bytes)}",
            "x",
        ),
        _row(
            "latency: teacher Keras p50 / chosen p50 (1 thread)",
            speed,
            f">= {SPEED_TARGET:g}x",
            None if speed is None else speed >= SPEED_TARGET,
            f"{us(t and t.p50_us)} / {us(c and c.p50_us)}",
            "x",
        ),
        _row(
            "accuracy lost (teacher - chosen)",
            loss,
            f"<= {ACC_LOSS_TARGET_PT:g} pt",
            None if loss is None else loss <= ACC_LOSS_TARGET_PT,
            f"{pct(t and t.accuracy_pct)} - {pct(c and c.accuracy_pct)}",
            "pt",
        ),
    ]
    statuses = [r["status"] for r in rows]
    passed = None if "n/a" in statuses else all(s == "PASS" for s in statuses)
    problems = trouble(t, c)
    if problems:  # a ratio of a model at chance says nothing: no figure is judged
        for r in rows:
            r["status"] = "not judged"
        passed = False
    return {
        "teacher": t.name if t else None,
        "chosen": c.name if c else None,
        "rows": rows,
        "passed": passed,
        "trouble": problems,
    }


def trouble(teacher: Variant | None, chosen: Variant | None) -> list[str]:
    """Why the teacher-vs-chosen figures must not be read as a success: a model at chance (its
    records warned so) or a chosen file that failed its fidelity gate."""
    out = []
    for role, v in (("the teacher", teacher), ("the chosen model", chosen)):
        if v is not None and any("is at chance" in n for n in v.notes):
            acc = "?" if v.accuracy_pct is None else f"{v.accuracy_pct:.1f}%"
            out.append(f"{role} `{v.name}` is at chance ({acc} test accuracy)")
    if chosen is not None and chosen.gate and not chosen.gate.get("passed", True):
        why = "; ".join(chosen.gate.get("reasons") or []) or "no reason recorded"
        out.append(f"the chosen model `{chosen.name}` failed its fidelity gate ({why})")
    return out
