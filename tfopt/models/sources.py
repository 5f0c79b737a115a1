"""Model sources: every form of ``--model`` built or loaded one way, inside ``strategy.scope()``.

The forms (the registry is :data:`tfopt.core.specs.MODEL_SOURCES`):

- a built-in name (``cnn``, ``small_cnn``, ...: :mod:`tfopt.models.registry`);
- a model file (``.keras``, ``.h5`` or a SavedModel directory), loaded safely by
  :func:`tfopt.models.io.load_model` (``model.trust`` for Lambda layers and custom objects);
- ``keras.applications:NAME`` with ``model.args`` as keyword arguments, from ``tf_keras``: without
  ``include_top=True`` the network ends in global average pooling and a new logits layer for the
  dataset's classes; ``weights`` defaults to None (random), ``weights=imagenet`` downloads, a path
  loads a local file;
- ``package.module:function``, called as ``function(input_shape, num_classes, **model.args)``.

Whatever the form, the model tfopt trains ends in logits: a final softmax (a Dense layer's
activation, a ``Softmax`` or ``Activation("softmax")`` layer) is removed, so that the loss,
distillation and quantization see the same kind of output for every model; ``model.head``
replaces or adds the classification layer when the class count differs. What was done is
described in the run record (``model`` section). A ``keras.applications`` model's own
``preprocess_input`` becomes the data's ``data.normalize`` (see :func:`resolve_config`), and
preprocessing inside the model sets ``data.input_scale`` (:mod:`tfopt.models.inputs`), so
training, evaluation, calibration and the exported model's input contract all use it.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from tfopt.core._keras import ensure_tf_keras, keras

import numpy as np

from tfopt.config import BGR_PREFIX, ModelConfig, RunConfig, is_raw_normalize
from tfopt.core.errors import ConfigError, ModelError
from tfopt.core.fileio import tree_digest
from tfopt.core.specs import ModelSource, parse_model, parse_model_args, parse_model_source, resolve
from tfopt.models import io, registry
from tfopt.models.heads import fit_head, recast, to_logits


@dataclass
class Built:
    """A model ready to compile, and what tfopt did to it (for the run record)."""

    model: keras.Model
    description: dict


def check(cfg: ModelConfig) -> ModelSource:
    """Validates ``cfg`` without building anything: the form, a built-in name, a file's existence.

    Raises:
        ConfigError: not a model source, or an unknown built-in name.
        ModelError: a model file that does not exist.
    """
    source, _ = parse_model(cfg.name, cfg.args)
    if source.form == "builtin":
        registry.check_model_name(source.target)
    elif source.form == "file" and not os.path.exists(source.target):
        raise ModelError(
            f"model file {cfg.name!r} does not exist; give a .keras or .h5 file or a SavedModel "
            "directory (or a built-in name, keras.applications:NAME, package.module:function)"
        )
    return source


def describe(cfg: ModelConfig) -> dict:
    """What names the model, for fingerprints and run records: the form, and a file's path and sha256."""
    source = check(cfg)
    out = {"source": cfg.name, "form": source.form}
    if source.form == "file":
        out.update(path=source.target, sha256=tree_digest(source.target))
    if cfg.args:
        out["args"] = {
            k: repr(v) if not isinstance(v, (str, int, float, bool)) else v
            for k, v in parse_model_args(cfg.args).items()
        }
    return out


# -- keras.applications ------------------------------------------------------------------------


def application(name: str):
    """The ``tf_keras.applications`` function called ``name``.

    Raises:
        ModelError: no such application (the message names the closest ones).
    """
    fn = getattr(keras.applications, name, None)
    if not name[:1].isupper() or not callable(fn):
        names = [n for n in dir(keras.applications) if n[:1].isupper()]
        near = difflib.get_close_matches(name, names, n=3)
        hint = (
            f"did you mean {', '.join(near)}?"
            if near
            else f"choose one of {', '.join(sorted(names)[:12])}, ..."
        )
        raise ModelError(f"keras.applications:{name} does not exist; {hint}")
    return fn


def preprocessing(name: str) -> str:
    """``keras.applications:NAME``'s ``preprocess_input`` as a ``data.normalize`` value on [0, 1] images.

    Every family's function is affine per channel on 0-255 pixels (``tf``: to [-1, 1]; ``torch``:
    ImageNet mean and std; ``caffe``: channels reversed to BGR, then the ImageNet means subtracted,
    written with a ``bgr:`` prefix; the families that scale inside the model: pixels x 255). It is
    measured on probe pixels, so a family added to Keras needs no table here.

    Raises:
        ModelError: the function is not affine per channel, with or without the channels reversed.
    """
    fn = application(name)
    module = sys.modules[fn.__module__]
    pre = getattr(module, "preprocess_input", None)
    if pre is None:
        return ""
    f = lambda x: np.asarray(pre(np.array(x, np.float64)), np.float64).reshape(-1)  # noqa: E731
    zero, full = f([[[[0.0, 0.0, 0.0]]]]), f([[[[255.0, 255.0, 255.0]]]])
    scale, bias = (full - zero) / 255.0, zero
    probe = np.array([10.0, 100.0, 200.0])
    prefix = ""
    if not np.allclose(f([[[probe]]]), scale * probe + bias, atol=1e-3):
        prefix = BGR_PREFIX  # caffe mode: RGB -> BGR, then the per-channel shift
        if not np.allclose(f([[[probe]]]), scale * probe[::-1] + bias, atol=1e-3):
            raise ModelError(
                f"keras.applications:{name}'s preprocess_input is not a per-channel scale and shift; "
                "set the input scaling yourself with --set data.normalize=MEAN/STD"
            )
    if np.any(scale <= 0):
        raise ModelError(
            f"keras.applications:{name}'s preprocess_input inverts pixel values; "
            "set the input scaling yourself with --set data.normalize=MEAN/STD"
        )
    std = 1.0 / (255.0 * scale)
    mean = -bias * std
    if not prefix and np.allclose(std, 1.0) and np.allclose(mean, 0.0):
        return ""

    def text(values) -> str:
        values = [float(f"{v:.8g}") + 0.0 for v in values]  # + 0.0: no "-0"
        return ",".join(f"{v:.8g}" for v in (values[:1] if len(set(values)) == 1 else values))

    return f"{prefix}{text(mean)}/{text(std)}"


def resolve_config(cfg: RunConfig) -> RunConfig:
    """``cfg`` with the model's own input scaling: a ``keras.applications`` model's ``preprocess_input``
    as ``data.normalize``, unless the user set ``data.normalize`` already. A family that scales
    inside the model (``preprocess_input`` passes pixels through) is left to its graph
    (:mod:`tfopt.models.inputs`), which also sees ``include_preprocessing=False``.

    Reads no TensorFlow device (safe before a MultiWorkerMirrored strategy exists).
    """
    source = parse_model_source(cfg.model.name)
    if source.form != "applications" or cfg.data.normalize:
        return cfg
    normalize = preprocessing(source.target)
    if is_raw_normalize(normalize):  # the family scales inside the model: its graph says how
        return cfg
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, normalize=normalize))


# -- the builders, one per form (named by tfopt.core.specs.MODEL_SOURCES) -------------------------------


def build_builtin(
    source: ModelSource, cfg: ModelConfig, input_shape, num_classes: int
) -> keras.Model:
    """A built-in model (:mod:`tfopt.models.registry`)."""
    return registry.build_model(source.target, input_shape, num_classes, cfg.dropout)


def build_file(source: ModelSource, cfg: ModelConfig, input_shape, num_classes: int) -> keras.Model:
    """A model file, loaded safely (``cfg.trust`` allows code) and rebuilt under the current precision policy."""
    model = io.load_model(source.target, trust_model=cfg.trust)
    return recast(model, policy=keras.mixed_precision.global_policy().name)


def build_application(
    source: ModelSource, cfg: ModelConfig, input_shape, num_classes: int
) -> keras.Model:
    """``keras.applications:NAME(**cfg.args)``; without ``include_top=True``, pooled features and a new logits layer."""
    fn = application(source.target)
    kwargs = parse_model_args(cfg.args)
    _check_kwargs(fn, kwargs, f"keras.applications:{source.target}", strict=True)
    kwargs.setdefault("weights", None)
    if kwargs.get("input_tensor") is None:
        kwargs.setdefault("input_shape", tuple(input_shape))
    if kwargs.get("include_top"):
        kwargs.setdefault("classes", num_classes)
        kwargs.setdefault("classifier_activation", None)
        return _short_run_statistics(
            _call(fn, kwargs, f"keras.applications:{source.target}"), kwargs["weights"]
        )
    kwargs.update(include_top=False)
    kwargs.setdefault("pooling", "avg")
    base = _call(fn, kwargs, f"keras.applications:{source.target}")
    outputs = keras.layers.Dense(num_classes, dtype="float32", name="logits")(base.output)
    return _short_run_statistics(
        keras.Model(base.inputs, outputs, name=base.name), kwargs["weights"]
    )


# Keras's applications keep BatchNormalization statistics with momentum 0.99-0.999, tuned for
# ImageNet-length training: from random weights, a run of a few thousand steps evaluates with
# statistics still mostly at their initial values (measured here: MobileNetV2 on Fashion-MNIST at
# 83% training accuracy scored 10.6% on validation after 3 epochs). tfopt's own models use 0.9.
SCRATCH_BN_MOMENTUM = 0.9


def _short_run_statistics(model: keras.Model, weights) -> keras.Model:
    """Batch-norm momentum ``SCRATCH_BN_MOMENTUM`` when the network starts from random weights (kept
    as Keras sets it for pretrained ones); the model's ``tfopt_notes`` say what changed."""
    if weights is not None:
        return model
    changed = sorted(
        {
            float(l.momentum)
            for l in model.layers
            if isinstance(l, keras.layers.BatchNormalization) and l.momentum != SCRATCH_BN_MOMENTUM
        }
    )
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = SCRATCH_BN_MOMENTUM
    if changed:
        model.tfopt_notes = [
            f"batch-norm momentum {', '.join(f'{m:g}' for m in changed)} -> {SCRATCH_BN_MOMENTUM:g} "
            "(random initial weights: statistics usable after a short run)"
        ]
    return model


def build_factory(
    source: ModelSource, cfg: ModelConfig, input_shape, num_classes: int
) -> keras.Model:
    """``package.module:function(input_shape, num_classes, **cfg.args)``."""
    try:
        fn = resolve(source.target)
    except (ImportError, AttributeError) as e:
        raise ModelError(
            f"model factory {source.target!r} cannot be imported ({e}); give package.module:function "
            "importable from here (check PYTHONPATH)"
        ) from None
    kwargs = parse_model_args(cfg.args)
    _check_kwargs(fn, kwargs, source.target)
    fix = "give a function build(input_shape, num_classes, **args) that returns a tf_keras Model"
    if inspect.isbuiltin(fn) or not callable(fn):
        raise ModelError(f"model factory {source.target!r} is {type(fn).__name__}; {fix}")
    try:
        inspect.signature(fn).bind(tuple(input_shape), num_classes, **kwargs)
    except TypeError as e:
        raise ModelError(
            f"model factory {source.target!r} cannot be called so ({e}); {fix}"
        ) from None
    except ValueError:  # no signature to check: the call decides
        pass
    model = fn(tuple(input_shape), num_classes, **kwargs)
    if not isinstance(model, keras.Model):
        ensure_tf_keras(model)
        raise ModelError(
            f"model factory {source.target!r} returned {type(model).__name__} "
            f"({str(model)[:60]!r}), not a tf_keras Model; {fix}"
        )
    return model


def _check_kwargs(fn, kwargs: dict, what: str, strict: bool = False) -> None:
    """Refuses keyword arguments ``fn`` does not name (``strict``: even when it takes ``**kwargs``,
    which keras.applications functions take only to refuse unknown ones)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: let the call decide
        return
    if not strict and any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(set(kwargs) - set(params))
    if unknown:
        valid = [
            n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        ]
        raise ConfigError(
            f"{what} takes no argument {', '.join(map(repr, unknown))}; "
            f"--model-arg takes: {', '.join(valid)}"
        )


def _call(fn, kwargs: dict, what: str) -> keras.Model:
    try:
        return fn(**kwargs)
    except ValueError as e:  # Keras's own argument checks (e.g. an input too small, a bad alpha)
        raise ModelError(
            f"{what} refuses its arguments: {str(e).strip().splitlines()[0]}"
        ) from None
    except Exception as e:  # noqa: BLE001 - tf_keras' get_file raises a bare Exception
        if not str(e).startswith("URL fetch failure"):
            raise
        reason = str(e).rsplit(" -- ", 1)[-1][:160]
        raise ModelError(
            f"{what} could not download weights={kwargs.get('weights')!r} ({reason}); without a "
            "network, fetch the file on a connected machine (Keras keeps it in ~/.keras/models, "
            "where a later run finds it) or give --model-arg weights=PATH.h5"
        ) from None


# -- what every model goes through ------------------------------------------------------------


def build(cfg: ModelConfig, input_shape: Sequence[int], num_classes: int) -> Built:
    """Builds or loads the model ``cfg`` names for images of ``input_shape`` and ``num_classes`` classes.

    Call it inside ``strategy.scope()``. The result ends in float logits for ``num_classes``
    classes and takes ``input_shape`` images.

    Args:
        cfg: The model section of the config.
        input_shape: ``(H, W, C)`` of the images the data gives (after ``--image-size``/``--channels``).
        num_classes: The dataset's class count.

    Returns:
        The uncompiled tf_keras model and its description for the run record.

    Raises:
        ConfigError: a bad source string or model argument.
        ModelError: the model cannot be built or loaded, does not take these images, or has
            another class count with ``model.head=keep``.
    """
    source = check(cfg)
    model = built_model = ensure_tf_keras(
        resolve(source.spec.builder)(source, cfg, tuple(input_shape), num_classes)
    )
    check_input(model, input_shape, cfg.name)
    model, outputs = to_logits(model)
    fresh = source.form == "applications" and not parse_model_args(cfg.args).get("include_top")
    model, head = fit_head(model, num_classes, cfg.head, cfg.name, new=fresh)
    description = {
        **describe(cfg),
        "outputs": outputs,
        "head": head,
        "notes": getattr(built_model, "tfopt_notes", []),
        "input_shape": [None if d is None else int(d) for d in model.input_shape[1:]],
    }
    return Built(model, description)


def build_model(cfg: ModelConfig, input_shape: Sequence[int], num_classes: int) -> keras.Model:
    """:func:`build`'s model alone (for callers that need no description, e.g. the precision probe)."""
    return build(cfg, input_shape, num_classes).model


def check_input(model: keras.Model, input_shape: Sequence[int], name: str) -> None:
    """Refuses a model whose input does not take the data's images, naming both shapes and the fix.

    Raises:
        ModelError: several inputs, or a fixed dimension that differs from the images'.
    """
    if len(model.inputs) != 1:
        raise ModelError(
            f"model {name!r} has {len(model.inputs)} inputs; tfopt trains image classifiers with one "
            "image input"
        )
    expected = tuple(model.input_shape[1:])
    given = tuple(int(d) for d in input_shape)
    if len(expected) != len(given) or any(
        e is not None and e != g for e, g in zip(expected, given)
    ):
        shown = "x".join("?" if e is None else str(e) for e in expected)
        fix = []
        if len(expected) == 3 and expected[0] is not None and expected[1] is not None:
            fix.append(f"--image-size {expected[0]}x{expected[1]}")
        if len(expected) == 3 and expected[2] in (1, 3) and expected[2] != given[-1]:
            fix.append(f"--channels {expected[2]}")
        raise ModelError(
            f"model {name!r} takes {shown} images but the data gives {'x'.join(map(str, given))}; "
            f"{'resize them with ' + ' and '.join(fix) if fix else 'give a model for these images'}"
        )


def load_stage_input(
    run, input_shape: Sequence[int], num_classes: int, trust: bool = False
) -> keras.Model:
    """The model a later stage (optimize, distill's teachers) starts from, ending in logits.

    Args:
        run: A :class:`tfopt.runs.Run`: a run directory (its ``model.keras`` as it is: tfopt wrote
            it) or a model file (through :func:`build`: checked against the data, a final softmax
            removed, its class count kept).
        input_shape: The data's ``(H, W, C)``.
        num_classes: The data's class count.
        trust: Load files that can run code.

    Raises:
        ModelError: the file cannot be loaded, or does not fit the data.
    """
    if not run.model_file:
        return io.load_model(run.model_path, trust_model=trust)
    return build(
        ModelConfig(name=run.model_file, trust=trust, head="keep"), input_shape, num_classes
    ).model
