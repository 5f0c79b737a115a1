"""The sections every training-like stage reads: data, model, runtime, train."""

from __future__ import annotations

import typing
from dataclasses import dataclass

from tfopt.config.fields import AUTOTUNE, default_data_dir, default_data_service, flag
from tfopt.core.specs import MODEL_SOURCES, PRECISIONS, STRATEGIES


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
    normalize: str = flag(
        "",
        "--normalize",
        "the model's input scaling of [0, 1] pixels: imagenet, MEAN/STD per channel (e.g. 0.5/0.5 "
        "for [-1, 1]) or bgr:MEAN/STD (see docs/your_model.md); default: none",
        metavar="MEAN/STD",
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

    CHOSEN_BY: typing.ClassVar[str] = "strategy"  # the pipeline fields are read by `pipeline` only

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
    stages: int = flag(
        2,
        "--stages",
        "K, the contiguous stages the model's layers are split into, each on a device of its "
        "own (the GPUs, else K logical CPU devices)",
        metavar="K",
        read_by=("pipeline",),
    )
    microbatches: int = flag(
        0,
        "--microbatches",
        "M, the parts each batch is split into (0 = 4K, where GPipe's idle fraction "
        "(K-1)/(M+K-1) is under 1/5)",
        metavar="M",
        read_by=("pipeline",),
    )
    schedule: str = flag(
        "gpipe",
        "--pipeline-schedule",
        "gpipe: every forward pass, then every backward pass; 1f1b: each stage alternates one "
        "forward and one backward pass, holding at most K micro-batches' activations",
        read_by=("pipeline",),
    )
    remat: bool = flag(
        False,
        "--remat",
        "recompute each stage's activations in the backward pass instead of keeping them",
        read_by=("pipeline",),
    )
    balance: str = flag(
        "time",
        "--balance",
        "what the stages are balanced by: each piece's measured seconds, parameters or multiply-adds",
        read_by=("pipeline",),
    )
    cut_after: str = flag(
        "",
        "--cut-after",
        "cut after these layers (K-1 names, comma-separated); default: where --balance says",
        metavar="LAYERS",
        read_by=("pipeline",),
    )
    device_memory_mib: float = flag(
        0.0,
        "--device-memory-mib",
        "each stage's device memory budget (0 = none): on GPUs TensorFlow's limit of each "
        "stage's GPU; everywhere, a split whose stage would peak over it (its weights, their "
        "gradients and the activations it holds, measured on a batch) is refused before training",
        metavar="MIB",
        read_by=("pipeline",),
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
