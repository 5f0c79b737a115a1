"""The report's figures (matplotlib, Agg backend): training curves and the two Pareto plots.

Every function returns PNG bytes; the caller writes them (atomically) and inlines them in HTML.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

from tfopt.report.collect import Variant

_DPI = 110
_PALETTE = (
    "tab:blue",
    "tab:orange",
    "tab:green",
    "tab:purple",
    "tab:brown",
    "tab:pink",
    "tab:olive",
    "tab:cyan",
)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig, plt) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _colors(names: Sequence[str]) -> dict[str, str]:
    return {n: _PALETTE[i % len(_PALETTE)] for i, n in enumerate(dict.fromkeys(names))}


def training_curves(curves: Sequence[dict]) -> bytes | None:
    """Loss and accuracy per epoch of every training stage (solid: training, dashed: validation).

    Args:
        curves: :func:`tfopt.report.collect.training_curves`.

    Returns:
        PNG bytes, or None when no stage has a history.
    """
    curves = [c for c in curves if c["epoch"]]
    if not curves:
        return None
    plt = _pyplot()
    colors = _colors([c["stage"] for c in curves])
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 3.8))
    for c in curves:
        color = colors[c["stage"]]
        for ax, key, scale in ((ax_loss, "loss", 1.0), (ax_acc, "accuracy", 100.0)):
            for prefix, style in (("", "-"), ("val_", "--")):
                pts = [(x, scale * y) for x, y in zip(c["epoch"], c[prefix + key]) if y is not None]
                if not pts:
                    continue
                label = f"{c['stage']} {'validation' if prefix else 'training'}"
                if key == "loss" and not prefix and c.get("loss_name") == "student_loss":
                    label += " (student CE)"
                ax.plot(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    style,
                    marker="o",
                    ms=4,
                    color=color,
                    label=label,
                )
        for x, phase, acc in zip(c["epoch"], c["phase"], c["accuracy"]):
            if phase and acc is not None:  # optimize: name the phase each point ends
                ax_acc.annotate(
                    phase,
                    (x, 100.0 * acc),
                    fontsize=7,
                    xytext=(4, -10),
                    textcoords="offset points",
                    color=color,
                )
    ax_loss.set_title("loss (cross-entropy)")
    ax_acc.set_title("accuracy (%)")
    for ax in (ax_loss, ax_acc):
        ax.set_xlabel("epoch (optimize: end of each phase)")
        ax.grid(alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
    ax_acc.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return _png(fig, plt)


def _log_ticks(ax) -> None:
    """Plain numbers at 1-2-5 steps on a log x axis (no 10^k notation, no crowded minor labels)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:,.0f}" if x >= 1 else f"{x:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


# Candidate label positions around a point (offsets in points), tried in order.
_OFFSETS = (
    (6, 5),
    (6, -12),
    (-6, 5),
    (-6, -12),
    (6, 15),
    (6, -22),
    (-6, 15),
    (-6, -22),
    (6, 25),
    (-6, 25),
    (6, -32),
    (-6, -32),
)


def _place_labels(ax, points: Sequence[tuple[float, float, str]], fontsize: float = 7.5) -> None:
    """Labels each point at the first candidate offset whose box overlaps no label or point placed so far.

    Boxes are estimated in display pixels from the font size (about 0.6 em per character), good
    enough to keep the labels of neighbouring variants apart.
    """
    ax.figure.canvas.draw()  # fixes the data -> pixel transform
    px = ax.figure.dpi / 72.0
    char_w, height = 0.65 * fontsize * px, 1.1 * fontsize * px
    taken: list[tuple[float, float, float, float]] = []
    for x, y in ((p[0], p[1]) for p in points):
        cx, cy = ax.transData.transform((x, y))
        taken.append((cx - 4 * px, cy - 4 * px, cx + 4 * px, cy + 4 * px))
    for x, y, text in points:
        cx, cy = ax.transData.transform((x, y))
        width = char_w * len(text)
        chosen = _OFFSETS[0]
        for dx, dy in _OFFSETS:
            left = cx + dx * px if dx >= 0 else cx + dx * px - width
            box = (left, cy + dy * px, left + width, cy + dy * px + height)
            if not any(
                box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3] for b in taken
            ):
                chosen = (dx, dy)
                taken.append(box)
                break
        # A label moved away from its point gets a thin leader line back to it.
        leader = (
            None
            if chosen == _OFFSETS[0]
            else {"arrowstyle": "-", "lw": 0.5, "color": "#999", "shrinkA": 0, "shrinkB": 3}
        )
        ax.annotate(
            text,
            (x, y),
            fontsize=fontsize,
            color="#333",
            xytext=chosen,
            textcoords="offset points",
            ha="left" if chosen[0] >= 0 else "right",
            arrowprops=leader,
        )


def _panel(
    ax,
    variants: Sequence[Variant],
    cost: str,
    scale: float,
    front: Sequence[str],
    chosen: str | None,
    colors: dict[str, str],
    xlabel: str,
    references: bool,
) -> list[tuple[float, float, str]]:
    """Draws one panel; returns the labels to place once the figure's layout is final."""
    pts = [
        v
        for v in variants
        if getattr(v, cost) is not None
        and v.accuracy_pct is not None
        and (v.is_tflite or references)
    ]
    if not pts:
        ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel(xlabel)
        return []
    for v in pts:
        x, y = getattr(v, cost) * scale, v.accuracy_pct
        if v.is_tflite:
            ax.scatter(
                [x], [y], s=46, color=colors[v.model], edgecolor="black", linewidth=0.5, zorder=3
            )
        else:
            ax.scatter(
                [x], [y], s=46, facecolor="none", edgecolor=colors[v.model], linewidth=1.5, zorder=3
            )
    ax.set_xscale("log")
    ax.margins(x=0.15, y=0.1)  # room for the labels of the outermost points
    _log_ticks(ax)
    by_name = {v.name: v for v in pts}
    fpts = [by_name[n] for n in front if n in by_name]
    if fpts:
        xs = [getattr(v, cost) * scale for v in fpts]
        ys = [v.accuracy_pct for v in fpts]
        ax.step(
            xs,
            ys,
            where="post",
            color="black",
            lw=1,
            ls="--",
            alpha=0.7,
            zorder=2,
            label="Pareto frontier",
        )
        ax.scatter(xs, ys, s=120, facecolor="none", edgecolor="black", linewidth=0.8, zorder=2)
    if chosen in by_name:
        v = by_name[chosen]
        ax.scatter(
            [getattr(v, cost) * scale],
            [v.accuracy_pct],
            s=260,
            marker="*",
            color="red",
            edgecolor="black",
            linewidth=0.6,
            zorder=4,
            label=f"chosen: {chosen}",
        )
    ax.set_xlabel(xlabel)
    ax.set_ylabel("test accuracy (%)")
    ax.grid(alpha=0.3, which="both")
    return [
        (getattr(v, cost) * scale, v.accuracy_pct, v.format if v.is_tflite else "Keras")
        for v in sorted(pts, key=lambda v: (-v.accuracy_pct, getattr(v, cost)))
    ]


def pareto(
    variants: Sequence[Variant],
    front_size: Sequence[str],
    front_latency: Sequence[str],
    chosen: str | None,
) -> bytes | None:
    """Accuracy vs gzip size and accuracy vs p50 latency (1 thread), frontier dashed, chosen starred.

    Colours are the models; filled dots are .tflite variants (labelled with their mode), hollow
    ones the Keras models (latency panel only: they have no .tflite size).

    Returns:
        PNG bytes, or None when there is no variant with an accuracy.
    """
    if not any(v.accuracy_pct is not None for v in variants):
        return None
    plt = _pyplot()
    from matplotlib.lines import Line2D

    colors = _colors([v.model for v in variants])
    fig, (ax_s, ax_l) = plt.subplots(1, 2, figsize=(12, 4.6))
    labels_s = _panel(
        ax_s,
        variants,
        "gzip_bytes",
        1 / 1024,
        front_size,
        chosen,
        colors,
        "gzip -9 size (KiB, log)",
        False,
    )
    ax_s.set_title("accuracy vs download size")
    labels_l = _panel(
        ax_l,
        variants,
        "p50_us",
        1.0,
        front_latency,
        chosen,
        colors,
        "p50 latency, 1 thread (us, log)",
        True,
    )
    ax_l.set_title("accuracy vs latency (XNNPACK; hollow: Keras)")
    handles = [
        Line2D([], [], marker="o", ls="", color=c, markeredgecolor="black", label=m)
        for m, c in colors.items()
    ]
    handles.append(Line2D([], [], ls="--", color="black", label="Pareto frontier"))
    if chosen:
        handles.append(
            Line2D([], [], marker="*", ls="", color="red", markersize=12, label=f"chosen: {chosen}")
        )
    fig.legend(
        handles=handles,
        loc="lower center",
        ncol=len(handles),
        fontsize=8,
        frameon=False,
        bbox_to_anchor=(0.5, -0.04),
    )
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    _place_labels(ax_s, labels_s)
    _place_labels(ax_l, labels_l)
    return _png(fig, plt)
