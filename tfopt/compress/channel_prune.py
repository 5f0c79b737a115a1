"""Structured channel pruning: remove whole output channels and rebuild a smaller dense model.

    spec = ChannelSpec(flops=0.5, importance="l1", ranking="global", round_to=8)
    decided = plan(model, spec)          # which channel classes go, widths before/after, pinned layers
    smaller = prune_channels(model, decided)

A channel of a Conv2D, SeparableConv2D or Dense layer goes with the batch norm after it, the
depthwise convolutions that follow it, and the matching input rows of every consumer (through
``Flatten`` into a Dense layer too). Channels tied by a residual ``Add``, a squeeze-and-excitation
``Multiply`` or another join go as one class (:mod:`tfopt.compress.channels`); what the tracer
cannot follow is kept whole and named.

Importance: the L1 or L2 norm of a channel's kernel slice, or the batch norm's ``|gamma|`` after
it, each divided by its layer's mean so layers compare; a class scores its members' mean.
Ranking: ``uniform`` removes the same share of every group of tied channels, ``global`` the
lowest-scoring classes model-wide (each group keeps at least ``round_to`` channels, and
widths are rounded up to a multiple of ``round_to``). The target is a share of channels
(``ratio``), of the model's multiply-adds (``flops``), or a LiteRT latency (``latency_us``,
predicted from a table of timed layer widths, :mod:`tfopt.compress.latency`); the last two are
reached by a scan and bisection on the share removed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tfopt.core._keras import keras

import numpy as np

from tfopt.compress import latency as latency_lib
from tfopt.compress.channels import Channels, trace
from tfopt.compress.common import OptimizeError, Selection
from tfopt.compress.flops import model_macs
from tfopt.compress.importance import IMPORTANCE, importance
from tfopt.compress.surgery import Graph, fresh
from tfopt.config.optimize import RANKINGS as RANKING
from tfopt.core.errors import TargetOutOfReach

L = keras.layers


@dataclass(frozen=True)
class ChannelSpec:
    """How to prune channels.

    Attributes:
        flops: Target multiply-adds as a share of the model's, in (0, 1] (used when ``ratio`` is 0).
        ratio: Share of the prunable channels to remove, in [0, 1); 0 = aim at ``flops``.
        importance: ``l1``, ``l2`` (kernel norms), ``bn`` (the following batch norm's |gamma|) or
            ``taylor`` (first-order Taylor: ``(sum of weight x gradient)^2`` over the channel's
            kernel slice, averaged over ``taylor_batches`` training batches).
        ranking: ``global`` (model-wide) or ``uniform`` (the same share in every group).
        round_to: Widths rounded up to a multiple of this (1 = exact); also each group's minimum.
        iterations: Prune in this many steps to the target, fine-tuning after each.
        latency_us: Target LiteRT p50 of the float .tflite at batch 1, in microseconds (0 = aim
            at ``flops``), predicted from a table of timed layer widths (:mod:`tfopt.compress.latency`).
        latency_threads: Interpreter threads the latency is measured and aimed at with.
        selection: Layers whose output channels may be pruned; empty = all.
    """

    flops: float = 0.5
    ratio: float = 0.0
    importance: str = "l1"
    ranking: str = "global"
    round_to: int = 1
    iterations: int = 1
    taylor_batches: int = 8
    latency_us: float = 0.0
    latency_threads: int = 1
    selection: Selection = field(default_factory=Selection)

    def validate(self) -> ChannelSpec:
        """Raises OptimizeError naming the bad value and the valid range."""
        if self.importance not in IMPORTANCE or self.ranking not in RANKING:
            raise OptimizeError(
                f"importance={self.importance!r} / ranking={self.ranking!r} is not valid; choose "
                f"importance from {', '.join(IMPORTANCE)} and ranking from {', '.join(RANKING)}"
            )
        if not 0 < self.flops <= 1 or not 0 <= self.ratio < 1:
            raise OptimizeError(
                f"flops={self.flops} must be in (0, 1] and ratio={self.ratio} in [0, 1); e.g. "
                "flops=0.5 for half the multiply-adds, or ratio=0.3 to remove 30% of the channels"
            )
        if (
            self.round_to < 1
            or self.iterations < 1
            or self.taylor_batches < 1
            or self.latency_threads < 1
        ):
            raise OptimizeError(
                f"round_to={self.round_to}, iterations={self.iterations}, taylor_batches="
                f"{self.taylor_batches} and latency_threads={self.latency_threads} must be >= 1"
            )
        if not self.latency_us >= 0 or (self.latency_us and self.ratio):
            raise OptimizeError(
                f"latency_us={self.latency_us} must be > 0 (a target in microseconds) or 0 (off), "
                f"and cannot be combined with ratio={self.ratio}; give one target"
            )
        return self

    def to_dict(self) -> dict:
        """JSON-ready settings."""
        return {
            "flops": self.flops,
            "ratio": self.ratio,
            "importance": self.importance,
            "ranking": self.ranking,
            "round_to": self.round_to,
            "iterations": self.iterations,
            "taylor_batches": self.taylor_batches,
            "latency_us": self.latency_us,
            "latency_threads": self.latency_threads,
            "selection": self.selection.to_dict(),
        }


@dataclass
class Plan:
    """What :func:`plan` decided."""

    model: keras.Model
    channels: Channels
    removed: set[int]
    widths: dict[str, tuple[int, int]]
    pinned: dict[str, str]
    macs_before: int
    macs_after: int
    share: float
    latency: dict | None = None

    def to_dict(self) -> dict:
        """JSON-ready data (the run record's ``channel_prune`` phase info)."""
        return {
            "widths": {n: list(w) for n, w in self.widths.items()},
            "pinned": self.pinned,
            "macs_before": self.macs_before,
            "macs_after": self.macs_after,
            "share_removed": round(self.share, 5),
            "channels_removed": sum(b - a for b, a in self.widths.values()),
            **({"latency": self.latency} if self.latency else {}),
        }


def _groups(ch: Channels, classes: dict[int, list[tuple[str, int]]]) -> list[list[int]]:
    """Classes grouped by the producers they share (a residual stream is one group)."""
    owner: dict[str, str] = {}

    def root(name: str) -> str:
        while owner.setdefault(name, name) != name:
            name = owner[name]
        return name

    for members in classes.values():
        first = root(members[0][0])
        for producer, _ in members[1:]:
            other = root(producer)
            if other != first:
                owner[other] = first
    groups: dict[str, list[int]] = {}
    for cls, members in classes.items():
        groups.setdefault(root(members[0][0]), []).append(cls)
    return list(groups.values())


def _choose(
    groups: list[list[int]], score: dict[int, float], share: float, ranking: str, round_to: int
) -> set[int]:
    """The classes to remove at ``share``; every group keeps >= round_to and a multiple of it."""

    def keep_count(n: int, remove: int) -> int:
        kept = max(n - remove, min(n, round_to))
        return min(n, math.ceil(kept / round_to) * round_to)

    removed: set[int] = set()
    if ranking == "uniform":
        for group in groups:
            ordered = sorted(group, key=lambda c: (score[c], c))
            removed.update(ordered[: len(group) - keep_count(len(group), int(share * len(group)))])
        return removed
    every = sorted((c for g in groups for c in g), key=lambda c: (score[c], c))
    cut = set(every[: int(share * len(every))])
    for group in groups:
        ordered = sorted(group, key=lambda c: (score[c], c))
        gone = sum(c in cut for c in group)
        removed.update(ordered[: len(group) - keep_count(len(group), gone)])
    return removed


def _counts(model: keras.Model, ch: Channels, removed: set[int]) -> dict[str, tuple[int, int]]:
    """Weighted layer -> (input channels kept, output channels kept)."""
    kept = lambda ids: sum(ch.find(i) not in removed for i in ids)  # noqa: E731
    config = {e["name"]: e for e in model.get_config()["layers"]}
    out = {}
    for layer in model.layers:
        if layer.name not in ch.producers and not (
            isinstance(layer, L.DepthwiseConv2D) and layer.depth_multiplier == 1
        ):
            continue  # a layer kept whole (pinned) costs what it did
        refs = [ref for node in config[layer.name]["inbound_nodes"] for ref in node]
        cin = kept(ch.out[refs[0][0]]) if refs else 0
        out[layer.name] = (
            cin,
            kept(ch.producers[layer.name]) if layer.name in ch.producers else cin,
        )
    return out


def _macs(layer, cin: int, cout: int) -> int:
    positions = int(np.prod([d for d in layer.output_shape[1:-1]] or [1]))
    if isinstance(layer, L.SeparableConv2D):
        kh, kw = layer.kernel_size
        depth = cin * layer.depth_multiplier
        return positions * (kh * kw * depth + depth * cout)
    if isinstance(layer, L.DepthwiseConv2D):
        kh, kw = layer.kernel_size
        return positions * kh * kw * cout
    if isinstance(layer, L.Conv2D):
        kh, kw = layer.kernel_size
        return positions * kh * kw * cin // layer.groups * cout
    return positions * cin * cout


def macs_after(
    model: keras.Model, ch: Channels, removed: set[int], macs: dict | None = None
) -> int:
    """The model's multiply-adds per example with the ``removed`` classes gone (counted from widths).

    ``macs``: the model's :func:`~tfopt.compress.flops.model_macs`, when already counted.
    """
    counts = _counts(model, ch, removed)
    macs = macs if macs is not None else model_macs(model)
    counted = {name: _macs(model.get_layer(name), *io) for name, io in counts.items()}
    return sum(macs.values()) - sum(macs.get(n, 0) for n in counted) + sum(counted.values())


def _smallest_share(cost, pick, budget: float) -> tuple[float, float]:
    """``(the smallest share of channels removed whose cost meets budget (or None), the lowest cost seen)``.

    Shares are scanned in steps of 0.01, then bisected between the last that misses and the first
    that meets: a measured latency need not fall with every channel removed (a 1-channel
    convolution can be slower than a 6-channel one).
    """
    costs = [cost(pick(i / 100)) for i in range(101)]
    first = next((i for i, c in enumerate(costs) if c <= budget), None)
    if first is None or first == 0:
        return (None if first is None else 0.0), min(costs)
    low, high = (first - 1) / 100, first / 100
    while high - low >= 1e-4:
        mid = (low + high) / 2
        low, high = (low, mid) if cost(pick(mid)) <= budget else (mid, high)
    return high, min(costs)


def _latency_table(model, ch: Channels, pick, spec: ChannelSpec, measure) -> latency_lib.Table:
    now = _counts(model, ch, set())
    grid = latency_lib.layer_grid(model, [now] + [_counts(model, ch, pick(s)) for s in (0.5, 1.0)])
    todo = latency_lib.entries(model, grid)
    times = measure(model, todo)
    return latency_lib.Table.measured(model, grid, times, now=now, threads=spec.latency_threads)


CALIBRATIONS = 3  # whole-model measurements a latency plan takes at most
TOLERANCE = 0.05  # a measured latency this far under the target is on it


def _latency_share(model, ch: Channels, pick, spec: ChannelSpec, measure, steps_left: int):
    """``(share removed, the plan's latency info)`` for a latency target, the table calibrated.

    A table of layers timed alone misses what else shrinks with the widths (residual adds,
    padding, pooling, the memory between layers): on MobileNetV2 its predicted saving was 0.82-0.86x
    the measured one. So the whole pruned model is measured, the table's savings are scaled to
    that measurement, and the share is chosen again, until the measured latency is within
    ``TOLERANCE`` under the step's target or ``CALIBRATIONS`` measurements are spent.
    """
    measure = measure or (
        lambda m, todo: latency_lib.time_signatures(m, todo, threads=spec.latency_threads)
    )
    table = _latency_table(model, ch, pick, spec, measure)
    base = table.base_us
    raw = lambda removed: table.predict(_counts(model, ch, removed))  # noqa: E731
    budget = base - (base - spec.latency_us) / steps_left if base > spec.latency_us else base

    def timed(share: float) -> dict:
        removed = pick(share)
        smaller = prune_channels(Plan(model, ch, removed, {}, {}, 0, 0, share))
        measured, table_us = float(measure(smaller, [])[0]), raw(removed)
        saved = base - table_us
        scale = (base - measured) / saved if saved > 0 and measured < base else 1.0
        return {"share": share, "table_us": table_us, "measured_us": measured, "scale": scale}

    scale, tried = 1.0, []
    cost = lambda removed: base - scale * (base - raw(removed))  # noqa: E731
    share, floor = _smallest_share(cost, pick, budget)
    if share is None:  # the table says out of reach; the fastest widths, measured, decide
        tried.append(timed(1.0))
        fastest = tried[-1]["measured_us"]
        if fastest > budget:
            nearest = math.ceil(fastest * (1 + TOLERANCE) * 10) / 10
            raise TargetOutOfReach(
                f"channel-pruning latency target {spec.latency_us:g} us is out of reach: the fastest widths (each "
                f"group keeps >= {spec.round_to}) measure {fastest:.1f} us (LiteRT, {spec.latency_threads} "
                f"thread(s); the model now {base:.1f} us; the unprunable layers hold the rest); give "
                f"--target-latency-us >= {nearest:g}",
                nearest,
            )
        scale = tried[-1]["scale"]
        share, floor = _smallest_share(cost, pick, budget)
    while share and len(tried) < CALIBRATIONS:
        tried.append(timed(share))
        if budget * (1 - TOLERANCE) <= tried[-1]["measured_us"] <= budget:
            break
        previous, scale = scale, tried[-1]["scale"]
        again, lowest = _smallest_share(cost, pick, budget)
        if again is None or again == share:
            scale = previous if again is None else scale  # the prediction that chose ``share``
            break
        share, floor = again, lowest
    return share, {
        "target_us": spec.latency_us,
        "step_target_us": round(budget, 2),
        "before_us": round(base, 2),
        "predicted_us": round(cost(pick(share)), 2),
        "floor_us": round(floor, 2),
        "threads": spec.latency_threads,
        "calibration": [
            {k: round(v, 4 if k in ("share", "scale") else 2) for k, v in t.items()} for t in tried
        ],
        "table": table.to_dict(),
    }


def plan(
    model: keras.Model, spec: ChannelSpec, batches=None, *, measure=None, steps_left: int = 1
) -> Plan:
    """Chooses the channels to remove under ``spec``.

    Args:
        model: A functional or Sequential tf_keras model.
        spec: What to remove and how to rank.
        batches: ``(images, labels)`` training batches: ``taylor`` importance needs them.
        measure: For a latency target: ``(model, entries) -> times`` (default
            :func:`tfopt.compress.latency.time_signatures` at ``spec.latency_threads``); a
            multi-worker job passes one that every worker gets the chief's times from.
        steps_left: For a latency target: this step goes ``1 / steps_left`` of the way from the
            model's measured latency to the target.

    Raises:
        OptimizeError: a bad spec, nothing prunable, or a FLOPs or latency target below the
            floor (every group at its minimum width).
    """
    spec.validate()
    model = fresh(model)
    spec.selection.check(model)
    ch = trace(model)
    for name, ids in ch.producers.items():
        if not spec.selection.matches(model.get_layer(name)):
            ch.pin(ids, name, "not selected")
    classes = ch.classes()
    total = sum(model_macs(model).values())
    if not classes:
        raise OptimizeError(
            f"model {model.name!r} has no channel that can be pruned (pinned: "
            f"{', '.join(f'{n} ({w})' for n, w in ch.why.items()) or 'nothing'}); select other layers "
            "or use another technique"
        )
    scores = importance(model, list(ch.producers), spec.importance, batches)
    score = {
        cls: float(np.mean([scores[p][i] for p, i in members])) for cls, members in classes.items()
    }
    groups = _groups(ch, classes)
    pick = lambda share: _choose(groups, score, share, spec.ranking, spec.round_to)  # noqa: E731
    latency = None
    if spec.ratio:
        share = spec.ratio
    elif spec.latency_us:
        share, latency = _latency_share(model, ch, pick, spec, measure, steps_left)
    else:
        budget = spec.flops * total
        macs = model_macs(model)
        share, floor = _smallest_share(
            lambda removed: macs_after(model, ch, removed, macs), pick, budget
        )
        if share is None:
            raise TargetOutOfReach(
                f"channel-pruning FLOPs target {spec.flops:g} of the model is out of reach: every group at its "
                f"minimum width ({spec.round_to}) leaves {floor / total:.3f} of its multiply-adds ({floor} of {total}; "
                f"the unprunable layers hold the rest); give flops >= {math.ceil(floor / total * 1000) / 1000:g}",
                math.ceil(floor / total * 1000) / 1000,
            )
    removed = pick(share)
    kept = lambda ids: sum(ch.find(i) not in removed for i in ids)  # noqa: E731
    widths = {name: (len(ids), kept(ids)) for name, ids in ch.producers.items()}
    return Plan(
        model,
        ch,
        removed,
        widths,
        dict(ch.why),
        total,
        macs_after(model, ch, removed),
        share,
        latency,
    )


def prune_channels(decided: Plan) -> keras.Model:
    """The smaller model of a :class:`Plan`: the removed channels gone from every layer they touch.

    Returns:
        A new flat tf_keras model (outside any strategy scope).
    """
    model, ch, removed = decided.model, decided.channels, decided.removed
    graph = Graph(model)
    keep = lambda ids: [j for j, i in enumerate(ids) if ch.find(i) not in removed]  # noqa: E731
    for layer in model.layers:
        name = layer.name
        inbound = graph.inbound(name)
        ins = keep(ch.out[inbound[0]]) if inbound and inbound[0] in ch.out else None
        outs = keep(ch.producers[name]) if name in ch.producers else None
        weights = layer.get_weights()
        if isinstance(layer, L.SeparableConv2D) and name in ch.producers:
            dm = layer.depth_multiplier
            rows = [c * dm + m for c in ins for m in range(dm)]
            depthwise, pointwise, *bias = weights
            graph.set_layer(
                name,
                [
                    depthwise[:, :, ins, :],
                    pointwise[:, :, rows, :][..., outs],
                    *[b[outs] for b in bias],
                ],
                filters=len(outs),
            )
        elif (
            isinstance(layer, L.DepthwiseConv2D)
            and ins is not None
            and len(ins) != weights[0].shape[2]
        ):
            kernel, *bias = weights
            graph.set_layer(name, [kernel[:, :, ins, :], *[b[ins] for b in bias]])
        elif isinstance(layer, L.Conv2D) and name in ch.producers:
            kernel, *bias = weights
            graph.set_layer(
                name, [kernel[:, :, ins, :][..., outs], *[b[outs] for b in bias]], filters=len(outs)
            )
        elif isinstance(layer, L.Dense) and name in ch.producers:
            kernel, *bias = weights
            graph.set_layer(name, [kernel[ins][:, outs], *[b[outs] for b in bias]], units=len(outs))
        elif (
            isinstance(layer, L.BatchNormalization)
            and ins is not None
            and len(ins) != weights[0].shape[0]
        ):
            graph.set_layer(name, [w[ins] for w in weights])
        elif isinstance(layer, L.Reshape):
            width = len(keep(ch.out[name]))
            target = list(graph.entries[name]["config"]["target_shape"])
            if target[-1] not in (-1, width):
                graph.set_layer(name, target_shape=tuple(target[:-1]) + (width,))
    return graph.build()


def check_widths(model: keras.Model, spec: ChannelSpec, info: dict) -> dict:
    """The run record's ``channels`` check: the result's widths and multiply-adds, read back, are the plan's
    and meet the FLOPs target (when the target is one); under a latency target, the latency its
    table predicts meets it (the measured latency is recorded beside it, not judged: one
    measurement on a shared machine varies by 10-20%).

    Args:
        model: The pruned (and fine-tuned) float model.
        spec: The spec it was pruned under.
        info: The plan's or the phase's info (``widths``, ``macs_before``, ``macs_after``, ``latency``).
    """
    widths = {}
    for name in info["widths"]:
        layer = model.get_layer(name)
        widths[name] = int(layer.units if isinstance(layer, L.Dense) else layer.filters)
    counted = sum(model_macs(model).values())
    target = (
        info["macs_before"] if spec.ratio or spec.latency_us else spec.flops * info["macs_before"]
    )
    wrong = sorted(n for n, w in widths.items() if w != info["widths"][n][1])
    out = {
        "macs": counted,
        "planned": info["macs_after"],
        "target": int(target),
        "wrong_widths": wrong,
        "ok": not wrong and counted == info["macs_after"] and counted <= target,
    }
    if spec.latency_us:
        latency = info["latency"]
        out.update(
            latency_target_us=spec.latency_us,
            predicted_us=latency["predicted_us"],
            measured_us=latency.get("measured_us"),
            ok=out["ok"] and latency["predicted_us"] <= spec.latency_us,
        )
    return out
