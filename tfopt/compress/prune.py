"""Magnitude pruning with tfmot: schedules, per-layer selection, 2:4 structure, XNNPACK policy.

    spec = PruneSpec(sparsity=0.8, schedule="polynomial", end_step=1000)
    with strategy.scope():
        model = rebuild(base, policy, float32_layers=prunable_names(base, spec))
        pruned = wrap(model, spec, policy)
        pruned.compile(...)
    pruned.fit(..., callbacks=callbacks(spec, log_dir))
    with strategy.scope():
        stripped = strip(pruned)
    check_m_by_n(stripped, (2, 4))  # structured pruning: every group of 4 holds >= 2 zeros

Under a mixed precision policy the pruned layers compute in float32 (their wrappers too): tfmot's
mask update assigns a mixed-dtype product to the float32 variable under MirroredStrategy
(tensorflow/model-optimization#409). The other layers keep the mixed policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tfopt.core._keras import keras

import numpy as np
import tensorflow_model_optimization as tfmot

from tfopt.compress.common import (
    OptimizeError,
    Selection,
    check_model,
    kernel_variables,
    m_by_n_violations,
)
from tfopt.config.optimize import PRUNE_POLICIES as POLICIES
from tfopt.config.optimize import SCHEDULES
from tfopt.core._compat import prunable_weight_names, prune_registry_supports

_sparsity = tfmot.sparsity.keras


def auto_frequency(total_steps: int) -> int:
    """Mask updates about 20 times in a phase of ``total_steps``, at most every 100 steps (tfmot's default)."""
    return max(1, min(100, total_steps // 20))


@dataclass(frozen=True)
class PruneSpec:
    """How to prune.

    Attributes:
        sparsity: Target (final) share of zero weights per pruned kernel, in [0, 1).
        schedule: ``constant`` (ConstantSparsity) or ``polynomial`` (PolynomialDecay from
            ``initial_sparsity`` to ``sparsity`` between ``begin_step`` and ``end_step``).
        initial_sparsity: Starting sparsity of the polynomial schedule.
        begin_step: First step that updates the masks.
        end_step: Last step that updates the masks. -1: ConstantSparsity keeps updating to the
            end; PolynomialDecay reaches the target two thirds into the phase, so the last third
            fine-tunes at the final sparsity (a last-step jump would leave no time to recover).
        frequency: Update the masks every this many steps (0: about 20 times per phase).
        m_by_n: Structured pruning: at least m zeros in every n consecutive weights, e.g.
            ``(2, 4)``; replaces the schedule (tfmot computes the mask once, at step 1).
        block_size: Block sparsity ``(rows, cols)`` of a rank-2 (Dense) kernel ``[in, out]``:
            whole blocks are pruned by their mean magnitude. ``(4, 1)`` zeroes runs of 4
            consecutive inputs of one output, contiguous in TFLite's ``[out, in]`` layout, which
            compresses better and suits TFLite's block-sparse kernels. tfmot blocks only rank-2
            kernels, so convolutions are pruned weight by weight. ``(1, 1)`` = unstructured.
        policy: ``none`` or ``xnnpack`` (``PruneForLatencyOnXNNPack``: only 1x1 convolutions
            of a supported subgraph, for XNNPACK's sparse inference).
        selection: Layers to prune; empty = every layer tfmot can prune.
    """

    sparsity: float = 0.8
    schedule: str = "polynomial"
    initial_sparsity: float = 0.0
    begin_step: int = 0
    end_step: int = -1
    frequency: int = (
        0  # 0: about 20 updates per phase, at most every 100 steps (the command line's default)
    )
    m_by_n: tuple[int, int] | None = None
    block_size: tuple[int, int] = (1, 1)
    policy: str = "none"
    selection: Selection = field(default_factory=Selection)

    def validate(self) -> PruneSpec:
        """Raises OptimizeError naming the bad value and the valid range."""
        if not 0.0 <= self.sparsity < 1.0:
            raise OptimizeError(
                f"sparsity={self.sparsity} must be in [0, 1), e.g. 0.8 for 80% zeros"
            )
        if self.schedule not in SCHEDULES:
            raise OptimizeError(
                f"pruning schedule {self.schedule!r} is not valid; "
                f"choose one of {', '.join(SCHEDULES)}"
            )
        if not 0.0 <= self.initial_sparsity <= self.sparsity:
            raise OptimizeError(
                f"initial_sparsity={self.initial_sparsity} must be in [0, sparsity={self.sparsity}]"
            )
        if self.begin_step < 0 or self.frequency < 0:
            raise OptimizeError(
                f"begin_step={self.begin_step} must be >= 0 and frequency={self.frequency} >= 0 "
                "(0 = about 20 mask updates per phase)"
            )
        if self.end_step != -1 and self.end_step <= self.begin_step:
            raise OptimizeError(
                f"end_step={self.end_step} must be > begin_step={self.begin_step} (or -1 = to the end)"
            )
        if self.policy not in POLICIES:
            raise OptimizeError(
                f"pruning policy {self.policy!r} is not valid; choose one of {', '.join(POLICIES)}"
            )
        if self.m_by_n is not None:
            m, n = self.m_by_n
            if not 0 < m < n:
                raise OptimizeError(f"m_by_n={self.m_by_n} needs 0 < m < n, e.g. (2, 4)")
        if len(self.block_size) != 2 or min(self.block_size) < 1:
            raise OptimizeError(
                f"block_size={self.block_size} must be two integers >= 1, e.g. 4,1 (1,1 = unstructured)"
            )
        if self.m_by_n is not None and tuple(self.block_size) != (1, 1):
            raise OptimizeError(
                f"block_size={self.block_size} and m_by_n={self.m_by_n} exclude each other; give one"
            )
        return self

    def make_schedule(self, total_steps: int):
        """The tfmot pruning schedule; ``total_steps`` (the phase length) fills in ``end_step=-1``."""
        recover = (total_steps - self.begin_step) // 3
        end = (
            self.end_step
            if self.end_step != -1
            else max(self.begin_step + 1, total_steps - recover)
        )
        frequency = self.frequency or auto_frequency(total_steps)
        if self.schedule == "polynomial":
            return _sparsity.PolynomialDecay(
                self.initial_sparsity,
                self.sparsity,
                begin_step=self.begin_step,
                end_step=end,
                frequency=frequency,
            )
        return _sparsity.ConstantSparsity(
            self.sparsity, begin_step=self.begin_step, end_step=self.end_step, frequency=frequency
        )

    def to_dict(self) -> dict:
        """JSON-ready description (for run.json)."""
        return {
            "sparsity": self.sparsity,
            "schedule": self.schedule,
            "initial_sparsity": self.initial_sparsity,
            "begin_step": self.begin_step,
            "end_step": self.end_step,
            "frequency": self.frequency,
            "m_by_n": list(self.m_by_n) if self.m_by_n else None,
            "block_size": list(self.block_size),
            "policy": self.policy,
            "selection": self.selection.to_dict(),
        }


def why_not_prunable(layer) -> str | None:
    """Returns why tfmot cannot prune ``layer`` (None when it can, or when it holds nothing to prune)."""
    if isinstance(layer, _sparsity.PrunableLayer):
        return None
    if prune_registry_supports(layer):
        return None
    return (
        f"tfmot has no pruning rule for {type(layer).__name__}; make the class a "
        "tfmot.sparsity.keras.PrunableLayer (get_prunable_weights) or leave it out of --layers/--layer-types"
    )


def _has_prunable_weights(layer) -> bool:
    if isinstance(layer, _sparsity.PrunableLayer):
        return bool(layer.get_prunable_weights())
    return bool(prunable_weight_names(layer)) and bool(layer.weights)


def prunable_names(model: keras.Model, spec: PruneSpec) -> list[str]:
    """The layers ``wrap`` will prune: selected, supported, holding weights, allowed by the policy.

    Raises:
        OptimizeError: a layer named or typed in the selection cannot be pruned, or the XNNPACK
            policy does not fit the model.
    """
    check_model(model)
    spec.selection.check(model)
    policy = _policy(model, spec)
    names = []
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer) or not spec.selection.matches(layer):
            continue
        reason = why_not_prunable(layer)
        if reason and not spec.selection.everything and layer.weights:
            raise OptimizeError(f"layer {layer.name!r}: {reason}")
        if reason or not _has_prunable_weights(layer):
            continue
        if policy is not None and not policy.allow_pruning(layer):
            continue
        names.append(layer.name)
    if not names:
        raise OptimizeError(
            f"nothing to prune in model {model.name!r} with selection {spec.selection.to_dict()} "
            f"and policy {spec.policy!r}; run `python -m tfopt.optimize --inspect` to see what can be"
        )
    return names


def _policy(model, spec: PruneSpec):
    if spec.policy != "xnnpack":
        return None
    policy = _sparsity.PruneForLatencyOnXNNPack()
    try:
        policy.ensure_model_supports_pruning(model)
    except ValueError as e:
        raise OptimizeError(
            f"pruning policy 'xnnpack' does not fit model {model.name!r}: {e}; XNNPACK sparse inference needs "
            "ZeroPadding2D(1) -> Conv2D 3x3/stride 2 on 3 input channels, supported ops, and GlobalAveragePooling2D "
            "(keepdims) at the end; use --policy none"
        ) from None
    return policy


def wrap(
    model: keras.Model,
    spec: PruneSpec,
    total_steps: int,
    names: list[str] | None = None,
    wrapper_dtype: str | None = None,
) -> keras.Model:
    """Wraps the chosen layers of ``model`` with ``PruneLowMagnitude``; call inside ``strategy.scope()``.

    Args:
        model: A model rebuilt in the current scope (see ``common.rebuild``).
        spec: The pruning spec.
        total_steps: Fine-tuning length in steps (for ``end_step=-1``).
        names: Layers to wrap (default: ``prunable_names(model, spec)``).
        wrapper_dtype: dtype policy of the wrappers (``float32`` under a mixed policy).

    Returns:
        A new functional model sharing ``model``'s layers, with pruning wrappers.
    """
    names = set(names if names is not None else prunable_names(model, spec))
    params = {"pruning_schedule": spec.make_schedule(total_steps)}
    if spec.m_by_n:
        params["sparsity_m_by_n"] = tuple(spec.m_by_n)
    if wrapper_dtype:
        params["dtype"] = wrapper_dtype

    def clone(layer):
        if layer.name not in names:
            return layer
        kwargs = dict(params)
        if tuple(spec.block_size) != (1, 1) and all(
            len(w.shape) == 2 for w in kernel_variables(layer)
        ):
            kwargs["block_size"] = tuple(spec.block_size)
        return _sparsity.prune_low_magnitude(layer, **kwargs)

    return keras.models.clone_model(model, clone_function=clone)


def callbacks(log_dir: str | None) -> list:
    """``UpdatePruningStep`` (required) and, with a ``log_dir``, ``PruningSummaries`` for TensorBoard."""
    cbs: list = [_sparsity.UpdatePruningStep()]
    if log_dir:
        cbs.append(_sparsity.PruningSummaries(log_dir=log_dir))
    return cbs


def strip(model: keras.Model) -> keras.Model:
    """Removes the pruning wrappers (call in the scope that wrapped): the model export needs."""
    return _sparsity.strip_pruning(model)


def check_blocks(model: keras.Model, block_size: tuple[int, int], layers: list[str]) -> dict:
    """Verifies block sparsity on a stripped model: every block of a rank-2 kernel is all zero or not.

    Args:
        model: A stripped model.
        block_size: ``(rows, cols)`` of the blocks in the Keras ``[in, out]`` layout.
        layers: The layers that were pruned; only those with rank-2 kernels are blocked.

    Returns:
        ``{"ok": bool, "block_size": [r, c], "layers": {name: {"blocks": b, "mixed": m}}}``;
        a mixed block holds both zeros and non-zeros.
    """
    rows, cols = block_size
    out: dict = {"block_size": [rows, cols], "layers": {}}
    for layer in model.layers:
        if layer.name not in layers:
            continue
        for var in kernel_variables(layer):
            kernel = var.numpy()
            if kernel.ndim != 2:
                continue
            h, w = -(-kernel.shape[0] // rows) * rows, -(-kernel.shape[1] // cols) * cols
            zero, real = np.zeros((h, w), np.int64), np.zeros((h, w), np.int64)
            zero[: kernel.shape[0], : kernel.shape[1]] = kernel == 0
            real[: kernel.shape[0], : kernel.shape[1]] = 1  # edge blocks are partial

            def per_block(a):
                return a.reshape(h // rows, rows, w // cols, cols).sum(axis=(1, 3))

            zeros, cells = per_block(zero), per_block(real)
            mixed = int(((zeros > 0) & (zeros < cells)).sum())
            out["layers"][layer.name] = {"blocks": int(zeros.size), "mixed": mixed}
    out["ok"] = bool(out["layers"]) and all(v["mixed"] == 0 for v in out["layers"].values())
    return out


def check_m_by_n(
    model: keras.Model, m_by_n: tuple[int, int], layers: list[str] | None = None
) -> dict:
    """Verifies structured sparsity on a stripped model's weights.

    Args:
        model: A stripped model.
        m_by_n: ``(m, n)``: every group of n consecutive weights must hold at least m zeros.
        layers: The layers that were pruned (default: all with a kernel).

    Returns:
        ``{"ok": bool, "m_by_n": [m, n], "layers": {name: {"groups": g, "violations": v}}}``.
    """
    out = {"m_by_n": list(m_by_n), "layers": {}}
    for layer in model.layers:
        if layers is not None and layer.name not in layers:
            continue
        for var in kernel_variables(layer):
            kernel = var.numpy()
            if kernel.ndim in (2, 4):
                bad, groups = m_by_n_violations(kernel, *m_by_n)
                out["layers"][layer.name] = {"groups": groups, "violations": bad}
    out["ok"] = bool(out["layers"]) and all(v["violations"] == 0 for v in out["layers"].values())
    return out
