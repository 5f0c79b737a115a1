"""Run configuration: frozen dataclasses, strict YAML/JSON loading and CLI overrides.

Configuration is plain data validated here, at the edge; inner code trusts it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tfopt.core.errors import ConfigError
from tfopt.core.specs import MODEL_SOURCES, PRECISIONS, STRATEGIES, parse_model

AUTOTUNE = -1  # the value of tf.data.AUTOTUNE, without importing TensorFlow here

CACHE_MODES = ("memory", "none", "file")
SERVICE_MODES = ("parallel_epochs", "distributed_epoch")
COLLECTIVES = ("auto", "ring", "nccl")
ALLREDUCE_DTYPES = (
    "float32",
    "bfloat16",
)  # runtime.allreduce_dtype: what gradients cross the wire as
PARTITIONERS = ("none", "min_size", "max_size")  # runtime.variable_partitioner
AUGMENTS = ("none", "shift", "crop_flip")
BGR_PREFIX = "bgr:"  # data.normalize=bgr:MEAN/STD reverses the channels (RGB -> BGR) first, as caffe-style models expect
NORMALIZE_PRESETS = {"imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))}
# data.input_scale: what the model's input gets. auto: read from the model's input side
# (tfopt.models.inputs); unit: pixels / 255, then data.normalize; raw: 0-255 pixels as float.
INPUT_SCALES = ("auto", "unit", "raw")
RAW_NORMALIZE = "0/0.00392156862745098"  # data.normalize's way of saying "pixels as they are"


#: Set by ``tfopt launch --data-workers N`` in the training tasks: its dispatcher's ``grpc://`` address.
DATA_SERVICE_ENV = "TFOPT_DATA_SERVICE"
#: ``data.service`` value: read through the dispatcher ``tfopt launch --data-workers N`` started.
LAUNCHED_SERVICE = "launched"


#: The key of a field's :class:`Flag` in its ``dataclasses.field`` metadata.
FLAG = "tfopt.flag"


@dataclass(frozen=True)
class Flag:
    """How a config field appears on every training-like command line.

    :func:`tfopt.cli.add_config_args` makes the options from these: one per field that has a
    Flag, in the help group of its section (or ``group``), its help ending with the default
    ``RunConfig()`` gives the field, its choices shown from the config's own choice lists.

    Attributes:
        name: The option, e.g. ``--batch-size``.
        help: What it sets, in a few words.
        metavar: What its value looks like (choices are shown as ``{a,b}`` without one).
        choices: Values argparse itself enforces (the others are checked by the config).
        group: The help group when not the section's (``training``, ``output``).
        aliases: Other spellings of the option, e.g. ``-o``.
        repeat: The option may be given several times; the field holds the values comma-joined.
        read_by: The values of the section's chooser (its ``CHOSEN_BY`` field, e.g.
            ``distill.technique``) that read this field; empty = every value. The option given
            with another value is refused in one line naming its owners.
    """

    name: str
    help: str
    metavar: str | None = None
    choices: tuple | None = None
    group: str | None = None
    aliases: tuple[str, ...] = ()
    repeat: bool = False
    read_by: tuple[str, ...] = ()


def flag(default: Any = dataclasses.MISSING, name: str = "", help: str = "", *, factory=None, **kw):
    """A config field with a command-line option: ``dataclasses.field`` plus a :class:`Flag`."""
    meta = {FLAG: Flag(name, help, **kw)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def default_data_service() -> str:
    """``data.service``'s default: ``launched`` in a task of ``tfopt launch --data-workers N``, else off."""
    return LAUNCHED_SERVICE if os.environ.get(DATA_SERVICE_ENV) else ""


def default_data_dir() -> str:
    """Returns the data cache directory: ``$TFOPT_DATA_DIR`` or ``~/.cache/tfopt``."""
    return os.environ.get("TFOPT_DATA_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "tfopt"
    )


@dataclass(frozen=True)
class DataConfig:
    """What data to read and how the tf.data pipeline reads it.

    Every parallelism and buffer knob defaults to AUTOTUNE (-1); set a positive int to pin it.
    """

    dataset: str = flag(
        "mnist",
        "--dataset",
        "mnist, fashion_mnist, digits, folder:PATH (one subfolder per class), "
        "tfds:NAME[/CONFIG] or tfrecord:GLOB",
        metavar="SOURCE",
    )
    data_dir: str = flag(
        name="--data-dir",
        help="where datasets are cached as TFRecord shards",
        metavar="DIR",
        factory=default_data_dir,
    )
    num_shards: int = 8
    global_batch_size: int = flag(
        128, "--batch-size", "global batch size (split across replicas)", metavar="N"
    )
    limit: int = flag(
        0, "--limit", "use only the first N records of each split (0 = all)", metavar="N"
    )
    seed: int = 42
    shuffle_buffer: int = 10000
    cache: str = "memory"  # memory | none | file (under data_dir)
    augment: str = (
        "none"  # none | shift (random +-2 px translation) | crop_flip (see tfopt/data/augment.py)
    )
    crop_size: int = (
        0  # crop_flip: side of the random square window (0 = the image's own height x width)
    )
    crop_padding: int = 0  # crop_flip: zero pixels added on each side before the window is taken
    normalize: str = (
        ""  # "" (off) | imagenet | MEAN/STD per channel in [0, 1] units, e.g. 0.5,0.5,0.5/0.25
    )
    input_scale: str = flag(
        "auto",
        "--input-scale",
        "what the model's input gets: auto (read from the model: 0-255 pixels when its first "
        "layers scale them, as Rescaling(1/255) does), unit (pixels / 255, then data.normalize) or "
        "raw (0-255 pixels)",
    )
    interleave_cycle_length: int = AUTOTUNE
    num_parallel_reads: int = AUTOTUNE
    num_parallel_calls: int = AUTOTUNE
    prefetch_buffer: int = AUTOTUNE
    deterministic: bool = False
    ram_budget_mb: int = 0  # 0 = tf.data default
    image_size: str = flag(
        "",
        "--image-size",
        "resize every image to HxW (bilinear; the aspect ratio is not "
        "kept: crop or pad beforehand to keep it; default: as stored)",
        metavar="HxW",
    )
    channels: int = flag(
        0,
        "--channels",
        "convert images to 1 (gray) or 3 (RGB) channels (default: as stored)",
        choices=(1, 3),
    )
    feature_spec: str = ""  # for TFRecord globs: "image=raw:28x28x1,label=int64[,classes=10]"
    verify: bool = flag(
        False,
        "--verify",
        "re-hash every data shard against its manifest (default: size and mtime checks)",
    )
    # tf.data service: "" (off) | local (in-process) | grpc://HOST:PORT (a dispatcher) |
    # launched (the one tfopt launch --data-workers N started; the default in its tasks)
    service: str = flag(
        name="--data-service",
        help="feed the input through the tf.data service: in-process (local), an existing "
        "dispatcher, or the one tfopt launch --data-workers N started (default: launched in "
        "such a launch's tasks, else off; '' turns it off)",
        metavar="local|grpc://HOST:PORT|launched",
        factory=default_data_service,
    )
    service_mode: str = flag(
        "distributed_epoch",
        "--data-service-mode",
        "tf.data service sharing: each batch once across the service's workers, or every "
        "worker the whole stream",
    )


HEADS = ("auto", "keep", "new")


@dataclass(frozen=True)
class ModelConfig:
    """Which model to build or load (see :func:`tfopt.core.specs.parse_model_source` for the forms)."""

    name: str = flag(
        "cnn",
        "--model",
        "the model: " + "; ".join(MODEL_SOURCES.get(n).summary for n in MODEL_SOURCES),
        metavar="NAME|FILE|keras.applications:NAME|module:function",
    )
    dropout: float = 0.25  # built-in models that use dropout
    args: str = ""  # KEY=VALUE,... keyword arguments of keras.applications:NAME or a factory
    trust: bool = flag(
        False,
        "--trust-model",
        "load model files that can run code (Lambda layers, custom objects) and factories named "
        "in files: only if you trust them",
    )
    head: str = flag(
        "auto",
        "--head",
        "the classification layer: auto (replaced when the class count differs), new (always "
        "replaced) or keep",
    )
    freeze_epochs: int = flag(
        0,
        "--freeze-epochs",
        "train only the classification layer for the first N epochs, then every layer "
        "(fine-tuning)",
        metavar="N",
    )


@dataclass(frozen=True)
class RuntimeConfig:
    """Distribution strategy, devices and numeric precision."""

    strategy: str = flag("mirrored", "--strategy", f"one of: {STRATEGIES.help()}")
    cpu_replicas: int = flag(
        2,
        "--cpu-replicas",
        "logical CPU devices for `mirrored` without GPUs; they share the CPU cores, "
        "so on one CPU host mirrored is no faster than one_device",
        metavar="N",
    )
    precision: str = flag(
        "float32", "--precision", f"one of: {PRECISIONS.help()}", group="training"
    )
    collective: str = flag(
        "auto", "--collective", "the multi_worker_mirrored all-reduce (nccl: GPUs)"
    )
    bytes_per_pack: int = flag(
        0,
        "--bytes-per-pack",
        "multi_worker_mirrored: all-reduce the gradients in packs of about this many bytes, "
        "so that the first packs travel while later gradients are computed (default 0: one pack)",
        metavar="BYTES",
    )
    allreduce_dtype: str = flag(
        "float32",
        "--allreduce-dtype",
        "mirrored, multi_worker_mirrored: the dtype gradients are summed across replicas "
        "in; bfloat16 sends half the bytes (default float32)",
    )
    startup_timeout: float = 120.0  # seconds a multi-worker start-up may take before failing
    deterministic: bool = flag(
        False,
        "--deterministic",
        "op determinism and a deterministic input: reruns and resumes give identical weights",
        group="training",
    )
    # parameter_server only: shard large variables over the ps tasks (tfopt.runtime.sharding).
    variable_partitioner: str = "none"  # none | min_size | max_size
    min_shard_bytes: int = 256 << 10  # min_size: no shard smaller than this
    max_shard_bytes: int = 1 << 20  # max_size: no shard larger than this
    max_shards: int = 0  # 0 = one per ps task


@dataclass(frozen=True)
class TrainConfig:
    """The fit loop and what it writes."""

    epochs: int = flag(3, "--epochs", "passes over the training split", metavar="N")
    seed: int = 42  # initial weights (and every other Keras/NumPy/Python random draw) of the run
    learning_rate: float = flag(
        1e-3, "--lr", "learning rate (cosine decay over the run)", metavar="RATE"
    )
    lr_schedule: str = "cosine"  # constant | cosine (decays to 0 over all training steps)
    scale_lr: bool = flag(False, "--scale-lr", "multiply the learning rate by the replica count")
    steps_per_execution: int = flag(
        0,
        "--steps-per-execution",
        "steps per tf.function call (0 = auto, up to 32)",
        metavar="N",
    )
    steps_per_epoch: int = flag(
        0, "--steps-per-epoch", "steps per epoch (0 = one pass over the split)", metavar="N"
    )
    output_dir: str = flag(
        "",
        "--output",
        "run directory to write (default: a new runs/<stage>[-N]; "
        "runs/latest points at the newest run)",
        metavar="DIR",
        group="output",
        aliases=("-o",),
    )
    tensorboard: bool = True
    verbose: int = 1
    backup_every: int = flag(
        0,
        "--backup-every",
        "back up every N steps as well as at each epoch end (0 = epoch ends only; a restart "
        "resumes there)",
        metavar="N",
    )
    nan_retries: int = (
        2  # roll back to the last backup this many times on a non-finite loss, then stop
    )
    nan_lr_factor: float = 0.5  # learning-rate multiplier applied at each roll-back


#: distill.combine: how several teachers' outputs are combined (see tfopt.models.distiller).
COMBINE_MODES = ("probs", "logits")
#: distill.technique: compress while distilling, in one phase under the distillation loss ("none" =
#: plain). tfopt.compress.techniques derives the same list from its registry (a test holds them equal).
DISTILL_TECHNIQUES = ("none", "prune", "qat", "cluster")


@dataclass(frozen=True)
class DistillConfig:
    """How ``tfopt.distill`` distils teachers into a student: the one home of every default.

    The :class:`~tfopt.models.distiller.Distiller` model and pipelines' student stage default to
    these too. Temperature and alpha were chosen on the validation split by
    ``bench/distill_defaults.py`` (``bench/results/distill_defaults.json``).
    """

    #: The field whose value decides which of the others are read (:attr:`Flag.read_by`).
    CHOSEN_BY: typing.ClassVar[str] = "technique"

    temperature: float = flag(1.0, "--temperature", "softmax temperature T, chosen on validation")
    alpha: float = flag(
        0.5,
        "--alpha",
        "weight of the teacher term in [0, 1] (0 = labels only, 1 = teacher only), chosen on "
        "validation",
    )
    teacher_weights: str = flag(
        "equal",
        "--teacher-weights",
        "equal, accuracy (from validation accuracy) or W1,W2,... (one per --teacher)",
    )
    combine: str = flag("probs", "--combine", "combine several teachers' probs or logits")
    features: str = flag(
        "",
        "--feature",
        "feature distillation between two named layers (repeatable)",
        metavar="[I/]TEACHER_LAYER:STUDENT_LAYER",
        repeat=True,
    )
    feature_weight: float = flag(1.0, "--feature-weight", "weight of the feature term")
    technique: str = flag("none", "--technique", "compress while distilling")
    sparsity: float = flag(
        0.75, "--sparsity", "target sparsity of --technique prune", read_by=("prune",)
    )
    clusters: int = flag(
        16, "--clusters", "centroids per kernel of --technique cluster", read_by=("cluster",)
    )
    baseline: str = flag(
        "",
        "--baseline",
        "run of the same student trained without a teacher (the report gives the gap closed)",
        metavar="RUN",
    )


def parse_features(text: str) -> tuple[tuple[str, str, int], ...]:
    """Parses ``distill.features``: comma-separated ``[TEACHER_INDEX/]TEACHER_LAYER:STUDENT_LAYER``.

    Raises:
        ConfigError: an entry of another form (one line naming it and an example).
    """
    out = []
    for entry in filter(None, (e.strip() for e in text.split(","))):
        index, sep, rest = entry.partition("/")
        if not sep:
            index, rest = "0", entry
        teacher_layer, colon, student_layer = rest.partition(":")
        if not colon or not teacher_layer or not student_layer or not index.isdigit():
            raise ConfigError(
                f"--feature {entry!r} is not [TEACHER_INDEX/]TEACHER_LAYER:STUDENT_LAYER; "
                "e.g. --feature pool0:stem_relu"
            )
        out.append((teacher_layer, student_layer, int(index)))
    return tuple(out)


@dataclass(frozen=True)
class RunConfig:
    """Everything one ``python -m tfopt.train`` run needs."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)

    def to_dict(self, stage: str | None = None) -> dict:
        """Returns the config as nested plain dicts (JSON-serializable).

        Args:
            stage: Only the sections this stage reads (:data:`STAGE_SECTIONS`); None = all.
        """
        out = dataclasses.asdict(self)
        if stage is None:
            return out
        return {k: v for k, v in out.items() if k in STAGE_SECTIONS.get(stage, TRAINING_SECTIONS)}


#: The sections every training-like stage reads.
TRAINING_SECTIONS = ("data", "model", "runtime", "train")
#: The sections each stage reads: its run record and its resume fingerprint hold only these.
STAGE_SECTIONS = {
    "train": TRAINING_SECTIONS,
    "distill": (*TRAINING_SECTIONS, "distill"),
    "optimize": TRAINING_SECTIONS,
}


_CHOICES = {
    ("runtime", "strategy"): STRATEGIES.names(),
    ("runtime", "precision"): PRECISIONS.names(),
    ("runtime", "collective"): COLLECTIVES,
    ("runtime", "allreduce_dtype"): ALLREDUCE_DTYPES,
    ("runtime", "variable_partitioner"): PARTITIONERS,
    ("data", "cache"): CACHE_MODES,
    ("data", "augment"): AUGMENTS,
    ("data", "service_mode"): SERVICE_MODES,
    ("train", "lr_schedule"): ("constant", "cosine"),
    ("model", "head"): HEADS,
    ("data", "channels"): (0, 1, 3),
    ("data", "input_scale"): INPUT_SCALES,
    ("distill", "combine"): COMBINE_MODES,
    ("distill", "technique"): DISTILL_TECHNIQUES,
}


def choices_of(section: str, key: str) -> tuple | None:
    """The values ``section.key`` may take, when it is a choice (None otherwise)."""
    choices = _CHOICES.get((section, key))
    return tuple(choices) if choices is not None else None


def _field_types(cls) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def coerce(section: str, key: str, value: Any, typ: Any) -> Any:
    """``value`` (from YAML, JSON or a ``--set`` string) as type ``typ`` for ``section.key``.

    Raises:
        ConfigError: the value cannot be read as that type (one line naming it).
    """
    where = f"{section}.{key}"
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{where}={value!r} is not a boolean; use true or false")
    if typ in (int, float):
        if isinstance(value, bool):
            raise ConfigError(f"{where}={value!r} is not a number; give a {typ.__name__}")
        try:
            out = typ(value)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(
                f"{where}={value!r} is not {'an int' if typ is int else 'a float'}; give a number"
            ) from None
        if typ is float and not math.isfinite(out):
            raise ConfigError(f"{where}={value!r} is not a finite number; give a number")
        if typ is int and isinstance(value, float) and value != out:
            raise ConfigError(f"{where}={value!r} is not a whole number; give an int")
        return out
    if not isinstance(value, str):
        raise ConfigError(f"{where}={value!r} is not a string; give text")
    return value


def parse_normalize(text: str) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """Reads ``data.normalize``: ``""`` -> None, ``imagenet`` or ``MEAN/STD`` -> (means, stds).

    A ``bgr:`` prefix reverses the channels first (``MEAN``/``STD`` then in BGR order; see
    ``reverses_channels``). ``MEAN`` and ``STD`` are comma-separated per-channel values in units of the [0, 1] image (one
    value applies to every channel), e.g. ``0.485,0.456,0.406/0.229,0.224,0.225``.

    Raises:
        ConfigError: malformed text or a standard deviation that is not > 0.
    """
    text = text.strip()
    if text.startswith(BGR_PREFIX):
        text = text[len(BGR_PREFIX) :]
    if not text:
        return None
    if text in NORMALIZE_PRESETS:
        return NORMALIZE_PRESETS[text]
    fix = (
        "give MEAN/STD per channel, e.g. 0.485,0.456,0.406/0.229,0.224,0.225, or one of "
        + ", ".join(NORMALIZE_PRESETS)
    )
    mean, sep, std = text.partition("/")
    try:
        values = tuple(tuple(float(v) for v in part.split(",")) for part in (mean, std))
    except ValueError:
        raise ConfigError(f"data.normalize={text!r} is not valid; {fix}") from None
    if (
        not sep
        or "/" in std
        or not all(v == v and abs(v) != float("inf") for part in values for v in part)
    ):
        raise ConfigError(f"data.normalize={text!r} is not valid; {fix}")
    if min(values[1]) <= 0:
        raise ConfigError(
            f"data.normalize={text!r} has a standard deviation <= 0; every STD value must be > 0"
        )
    return values


#: The largest side ``data.image_size`` takes (satellite tiles and medical scans stay below it).
MAX_IMAGE_SIDE = 8192


def parse_image_size(text: str) -> tuple[int, int] | None:
    """Reads ``data.image_size``: ``""`` -> None, ``HxW`` (or one number for a square) -> (H, W).

    Raises:
        ConfigError: not ``HxW`` with positive whole numbers.
    """
    text = text.strip().lower()
    if not text:
        return None
    parts = text.split("x")
    if len(parts) == 1:
        parts = parts * 2
    try:
        h, w = (int(p) for p in parts)
    except ValueError:
        h = w = 0
    if len(parts) != 2 or h < 1 or w < 1:
        raise ConfigError(
            f"data.image_size={text[:40]!r} is not valid; give HEIGHTxWIDTH in pixels, e.g. 96x96"
        )
    if max(h, w) > MAX_IMAGE_SIDE:
        raise ConfigError(
            f"data.image_size={text[:40]!r} is larger than {MAX_IMAGE_SIDE} pixels a side (one "
            f"image would take {4 * 3 * h * w / 2**30:.1f} GiB as float32); give e.g. 224x224"
        )
    return h, w


def feed_normalize(data: DataConfig) -> str:
    """The ``data.normalize`` the input pipeline applies: :data:`RAW_NORMALIZE` (pixels x 255 on
    [0, 1] images, so 0-255 again) for ``data.input_scale=raw``, else ``data.normalize``."""
    return RAW_NORMALIZE if data.input_scale == "raw" else data.normalize


def is_raw_normalize(normalize: str) -> bool:
    """True when ``data.normalize`` gives the model 0-255 pixels (mean 0, std 1/255 on every channel)."""
    values = parse_normalize(normalize) if not reverses_channels(normalize) else None
    return (
        bool(values)
        and all(abs(m) < 1e-9 for m in values[0])
        and all(abs(s * 255.0 - 1.0) < 1e-6 for s in values[1])
    )


def reverses_channels(normalize: str) -> bool:
    """True when ``data.normalize`` starts with ``bgr:``: the channels are reversed before normalizing."""
    return normalize.strip().startswith(BGR_PREFIX)


def _validate_augment(data: DataConfig) -> None:
    for key in ("crop_size", "crop_padding"):
        value = getattr(data, key)
        if value < 0:
            raise ConfigError(f"data.{key}={value} must be >= 0; give a number of pixels")
        if value and data.augment != "crop_flip":
            raise ConfigError(
                f"data.{key}={value} has no effect with data.augment={data.augment}; "
                f"set data.augment=crop_flip or leave data.{key} at 0"
            )
    parse_normalize(data.normalize)
    if data.input_scale == "raw" and data.normalize:
        raise ConfigError(
            f"data.input_scale=raw gives the model 0-255 pixels, but data.normalize={data.normalize!r} "
            "also scales them; leave data.normalize empty, or use --input-scale unit with it"
        )


def _validate(cfg: RunConfig) -> RunConfig:
    _check_values(cfg)
    _check_strategy_fit(cfg)
    _check_ranges(cfg)
    _check_distill(cfg.distill)
    return cfg


def reads(section: Any, key: str) -> bool:
    """Whether ``section`` (a config section's value) reads its field ``key``: the field's
    :attr:`Flag.read_by` holds the value of the section's ``CHOSEN_BY`` field, or is empty."""
    f = next(f for f in dataclasses.fields(section) if f.name == key)
    flag_ = f.metadata.get(FLAG)
    if flag_ is None or not flag_.read_by:
        return True
    return getattr(section, type(section).CHOSEN_BY) in flag_.read_by


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


def _check_values(cfg: RunConfig) -> None:
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


def _check_strategy_fit(cfg: RunConfig) -> None:
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
    if not 0 <= cfg.model.freeze_epochs <= cfg.train.epochs:
        raise ConfigError(
            f"model.freeze_epochs={cfg.model.freeze_epochs} must be in [0, train.epochs="
            f"{cfg.train.epochs}]; give the number of first epochs that train the head alone"
        )


def _check_ranges(cfg: RunConfig) -> None:
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


def from_dict(raw: Mapping[str, Any], base: RunConfig | None = None) -> RunConfig:
    """Builds a RunConfig from nested dicts, rejecting unknown sections and keys.

    Args:
        raw: ``{"data": {...}, "model": {...}, "runtime": {...}, "train": {...}}``; any subset.
        base: Values not given in ``raw`` come from here (defaults when None).

    Returns:
        A validated, frozen RunConfig.

    Raises:
        ConfigError: unknown section or key (the message lists the valid ones), wrong type
            or a value outside its valid range.
    """
    base = base or RunConfig()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"a config must be a mapping of sections, got {type(raw).__name__}")
    sections = {f.name: getattr(base, f.name) for f in dataclasses.fields(RunConfig)}
    for section, values in raw.items():
        if section not in sections:
            raise ConfigError(
                f"unknown config section {section!r}; valid sections: {', '.join(sections)}"
            )
        if values is None:
            continue
        if not isinstance(values, Mapping):
            raise ConfigError(
                f"config section {section!r} must be a mapping of keys, got {values!r}"
            )
        current = sections[section]
        types = _field_types(type(current))
        updates = {}
        for key, value in values.items():
            if key not in types:
                raise ConfigError(
                    f"unknown key {section}.{key!s}; valid keys in {section!r}: {', '.join(types)}"
                )
            updates[key] = coerce(section, key, value, types[key])
        sections[section] = dataclasses.replace(current, **updates)
    return _validate(RunConfig(**sections))


#: The largest config file :func:`load` reads.
MAX_CONFIG_FILE_BYTES = 1024 * 1024


def load(path: str, base: RunConfig | None = None) -> RunConfig:
    """Loads a YAML (.yaml/.yml) or JSON (.json) config file strictly.

    Args:
        path: The file to read.
        base: Defaults for keys the file does not set.

    Returns:
        A validated RunConfig.

    Raises:
        ConfigError: the file is missing, unparsable, or has unknown keys or bad values.
    """
    if not os.path.isfile(path):
        raise ConfigError(
            f"config file {path!r} does not exist; give the path of a .yaml or .json file"
        )
    if not path.endswith((".yaml", ".yml", ".json")):
        raise ConfigError(f"config file {path!r} must end in .yaml, .yml or .json")
    import yaml

    size = os.path.getsize(path)
    if size > MAX_CONFIG_FILE_BYTES:
        raise ConfigError(
            f"config file {path!r} is {size} bytes (at most {MAX_CONFIG_FILE_BYTES}); a config "
            "is a few hundred lines: give the right file"
        )
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError:
        raise ConfigError(
            f"config file {path!r} is not UTF-8 text; give a .yaml or .json file"
        ) from None
    try:
        raw = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        first = str(e).strip().splitlines()[0]
        raise ConfigError(
            f"config file {path!r} cannot be parsed: {first}; fix its syntax"
        ) from None
    return from_dict(raw or {}, base)


def apply_overrides(cfg: RunConfig, overrides: list[str]) -> RunConfig:
    """Applies ``section.key=value`` overrides (from ``--set``) on top of a config.

    Args:
        cfg: The config to start from.
        overrides: Strings like ``"data.cache=none"``.

    Returns:
        A new validated RunConfig.

    Raises:
        ConfigError: malformed override, unknown key or bad value.
    """
    raw: dict[str, dict[str, str]] = {}
    for item in overrides:
        name, sep, value = item.partition("=")
        section, dot, key = name.strip().partition(".")
        if not sep or not dot or not key:
            raise ConfigError(
                f"override {item!r} is not of the form section.key=value (e.g. data.cache=none)"
            )
        raw.setdefault(section, {})[key] = value.strip()
    return from_dict(raw, cfg)
