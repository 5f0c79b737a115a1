"""Registries of the choices a user names with one string: strategies, precision policies, model sources.

Plain data, no TensorFlow: the config validates against them, the CLIs derive their choices
and help from them, and TF_CONFIG is checked against a strategy's roles before TensorFlow
starts. Each strategy entry names the function that builds it (``module:function``), so adding
a strategy touches this registry and the module that implements it, nothing else.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from tfopt.core.errors import ConfigError

T = TypeVar("T")

STAGES = (
    "train",
    "distill",
    "optimize",
    "export",
    "federated",
)  # the stages that write a run directory (run.json)


class Registry(Generic[T]):
    """Named specs in a fixed order; an unknown name is a one-line error listing the valid ones.

    Args:
        key: How the choice is called in configs and messages (e.g. ``runtime.strategy``).
        specs: The entries; each has a ``name`` and a one-line ``summary``.
    """

    def __init__(self, key: str, specs: Iterable[T]):
        self.key = key
        self._specs = {s.name: s for s in specs}

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def names(self) -> tuple[str, ...]:
        """The valid names, in registry order."""
        return tuple(self._specs)

    def get(self, name: str) -> T:
        """The spec called ``name``.

        Raises:
            ConfigError: unknown name (the message lists the valid ones).
        """
        if name not in self._specs:
            raise ConfigError(
                f"{self.key}={name!r} is not valid; choose one of {', '.join(self._specs)}"
            )
        return self._specs[name]

    def help(self) -> str:
        """``name (summary); ...`` for a CLI's --help."""
        return "; ".join(f"{s.name} ({s.summary})" for s in self._specs.values())


def resolve(path: str) -> Callable:
    """Imports ``module:function`` and returns the function."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class StrategySpec:
    """What tfopt must know about a tf.distribute strategy before building it.

    Attributes:
        name: The string a user gives (``--strategy``).
        summary: One line for --help.
        factory: ``module:function(runtime, cluster, **kw) -> tf.distribute.Strategy``.
        multi_process: Runs as several processes, each with its own TF_CONFIG.
        needs_servers: ``worker``/``ps`` tasks only run TensorFlow servers; the chief coordinates.
        first_collective: Must be created before any other TensorFlow op; a first all-reduce
            proves every peer is up.
        required_roles: TF_CONFIG roles the strategy cannot run without (when TF_CONFIG is set,
            or always when ``needs_servers``).
        forbidden_roles: TF_CONFIG roles it refuses.
        one_process: Why a single-process strategy cannot take a cluster, when there is more to
            say than that it runs in one process.
    """

    name: str
    summary: str
    factory: str
    multi_process: bool = False
    needs_servers: bool = False
    first_collective: bool = False
    required_roles: tuple[str, ...] = ()
    forbidden_roles: tuple[str, ...] = ()
    one_process: str = ""

    def build(self, runtime, cluster, **kwargs):
        """Builds the strategy (imports TensorFlow)."""
        return resolve(self.factory)(runtime, cluster, **kwargs)


@dataclass(frozen=True)
class PrecisionSpec:
    """A Keras mixed-precision policy.

    Attributes:
        name: The policy name (``--precision``).
        summary: One line for --help.
        compute_dtype: The dtype layers compute in (variables stay float32).
        loss_scaling: Gradients need loss scaling (float16's narrow exponent range).
        hardware: Where it pays.
    """

    name: str
    summary: str
    compute_dtype: str
    loss_scaling: bool = False
    hardware: str = ""


_STRATEGY = "tfopt.runtime.strategy"

STRATEGIES: Registry[StrategySpec] = Registry(
    "runtime.strategy",
    (
        StrategySpec("one_device", "one device: the GPU, else the CPU", f"{_STRATEGY}:one_device"),
        StrategySpec(
            "mirrored",
            "replicas on the local GPUs, or on logical CPU devices",
            f"{_STRATEGY}:mirrored",
        ),
        StrategySpec(
            "multi_worker_mirrored",
            "synchronous replicas on several workers (TF_CONFIG)",
            f"{_STRATEGY}:multi_worker",
            multi_process=True,
            first_collective=True,
            forbidden_roles=("ps",),
        ),
        StrategySpec(
            "parameter_server",
            "asynchronous workers and parameter servers driven by a chief (TF_CONFIG)",
            f"{_STRATEGY}:parameter_server",
            multi_process=True,
            needs_servers=True,
            required_roles=("chief", "worker", "ps"),
        ),
        StrategySpec(
            "pipeline",
            "GPipe: the layers in --stages stages on as many devices, each batch in "
            "--microbatches parts",
            f"{_STRATEGY}:pipeline",
            one_process="its stages are placed on this process's devices, and TensorFlow's "
            "multi-worker strategies mirror every variable onto each replica's one device, so "
            "pipeline stages inside MultiWorkerMirrored workers cannot be expressed",
        ),
    ),
)

PRECISIONS: Registry[PrecisionSpec] = Registry(
    "runtime.precision",
    (
        PrecisionSpec("float32", "full precision", "float32"),
        PrecisionSpec(
            "mixed_float16",
            "float16 math, float32 variables, loss scaling (GPUs)",
            "float16",
            loss_scaling=True,
            hardware="GPUs with Tensor Cores",
        ),
        PrecisionSpec(
            "mixed_bfloat16",
            "bfloat16 math, float32 variables (CPUs with AVX512-BF16/AMX, TPUs)",
            "bfloat16",
            hardware="CPUs with AVX512_BF16 or AMX, TPUs",
        ),
        # Not a Keras policy: the Job times a few training steps under each candidate and sets the
        # faster one (tfopt.runtime.autoprecision) before the stage builds its model.
        PrecisionSpec(
            "auto",
            "time a few training steps of float32 and mixed_bfloat16 (mixed_float16 too on a GPU) "
            "on this machine and model, keep the faster",
            "",
        ),
    ),
)

AUTO_PRECISION = "auto"


@dataclass(frozen=True)
class ModelSourceSpec:
    """One form of ``--model``: how a model string names a model, and what builds it.

    Attributes:
        name: The form (``builtin``, ``file``, ``applications``, ``factory``).
        summary: One line for --help and errors, with the form's syntax.
        builder: ``module:function(source, model_cfg, input_shape, num_classes) -> keras.Model``.
        takes_args: Accepts ``--model-arg KEY=VALUE`` keyword arguments.
    """

    name: str
    summary: str
    builder: str
    takes_args: bool = False


@dataclass(frozen=True)
class ModelSource:
    """A parsed ``--model`` string: its form and what it names (a name, a path, ``module:function``)."""

    text: str
    form: str
    target: str

    @property
    def spec(self) -> ModelSourceSpec:
        """The registry entry of this source's form."""
        return MODEL_SOURCES.get(self.form)


_SOURCES = "tfopt.models.sources"
APPLICATIONS_PREFIX = "keras.applications:"
MODEL_FILE_SUFFIXES = (".keras", ".h5", ".hdf5")

MODEL_SOURCES: Registry[ModelSourceSpec] = Registry(
    "model.name",
    (
        ModelSourceSpec(
            "builtin",
            "a built-in model name (cnn, small_cnn, tiny_cnn, mlp, mobilenet_tiny, wide_cnn)",
            f"{_SOURCES}:build_builtin",
        ),
        ModelSourceSpec(
            "file",
            "a model file: PATH.keras, PATH.h5 or a SavedModel directory",
            f"{_SOURCES}:build_file",
        ),
        ModelSourceSpec(
            "applications",
            "keras.applications:NAME, e.g. keras.applications:MobileNetV2",
            f"{_SOURCES}:build_application",
            takes_args=True,
        ),
        ModelSourceSpec(
            "factory",
            "a Python factory package.module:function(input_shape, num_classes)",
            f"{_SOURCES}:build_factory",
            takes_args=True,
        ),
    ),
)

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_FACTORY = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*\Z")


def parse_model_source(text: str) -> ModelSource:
    """Reads a ``--model`` string into its form, without importing anything.

    ``keras.applications:NAME`` is an application; a path that exists, contains a path separator
    or ends in ``.keras``/``.h5`` is a file; ``package.module:function`` is a factory; a bare
    identifier is a built-in name (checked against the model registry when it is built).

    Raises:
        ConfigError: the string has none of these forms (the message lists them).
    """
    text = text.strip()
    if text.startswith(APPLICATIONS_PREFIX):
        name = text[len(APPLICATIONS_PREFIX) :]
        if _IDENTIFIER.match(name):
            return ModelSource(text, "applications", name)
    elif os.path.exists(text) or os.sep in text or text.endswith(MODEL_FILE_SUFFIXES):
        return ModelSource(text, "file", os.path.abspath(os.path.expanduser(text)))
    elif _FACTORY.match(text):
        return ModelSource(text, "factory", text)
    elif _IDENTIFIER.match(text):
        return ModelSource(text, "builtin", text)
    forms = "; ".join(MODEL_SOURCES.get(n).summary for n in MODEL_SOURCES)
    raise ConfigError(f"model.name={text!r} is not a model source; give {forms}")


def parse_model(name: str, args: str = "") -> tuple[ModelSource, dict[str, object]]:
    """Reads ``model.name`` and ``model.args`` together.

    Raises:
        ConfigError: a bad source or argument, or arguments for a form that takes none.
    """
    source = parse_model_source(name)
    kwargs = parse_model_args(args)
    if kwargs and not source.spec.takes_args:
        raise ConfigError(
            f"model.args={args!r}: the model {name!r} takes no arguments; "
            "--model-arg applies to keras.applications:NAME and package.module:function"
        )
    return source, kwargs


def parse_model_args(text: str) -> dict[str, object]:
    """Reads ``model.args`` (``KEY=VALUE,...``, from repeated ``--model-arg``) into keyword arguments.

    Values are Python literals where they parse as one (``0.35``, ``None``, ``True``, ``(1, 2)``),
    else strings (``weights=imagenet``, ``weights=/path/to/file.h5``).

    Raises:
        ConfigError: an item is not ``KEY=VALUE`` with an identifier key, or a key repeats.
    """
    out: dict[str, object] = {}
    for item in filter(None, (part.strip() for part in _split_args(text))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not _IDENTIFIER.match(key):
            raise ConfigError(
                f"model argument {item!r} is not KEY=VALUE; write e.g. --model-arg alpha=0.35"
            )
        if key in out:
            raise ConfigError(f"model argument {key!r} is given twice; give it once")
        value = value.strip()
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            out[key] = value  # not a Python literal (or one too deep to read): the text itself
    return out


def _split_args(text: str) -> list[str]:
    """Splits at commas outside brackets, so that ``input_shape=(96, 96, 3)`` stays one item."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts
