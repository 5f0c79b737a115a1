"""Low-rank factorization: a kernel by truncated SVD into two smaller layers.

* ``Dense(n)`` on ``m`` inputs becomes ``Dense(r, no bias) -> Dense(n)``: ``r (m + n)`` instead of
  ``m n`` multiply-adds.
* ``Conv2D(cout, k x k)`` becomes ``Conv2D(r, k x k, no bias) -> Conv2D(cout, 1 x 1)``: the SVD of
  the kernel reshaped to ``(k k cin) x cout``, strides, padding and dilation on the first
  (``conv="pointwise"``, the default);
* or, with ``conv="spatial"`` (Jaderberg et al. 2014, Tai et al. 2016), ``Conv2D(r, k x 1, no bias)
  -> Conv2D(cout, 1 x k)``: the SVD of the kernel reshaped to ``(k cin) x (k cout)``, the height's
  stride, padding and dilation on the first, the width's on the second. A kernel with a side of
  1 is factorized pointwise.

The second layer keeps the original's name, bias and activation, so consumers and outputs are
unchanged; the first is ``<name>_lr``. At full rank the model computes what it did (up to float
rounding). The rank of each layer comes from the energy it keeps (``sum s[:r]^2 / sum s^2``) or
from a FLOPs budget for the whole model, met greedily by dropping the singular value that loses
the least energy per multiply-add saved. A layer the factorization would not make cheaper is
left whole and named.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tfopt.core._keras import keras

import numpy as np

from tfopt.compress.common import OptimizeError, Selection
from tfopt.compress.flops import model_macs
from tfopt.compress.surgery import Graph, fresh
from tfopt.config.optimize import LOW_RANK_BY as RANK_BY
from tfopt.config.optimize import LOW_RANK_CONV as CONV


@dataclass(frozen=True)
class LowRankSpec:
    """How to factorize.

    Attributes:
        rank_by: ``energy`` (each layer keeps ``energy`` of its squared singular values) or
            ``flops`` (the model's multiply-adds end at ``flops`` times the original's).
        energy: Share of each kernel's energy kept, in (0, 1].
        flops: Target multiply-adds as a share of the model's, in (0, 1].
        round_to: Ranks are multiples of this (8 suits SIMD kernels; 1 = any rank).
        conv: How a k x k Conv2D splits: ``pointwise`` (k x k then 1 x 1) or ``spatial`` (k x 1
            then 1 x k).
        selection: Layers to consider; empty = every Dense and Conv2D.
    """

    rank_by: str = "flops"
    energy: float = 0.9
    flops: float = 0.5
    round_to: int = 1
    conv: str = "pointwise"
    selection: Selection = field(default_factory=Selection)

    def validate(self) -> LowRankSpec:
        """Raises OptimizeError naming the bad value and the valid range."""
        if self.rank_by not in RANK_BY:
            raise OptimizeError(
                f"rank_by={self.rank_by!r} is not valid; choose one of {', '.join(RANK_BY)}"
            )
        if self.conv not in CONV:
            raise OptimizeError(
                f"conv={self.conv!r} is not valid; choose one of {', '.join(CONV)} "
                "(--low-rank-conv)"
            )
        if self.round_to < 1:
            raise OptimizeError(
                f"round_to={self.round_to} must be >= 1 (1 = any rank, 8 = multiples of 8)"
            )
        if not 0 < self.energy <= 1 or not 0 < self.flops <= 1:
            raise OptimizeError(
                f"energy={self.energy} and flops={self.flops} must be in (0, 1], e.g. energy=0.9 "
                "(keep 90% of each kernel's energy) or flops=0.5 (half the model's multiply-adds)"
            )
        return self

    def to_dict(self) -> dict:
        """JSON-ready settings."""
        return {
            "rank_by": self.rank_by,
            "energy": self.energy,
            "flops": self.flops,
            "round_to": self.round_to,
            "conv": self.conv,
            "selection": self.selection.to_dict(),
        }


@dataclass
class Candidate:
    """A layer that can be factorized: its kernel as a matrix, its SVD and its cost."""

    name: str
    matrix: np.ndarray  # (inputs, outputs)
    positions: int  # output positions per example (multiply-adds per matrix entry)
    u: np.ndarray
    s: np.ndarray
    vt: np.ndarray
    first_positions: int = (
        0  # the first layer's output positions (0: ``positions``; spatial: H_out x W_in)
    )

    @property
    def macs(self) -> int:
        """Multiply-adds per example of the whole layer."""
        return self.positions * self.matrix.size

    @property
    def _per_rank(self) -> int:
        rows, cols = self.matrix.shape
        return (self.first_positions or self.positions) * rows + self.positions * cols

    def macs_at(self, rank: int) -> int:
        """Multiply-adds per example of the factorized pair at ``rank``."""
        return rank * self._per_rank

    @property
    def max_rank(self) -> int:
        """The largest rank at which the pair costs fewer multiply-adds than the layer (0: none)."""
        return (self.macs - 1) // self._per_rank

    def energy_loss(self, rank: int) -> float:
        """Share of the kernel's squared singular values dropped at ``rank``."""
        total = float(np.sum(self.s**2))
        return float(np.sum(self.s[rank:] ** 2)) / total if total else 0.0


def _why_not(layer) -> str | None:
    if isinstance(layer, (keras.layers.DepthwiseConv2D, keras.layers.SeparableConv2D)):
        return "depthwise and separable convolutions have no dense kernel to factorize"
    if isinstance(layer, keras.layers.Conv2D):
        return "grouped convolution" if layer.groups != 1 else None
    if isinstance(layer, keras.layers.Dense):
        return None
    return ""  # not a candidate at all


def _spatial(layer) -> bool:
    """A channels-last Conv2D whose kernel is at least 2 x 2: split into k x 1 then 1 x k."""
    return (
        isinstance(layer, keras.layers.Conv2D)
        and layer.data_format == "channels_last"
        and min(layer.kernel_size) > 1
    )


def _matrix(kernel: np.ndarray, spatial: bool) -> np.ndarray:
    """The kernel as the matrix its SVD splits: ``(kh kw cin) x cout``, or spatially ``(kh cin) x (kw cout)``."""
    if spatial:
        kh, kw, cin, cout = kernel.shape
        return kernel.transpose(0, 2, 1, 3).reshape(kh * cin, kw * cout)
    return kernel.reshape(-1, kernel.shape[-1])


def candidates(model: keras.Model, spec: LowRankSpec) -> tuple[list[Candidate], dict[str, str]]:
    """The layers of ``model`` that can be factorized, and the others considered, with why not."""
    spec.selection.check(model)
    macs = model_macs(model)
    found, skipped = [], {}
    for layer in model.layers:
        reason = _why_not(layer)
        if reason == "" or not spec.selection.matches(layer):
            continue
        if reason is None and len(layer.inbound_nodes) != 1:
            reason = "shared layer (called more than once)"
        if reason:
            skipped[layer.name] = reason
            continue
        kernel = layer.get_weights()[0]
        spatial = spec.conv == "spatial" and _spatial(layer)
        matrix = _matrix(kernel, spatial)
        positions = macs.get(layer.name, 0) // matrix.size
        u, s, vt = np.linalg.svd(matrix.astype(np.float64), full_matrices=False)
        first = int(layer.output_shape[1]) * int(layer.input_shape[2]) if spatial else 0
        cand = Candidate(layer.name, matrix, positions, u, s, vt, first)
        if cand.max_rank < 1:
            skipped[layer.name] = (
                f"too small to gain: {matrix.shape[0]}x{matrix.shape[1]} kernel costs "
                f"{cand.macs} multiply-adds, a rank-1 pair {cand.macs_at(1)}"
            )
            continue
        found.append(cand)
    return found, skipped


def energy_ranks(cands: list[Candidate], energy: float, multiple: int = 1) -> dict[str, int]:
    """The smallest rank (a multiple of ``multiple``) keeping ``energy`` of each kernel; 0 where it would not save."""
    ranks = {}
    for c in (c for c in cands if c.max_rank >= multiple):
        kept = np.cumsum(c.s**2) / max(float(np.sum(c.s**2)), 1e-30)
        rank = -(-int(np.searchsorted(kept, energy - 1e-12) + 1) // multiple) * multiple
        ranks[c.name] = rank if rank <= c.max_rank else 0
    return ranks


def budget_ranks(
    cands: list[Candidate], total_macs: int, share: float, multiple: int = 1
) -> dict[str, int]:
    """Ranks (multiples of ``multiple``) that bring the model to ``share`` of ``total_macs`` losing the
    least energy; 0 = whole.

    Raises:
        OptimizeError: the budget is below what every candidate at its smallest rank gives (the floor).
    """
    budget = share * total_macs
    cands = [c for c in cands if c.max_rank >= multiple]
    floor = total_macs - sum(c.macs - c.macs_at(multiple) for c in cands)
    if budget < floor:
        raise OptimizeError(
            f"low-rank FLOPs budget {share:g} of the model is out of reach: rank {multiple} "
            f"everywhere gives {floor / total_macs:.3f} of its multiply-adds ({floor} of "
            f"{total_macs}); give flops >= {np.ceil(floor / total_macs * 1000) / 1000:g}"
        )
    ranks = {c.name: 0 for c in cands}
    current = float(total_macs)

    def step(
        c: Candidate,
    ) -> tuple[float, int, int]:  # (energy lost per multiply-add saved, new rank, saved)
        rank = ranks[c.name]
        new = c.max_rank // multiple * multiple if rank == 0 else rank - multiple
        saved = (c.macs if rank == 0 else c.macs_at(rank)) - c.macs_at(new)
        lost = c.energy_loss(new) - (0.0 if rank == 0 else c.energy_loss(rank))
        return lost / saved, new, saved

    while current > budget:
        moves = [(step(c), c) for c in cands if ranks[c.name] != multiple]
        if not moves:
            break
        (_, new, saved), best = min(moves, key=lambda m: m[0][0])
        ranks[best.name] = new
        current -= saved
    return ranks


def factorize(model: keras.Model, ranks: dict[str, int], conv: str = "pointwise") -> keras.Model:
    """``model`` with each layer of ``ranks`` (rank > 0) replaced by its rank-r pair.

    Args:
        model: A functional or Sequential tf_keras model.
        ranks: Layer name -> rank (0 or absent: left whole).
        conv: ``pointwise`` or ``spatial``: how a k x k Conv2D splits (see the module's docstring).

    Returns:
        A new flat model; the first layer of each pair is ``<name>_lr``.
    """
    graph = Graph(model)
    for name, rank in ranks.items():
        if rank <= 0:
            continue
        layer = graph.layers[name]
        kernel, *rest = layer.get_weights()
        spatial = conv == "spatial" and _spatial(layer)
        u, s, vt = np.linalg.svd(_matrix(kernel, spatial).astype(np.float64), full_matrices=False)
        root = np.sqrt(s[:rank])
        first = (u[:, :rank] * root).astype(kernel.dtype)
        second = (root[:, None] * vt[:rank]).astype(kernel.dtype)
        if not isinstance(layer, keras.layers.Conv2D):
            dense = {"units": rank, "activation": "linear", "use_bias": False}
            graph.insert_before(name, f"{name}_lr", "Dense", dense, [first])
            graph.set_layer(name, [second, *rest])
        elif spatial:
            _split_spatial(graph, name, layer.get_config(), rank, kernel, first, second, rest)
        else:
            _split_pointwise(graph, name, layer.get_config(), rank, kernel, first, second, rest)
    return graph.build()


def _conv_first(cfg: dict, rank: int, **shape) -> dict:
    """The config of the first Conv2D of a pair: ``rank`` filters, linear, no bias."""
    common = {"padding": cfg["padding"], "data_format": cfg["data_format"], "groups": 1}
    return {**common, "filters": rank, "activation": "linear", "use_bias": False, **shape}


def _split_pointwise(graph, name, cfg, rank, kernel, first, second, rest) -> None:
    """A k x k Conv2D as k x k to ``rank`` channels, then 1 x 1."""
    shape = {k: cfg[k] for k in ("kernel_size", "strides", "dilation_rate")}
    graph.insert_before(
        name,
        f"{name}_lr",
        "Conv2D",
        _conv_first(cfg, rank, **shape),
        [first.reshape(*kernel.shape[:-1], rank)],
    )
    graph.set_layer(
        name,
        [second.reshape(1, 1, rank, -1), *rest],
        kernel_size=(1, 1),
        strides=(1, 1),
        padding="valid",
        dilation_rate=(1, 1),
    )


def _split_spatial(graph, name, cfg, rank, kernel, first, second, rest) -> None:
    """A k x k Conv2D as k x 1 to ``rank`` channels, then 1 x k."""
    (kh, kw), (sh, sw), (dh, dw) = cfg["kernel_size"], cfg["strides"], cfg["dilation_rate"]
    shape = {"kernel_size": (kh, 1), "strides": (sh, 1), "dilation_rate": (dh, 1)}
    graph.insert_before(
        name,
        f"{name}_lr",
        "Conv2D",
        _conv_first(cfg, rank, **shape),
        [first.reshape(kh, 1, kernel.shape[2], rank)],
    )
    graph.set_layer(
        name,
        [second.reshape(rank, kw, -1).transpose(1, 0, 2)[None], *rest],
        kernel_size=(1, kw),
        strides=(1, sw),
        dilation_rate=(1, dw),
    )


@dataclass
class Plan:
    """What :func:`plan` decided: ranks, the layers left whole and why, multiply-adds before/after."""

    ranks: dict[str, int]
    skipped: dict[str, str]
    macs_before: int
    macs_after: int
    energy_kept: dict[str, float]
    conv: str = "pointwise"

    def to_dict(self) -> dict:
        """JSON-ready data (the run record's ``low_rank`` section)."""
        return {
            "ranks": self.ranks,
            "skipped": self.skipped,
            "macs_before": self.macs_before,
            "macs_after": self.macs_after,
            "energy_kept": self.energy_kept,
            "conv": self.conv,
        }


def plan(model: keras.Model, spec: LowRankSpec) -> Plan:
    """Chooses each layer's rank under ``spec``.

    Raises:
        OptimizeError: a bad spec, or a FLOPs budget below the floor.
    """
    spec.validate()
    model = fresh(model)
    cands, skipped = candidates(model, spec)
    total = sum(model_macs(model).values())
    if spec.rank_by == "energy":
        ranks = energy_ranks(cands, spec.energy, spec.round_to)
    else:
        ranks = budget_ranks(cands, total, spec.flops, spec.round_to)
    by_name = {c.name: c for c in cands}
    for c in cands:
        if c.name not in ranks:
            skipped[c.name] = (
                f"no rank that is a multiple of {spec.round_to} costs less than the layer"
            )
    for name, rank in ranks.items():
        if rank == 0:
            c = by_name[name]
            skipped[name] = (
                f"would not save: {spec.energy:g} of its energy needs rank > {c.max_rank}, the largest "
                "that costs less"
                if spec.rank_by == "energy"
                else "cheaper whole within the budget"
            )
    kept = {n: r for n, r in ranks.items() if r > 0}
    after = total - sum(by_name[n].macs - by_name[n].macs_at(r) for n, r in kept.items())
    return Plan(
        kept,
        skipped,
        total,
        after,
        {n: round(1 - by_name[n].energy_loss(r), 5) for n, r in kept.items()},
        spec.conv,
    )


def check_flops(model: keras.Model, spec: LowRankSpec, info: dict) -> dict:
    """The run record's ``flops`` check: the result's multiply-adds, counted again, meet the plan.

    Args:
        model: The factorized (and fine-tuned) float model.
        spec: The spec it was factorized under.
        info: The low_rank phase's info (its ``macs_before`` and ``macs_after``).
    """
    counted = sum(model_macs(model).values())
    target = spec.flops * info["macs_before"] if spec.rank_by == "flops" else info["macs_before"]
    return {
        "macs": counted,
        "planned": info["macs_after"],
        "target": int(target),
        "ok": counted == info["macs_after"] and counted <= target,
    }
