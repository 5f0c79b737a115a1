"""The checks a whole RunConfig passes before anything runs."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from tfopt.config.distill import DistillConfig, parse_features
from tfopt.config.export import parse_modes, parse_runtimes, parse_threads
from tfopt.config.federated import check_federated
from tfopt.config.fields import AUTOTUNE, FLAG, LAUNCHED_SERVICE
from tfopt.config.privacy import check_privacy
from tfopt.config.values import _CHOICES, _validate_augment, parse_image_size
from tfopt.core.errors import ConfigError
from tfopt.core.specs import parse_model


def _validate(cfg: Any) -> Any:
    _check_values(cfg)
    _check_strategy_fit(cfg)
    _check_ranges(cfg)
    _check_distill(cfg.distill)
    cfg.optimize.block()  # the fields read from text parse
    cfg.optimize.phase_epochs_of()
    _check_export(cfg.export)
    check_privacy(cfg.privacy)
    check_federated(cfg.federated)
    return cfg


#: The export counts and their least values.
EXPORT_LEAST = {
    "calibration_steps": 1,
    "runs": 1,
    "warmup": 0,
    "rounds": 1,
    "eval_limit": 0,
    "max_float_layers": 1,
    "search_limit": 0,
    "auto_candidates": 2,
}


def _check_export(e: Any) -> None:
    """The export's modes, thread counts and runtimes, its counts and its fidelity gate in range."""
    parse_modes(e.modes)
    parse_threads(e.threads)
    parse_runtimes(e.runtimes)
    for key, low in EXPORT_LEAST.items():
        if getattr(e, key) < low:
            raise ConfigError(f"export.{key}={getattr(e, key)} must be >= {low}")
    if not 0.0 <= e.min_agreement <= 1.0 or not e.max_accuracy_drop >= 0:
        raise ConfigError(
            f"export.min_agreement={e.min_agreement} must be in [0, 1] and "
            f"export.max_accuracy_drop={e.max_accuracy_drop} >= 0 (accuracy points)"
        )
    if not e.trainable_lr > 0:
        raise ConfigError(
            f"export.trainable_lr={e.trainable_lr} must be > 0, e.g. 0.01 (--trainable-lr)"
        )


def choosers(cls: type) -> tuple[str, ...]:
    """The fields of a section class whose values decide which others are read (its
    ``CHOSEN_BY``: one field's name, or a tuple of them); none when it has no chooser."""
    chosen_by = getattr(cls, "CHOSEN_BY", ())
    return (chosen_by,) if isinstance(chosen_by, str) else tuple(chosen_by)


def reads(section: Any, key: str) -> bool:
    """Whether ``section`` (a config section's value) reads its field ``key``: the field's
    :attr:`Flag.read_by` holds the value of one of the section's ``CHOSEN_BY`` fields, or is
    empty."""
    f = next(f for f in dataclasses.fields(section) if f.name == key)
    flag_ = f.metadata.get(FLAG)
    if flag_ is None or not flag_.read_by:
        return True
    return any(getattr(section, c) in flag_.read_by for c in choosers(type(section)))


def _check_distill(d: DistillConfig) -> None:
    """The distillation loss's ranges, the teacher weights' form and the feature pairs (a
    setting the chosen technique does not read is not checked: the command line refuses it)."""
    bad = None
    if not d.temperature > 0:
        bad = "temperature", "must be > 0 (Hinton et al. use 2-20)"
    elif not 0.0 <= d.alpha <= 1.0:
        bad = "alpha", "must be in [0, 1] (0 = labels only, 1 = teacher only)"
    elif reads(d, "sparsity") and not 0.0 < d.sparsity < 1.0:
        bad = "sparsity", "must be in (0, 1), e.g. 0.75"
    elif reads(d, "clusters") and not 2 <= d.clusters <= 256:
        bad = "clusters", "must be in [2, 256], e.g. 16"
    elif not d.feature_weight >= 0:
        bad = "feature_weight", "must be >= 0"
    elif teacher_weights(d.teacher_weights) == []:
        bad = "teacher_weights", "must be equal, accuracy or comma-separated non-negative numbers"
    if bad:
        key, rule = bad
        raise ConfigError(f"distill.{key}={getattr(d, key)!r} {rule}")
    parse_features(d.features)


def teacher_weights(text: str) -> list[float] | None:
    """``distill.teacher_weights`` as fixed numbers; None for ``equal`` and ``accuracy``, ``[]``
    when the text is neither those nor non-negative numbers with a positive sum."""
    if text in ("equal", "accuracy"):
        return None
    try:
        weights = [float(w) for w in text.split(",")]
    except ValueError:
        return []
    if min(weights) < 0 or not sum(weights) > 0 or not all(map(math.isfinite, weights)):
        return []
    return weights


def _check_values(cfg: Any) -> None:
    """Choices, sizes that must be positive, and the tf.data knobs (positive or AUTOTUNE)."""
    for (section, key), choices in _CHOICES.items():
        value = getattr(getattr(cfg, section), key)
        if value not in choices:
            raise ConfigError(
                f"{section}.{key}={value!r} is not valid; choose one of {', '.join(map(str, choices))}"
            )
    positive = {
        ("data", "global_batch_size"),
        ("data", "num_shards"),
        ("runtime", "cpu_replicas"),
        ("runtime", "min_shard_bytes"),
        ("runtime", "max_shard_bytes"),
        ("train", "epochs"),
        ("data", "shuffle_buffer"),
    }
    for section, key in positive:
        value = getattr(getattr(cfg, section), key)
        if value < 1:
            raise ConfigError(f"{section}.{key}={value} must be >= 1; give a positive number")
    for key in (
        "interleave_cycle_length",
        "num_parallel_reads",
        "num_parallel_calls",
        "prefetch_buffer",
    ):
        value = getattr(cfg.data, key)
        if value == 0 or value < AUTOTUNE:
            raise ConfigError(
                f"data.{key}={value} is not valid; give a positive int or -1 for AUTOTUNE"
            )


def _check_strategy_fit(cfg: Any) -> None:
    """Settings that only some strategies read, and a freeze that fits the epochs."""
    if cfg.runtime.variable_partitioner != "none" and cfg.runtime.strategy != "parameter_server":
        raise ConfigError(
            f"runtime.variable_partitioner={cfg.runtime.variable_partitioner!r} shards variables over "
            f"ps tasks, which only strategy 'parameter_server' has (strategy is "
            f"{cfg.runtime.strategy!r}); use --strategy parameter_server, or leave variables whole "
            "(drop --shard-variables, or set runtime.variable_partitioner=none)"
        )
    if cfg.runtime.bytes_per_pack and cfg.runtime.strategy != "multi_worker_mirrored":
        raise ConfigError(
            f"runtime.bytes_per_pack={cfg.runtime.bytes_per_pack} splits the all-reduce of "
            "strategy 'multi_worker_mirrored' into packs, and the strategy is "
            f"{cfg.runtime.strategy!r}; use --strategy multi_worker_mirrored, or drop --bytes-per-pack"
        )
    if cfg.runtime.allreduce_dtype != "float32" and cfg.runtime.strategy not in (
        "mirrored",
        "multi_worker_mirrored",
    ):
        raise ConfigError(
            f"runtime.allreduce_dtype={cfg.runtime.allreduce_dtype!r} compresses the gradients' "
            "all-reduce, which only strategies 'mirrored' and 'multi_worker_mirrored' do (strategy "
            f"is {cfg.runtime.strategy!r}); use one of them, or drop --allreduce-dtype"
        )
    if cfg.runtime.strategy == "pipeline":
        _check_pipeline(cfg)
    if not 0 <= cfg.model.freeze_epochs <= cfg.train.epochs:
        raise ConfigError(
            f"model.freeze_epochs={cfg.model.freeze_epochs} must be in [0, train.epochs="
            f"{cfg.train.epochs}]; give the number of first epochs that train the head alone"
        )


def _check_pipeline(cfg: Any) -> None:
    """What strategy ``pipeline`` does not combine with, in one line each."""
    if cfg.runtime.stages < 1:
        raise ConfigError(f"runtime.stages={cfg.runtime.stages} must be >= 1, e.g. --stages 2")
    if cfg.runtime.device_memory_mib < 0:
        raise ConfigError(
            f"runtime.device_memory_mib={cfg.runtime.device_memory_mib:g} must be >= 0 "
            "(0 = no budget), e.g. --device-memory-mib 4096"
        )
    microbatches = cfg.runtime.microbatches or 4 * cfg.runtime.stages
    if cfg.data.global_batch_size < microbatches:
        raise ConfigError(
            f"data.global_batch_size={cfg.data.global_batch_size} is smaller than the "
            f"{microbatches} micro-batches strategy 'pipeline' splits each batch into; give "
            f"--batch-size {microbatches} or more, or fewer --microbatches"
        )
    if cfg.model.freeze_epochs:
        raise ConfigError(
            f"model.freeze_epochs={cfg.model.freeze_epochs}: strategy 'pipeline' trains every "
            "layer of every stage; drop --freeze-epochs, or use another strategy"
        )
    if cfg.privacy.enabled:
        raise ConfigError(
            "DP-SGD clips per-example gradients, which strategy 'pipeline' (gradients summed "
            "over micro-batches) does not compute; drop --dp-l2-clip, --dp-noise and --dp-epsilon, or "
            "use another strategy"
        )


def _check_ranges(cfg: Any) -> None:
    """Counts that may be 0, rates and factors in range, and the values parsed from text."""
    for section, key in (
        ("data", "limit"),
        ("runtime", "bytes_per_pack"),
        ("train", "steps_per_execution"),
        ("train", "steps_per_epoch"),
        ("data", "ram_budget_mb"),
        ("train", "backup_every"),
        ("train", "nan_retries"),
        ("runtime", "max_shards"),
        ("runtime", "microbatches"),
    ):
        if getattr(getattr(cfg, section), key) < 0:
            raise ConfigError(
                f"{section}.{key} must be >= 0 (0 = automatic); got {getattr(getattr(cfg, section), key)}"
            )
    if not 0.0 <= cfg.model.dropout < 1.0:
        raise ConfigError(f"model.dropout={cfg.model.dropout} must be in [0, 1)")
    if not 0.0 < cfg.train.nan_lr_factor <= 1.0:
        raise ConfigError(
            f"train.nan_lr_factor={cfg.train.nan_lr_factor} must be in (0, 1]; 1 keeps the rate"
        )
    _validate_augment(cfg.data)
    parse_image_size(cfg.data.image_size)
    parse_model(cfg.model.name, cfg.model.args)
    service = cfg.data.service
    if service not in ("", "local", LAUNCHED_SERVICE) and not (
        service.startswith("grpc://") and ":" in service[len("grpc://") :]
    ):
        raise ConfigError(
            f"data.service={service!r} is not valid; give local, grpc://HOST:PORT, "
            f"{LAUNCHED_SERVICE} or nothing (off)"
        )
    if cfg.train.learning_rate <= 0:
        raise ConfigError(f"train.learning_rate={cfg.train.learning_rate} must be > 0")
    for section, key in (("data", "seed"), ("train", "seed")):
        if not 0 <= getattr(getattr(cfg, section), key) < 2**32:
            raise ConfigError(
                f"{section}.{key}={getattr(getattr(cfg, section), key)} must be in [0, 2**32); "
                "give a non-negative seed"
            )
    if not cfg.runtime.startup_timeout > 0:
        raise ConfigError(
            f"runtime.startup_timeout={cfg.runtime.startup_timeout} must be > 0 seconds"
        )
