"""Shared command-line plumbing: one-line errors, exit code 2, config flags."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Collection

from tfopt import config as config_lib
from tfopt import flagcheck, log
from tfopt.errors import ConfigError, TfoptError
from tfopt.specs import MODEL_SOURCES, PRECISIONS, STRATEGIES


class ArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr and exit code 2."""

    def error(self, message):  # noqa: D102 - argparse hook
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _choices(names) -> str:
    return "{" + ",".join(names) + "}"


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """Adds the flags every training-like command shares, in groups (configuration, data, model,
    distribution, training, output), each flag's help ending with its default from
    :class:`~tfopt.config.RunConfig` when it has one."""
    g = parser.add_argument_group("configuration")
    g.add_argument(
        "--config",
        metavar="FILE",
        help="YAML or JSON config file (a run's config.yaml too); flags override its values",
    )
    g.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override any config value, e.g. --set data.cache=none (repeatable)",
    )
    g.add_argument(
        "--print-config", action="store_true", help="print the resolved config as JSON and exit"
    )

    g = parser.add_argument_group("data")
    g.add_argument(
        "--dataset",
        metavar="SOURCE",
        help="mnist, fashion_mnist, digits, folder:PATH (one subfolder per class), "
        "tfds:NAME[/CONFIG] or tfrecord:GLOB",
    )
    g.add_argument(
        "--image-size",
        metavar="HxW",
        help="resize every image to HxW (bilinear; the aspect ratio is not "
        "kept: crop or pad beforehand to keep it; default: as stored)",
    )
    g.add_argument(
        "--channels",
        type=int,
        choices=(1, 3),
        help="convert images to 1 (gray) or 3 (RGB) channels (default: as stored)",
    )
    g.add_argument(
        "--input-scale",
        metavar=_choices(config_lib.INPUT_SCALES),
        help="what the model's input gets: auto (read from the model: 0-255 pixels when its first "
        "layers scale them, as Rescaling(1/255) does), unit (pixels / 255, then data.normalize) or "
        "raw (0-255 pixels)",
    )
    g.add_argument("--data-dir", metavar="DIR", help="where datasets are cached as TFRecord shards")
    g.add_argument(
        "--limit",
        type=int,
        metavar="N",
        help="use only the first N records of each split (0 = all)",
    )
    g.add_argument(
        "--batch-size", type=int, metavar="N", help="global batch size (split across replicas)"
    )
    g.add_argument(
        "--data-service",
        metavar="local|grpc://HOST:PORT|launched",
        help="feed the input through the tf.data service: in-process (local), an existing "
        "dispatcher, or the one tfopt launch --data-workers N started (default: launched in "
        "such a launch's tasks, else off; '' turns it off)",
    )
    g.add_argument(
        "--data-service-mode",
        metavar=_choices(config_lib.SERVICE_MODES),
        help="tf.data service sharing: each batch once across the service's workers, or every worker the whole stream",
    )
    g.add_argument(
        "--verify",
        action="store_true",
        default=None,
        help="re-hash every data shard against its manifest (default: size and mtime checks)",
    )

    g = parser.add_argument_group("model")
    g.add_argument(
        "--model",
        metavar="NAME|FILE|keras.applications:NAME|module:function",
        help="the model: " + "; ".join(MODEL_SOURCES.get(n).summary for n in MODEL_SOURCES),
    )
    g.add_argument(
        "--model-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a keyword argument of keras.applications:NAME or a factory, e.g. alpha=0.35, "
        "weights=None (default), weights=imagenet (downloads), weights=PATH (repeatable)",
    )
    g.add_argument(
        "--head",
        metavar=_choices(config_lib.HEADS),
        help="the classification layer: auto (replaced when the class count differs), new (always replaced) or keep",
    )
    g.add_argument(
        "--freeze-epochs",
        type=int,
        metavar="N",
        help="train only the classification layer for the first N epochs, then every layer (fine-tuning)",
    )

    g = parser.add_argument_group("distribution")
    g.add_argument("--strategy", metavar=_choices(STRATEGIES), help=f"one of: {STRATEGIES.help()}")
    g.add_argument(
        "--cpu-replicas",
        type=int,
        metavar="N",
        help="logical CPU devices for `mirrored` without GPUs; they share the CPU cores, "
        "so on one CPU host mirrored is no faster than one_device",
    )
    g.add_argument(
        "--collective",
        metavar=_choices(config_lib.COLLECTIVES),
        help="the multi_worker_mirrored all-reduce (nccl: GPUs)",
    )
    g.add_argument(
        "--bytes-per-pack",
        type=int,
        metavar="BYTES",
        help="multi_worker_mirrored: all-reduce the gradients in packs of about this many bytes, "
        "so that the first packs travel while later gradients are computed (default 0: one pack)",
    )
    g.add_argument(
        "--allreduce-dtype",
        metavar=_choices(config_lib.ALLREDUCE_DTYPES),
        help="mirrored, multi_worker_mirrored: the dtype gradients are summed across replicas "
        "in; bfloat16 sends half the bytes (default float32)",
    )
    add_shard_variables(g)

    g = parser.add_argument_group("training")
    g.add_argument("--precision", metavar=_choices(PRECISIONS), help=f"one of: {PRECISIONS.help()}")
    g.add_argument("--epochs", type=int, metavar="N", help="passes over the training split")
    g.add_argument(
        "--lr", type=float, metavar="RATE", help="learning rate (cosine decay over the run)"
    )
    g.add_argument(
        "--scale-lr",
        action="store_true",
        default=None,
        help="multiply the learning rate by the replica count",
    )
    g.add_argument(
        "--steps-per-epoch",
        type=int,
        metavar="N",
        help="steps per epoch (0 = one pass over the split)",
    )
    g.add_argument(
        "--steps-per-execution",
        type=int,
        metavar="N",
        help="steps per tf.function call (0 = auto, up to 32)",
    )
    g.add_argument(
        "--backup-every",
        type=int,
        metavar="N",
        help="back up every N steps as well as at each epoch end (0 = epoch ends only; a restart resumes there)",
    )
    g.add_argument(
        "--deterministic",
        action="store_true",
        default=None,
        help="op determinism and a deterministic input: reruns and resumes give identical weights",
    )

    g = parser.add_argument_group("output")
    g.add_argument(
        "--output",
        "-o",
        metavar="DIR",
        help="run directory to write (default: a new runs/<stage>[-N]; "
        "runs/latest points at the newest run)",
    )
    g.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a finished run at -o, or discard an unfinished run of other settings there",
    )
    add_verbosity(g, "no progress bar")
    _add_defaults(parser)


def group(parser: argparse.ArgumentParser, title: str):
    """The argument group of ``parser`` titled ``title`` (one :func:`add_config_args` made)."""
    return next(g for g in parser._action_groups if g.title == title)


def _add_defaults(parser: argparse.ArgumentParser) -> None:
    """Ends the help of every config flag with the default RunConfig gives it."""
    defaults = config_lib.RunConfig()
    for action in parser._actions:
        if action.dest not in _FLAG_KEYS or not action.help or "default" in action.help:
            continue
        section, key = _FLAG_KEYS[action.dest]
        value = getattr(getattr(defaults, section), key)
        if value not in ("", None):
            shown = "off" if value is False else "on" if value is True else value
            action.help += f" (default: {shown})"


_FLAG_KEYS = {
    "strategy": ("runtime", "strategy"),
    "precision": ("runtime", "precision"),
    "cpu_replicas": ("runtime", "cpu_replicas"),
    "collective": ("runtime", "collective"),
    "bytes_per_pack": ("runtime", "bytes_per_pack"),
    "allreduce_dtype": ("runtime", "allreduce_dtype"),
    "dataset": ("data", "dataset"),
    "data_dir": ("data", "data_dir"),
    "limit": ("data", "limit"),
    "batch_size": ("data", "global_batch_size"),
    "model": ("model", "name"),
    "epochs": ("train", "epochs"),
    "lr": ("train", "learning_rate"),
    "scale_lr": ("train", "scale_lr"),
    "steps_per_epoch": ("train", "steps_per_epoch"),
    "steps_per_execution": ("train", "steps_per_execution"),
    "output": ("train", "output_dir"),
    "verify": ("data", "verify"),
    "backup_every": ("train", "backup_every"),
    "deterministic": ("runtime", "deterministic"),
    "data_service": ("data", "service"),
    "data_service_mode": ("data", "service_mode"),
    "image_size": ("data", "image_size"),
    "channels": ("data", "channels"),
    "input_scale": ("data", "input_scale"),
    "head": ("model", "head"),
    "trust_model_file": ("model", "trust"),
    "freeze_epochs": ("model", "freeze_epochs"),
}


def config_from_args(args: argparse.Namespace) -> config_lib.RunConfig:
    """Resolves the config: defaults < --config file < --set overrides < dedicated flags.

    Raises:
        ConfigError: a bad value, or a ``package.module:function`` model the ``--config`` file
            names (code read from a file) without ``--trust-model``.
    """
    from_file = config_lib.load(args.config) if args.config else None
    cfg = config_lib.apply_overrides(from_file or config_lib.RunConfig(), args.set)
    raw: dict[str, dict] = {}
    for flag, (section, key) in _FLAG_KEYS.items():
        value = getattr(args, flag, None)
        if value is not None:
            raw.setdefault(section, {})[key] = value
    raw.setdefault("runtime", {}).update(shard_variables(args))
    if getattr(args, "model_arg", None):
        raw.setdefault("model", {})["args"] = ",".join(args.model_arg)
    if getattr(args, "quiet", False):
        raw.setdefault("train", {})["verbose"] = 0
    cfg = config_lib.from_dict(raw, cfg)
    if from_file is not None and cfg.model.name == from_file.model.name:
        # typed on the command line (--model, --set model.name=...) it is the user's intent
        typed = getattr(args, "model", None) is not None or any(
            s.strip().startswith("model.name=") for s in (args.set or [])
        )
        if not typed:
            check_code_trust(cfg.model, f"--config {args.config}")
    return cfg


def check_code_trust(model: config_lib.ModelConfig, where: str) -> None:
    """Refuses a ``package.module:function`` model read from a file unless ``model.trust`` allows code.

    A factory string is code: importing its module runs it. Typed on the command line it is the
    user's intent; read from a file (a config, a run's record), it needs the same trust as a
    Lambda layer. Checked before anything is imported.

    Raises:
        ConfigError: a factory model from ``where`` without ``--trust-model``.
    """
    from tfopt.specs import parse_model_source

    if model.trust or parse_model_source(model.name).form != "factory":
        return
    raise ConfigError(
        f"model.name={model.name[:80]!r} from {where[:120]} is code (a package.module:function "
        "factory: importing it runs that module); give --trust-model if you trust that file, or "
        "name the model with --model on the command line"
    )


def add_shard_variables(group) -> None:
    """Adds ``--shard-variables MIN_SHARD_MB`` (parameter_server; see :mod:`tfopt.runtime.sharding`)."""
    group.add_argument(
        "--shard-variables",
        type=float,
        metavar="MIN_SHARD_MB",
        help="parameter_server: split each variable of at least 2 x MIN_SHARD_MB MiB into shards "
        "of at least MIN_SHARD_MB over the ps tasks (one shard per ps task at most)",
    )


def shard_variables(args: argparse.Namespace) -> dict:
    """The ``runtime`` settings ``--shard-variables`` gives (none when it is not given).

    Raises:
        ConfigError: a size that is not positive.
    """
    mb = getattr(args, "shard_variables", None)
    if mb is None:
        return {}
    if not mb > 0:
        raise ConfigError(
            f"--shard-variables {mb:g}: give the smallest shard size in MiB, a number > 0 "
            "(e.g. --shard-variables 1)"
        )
    return {"variable_partitioner": "min_size", "min_shard_bytes": max(1, round(mb * (1 << 20)))}


def check_config_flags(cfg: config_lib.RunConfig, given: Collection[str]) -> None:
    """Refuses a distribution or data flag the resolved config does not read.

    ``--cpu-replicas`` is read by ``mirrored`` only, ``--collective`` by
    ``multi_worker_mirrored`` only and ``--data-service-mode`` only with a tf.data service.

    Args:
        cfg: The resolved config (its strategy may come from ``--config`` or an input run).
        given: The options given explicitly (:func:`tfopt.flagcheck.explicit`).

    Raises:
        ConfigError: e.g. ``--cpu-replicas is not used with --strategy one_device (it needs
            --strategy mirrored); give --strategy mirrored, or drop --cpu-replicas``.
    """
    strategy = f"--strategy {cfg.runtime.strategy}"
    flagcheck.refuse_off(
        {
            "--cpu-replicas": (
                cfg.runtime.strategy == "mirrored",
                strategy,
                "--strategy mirrored",
                None,
            ),
            "--collective": (
                cfg.runtime.strategy == "multi_worker_mirrored",
                strategy,
                "--strategy multi_worker_mirrored",
                None,
            ),
            "--data-service-mode": (
                bool(cfg.data.service),
                "no --data-service",
                "--data-service local or grpc://HOST:PORT",
                None,
            ),
        },
        given,
    )


def add_verbosity(group, quiet_help: str) -> None:
    """Adds ``--quiet`` (``quiet_help``; events and warnings still print) and ``--verbose``."""
    group.add_argument("--quiet", action="store_true", help=quiet_help)
    group.add_argument("--verbose", action="store_true", help="debug lines too")


def verbosity(args: argparse.Namespace) -> int:
    """The logging level ``--quiet`` and ``--verbose`` ask for (``--quiet`` wins)."""
    if getattr(args, "quiet", False):
        return log.QUIET
    return log.VERBOSE if getattr(args, "verbose", False) else log.NORMAL


def os_error_fix(e: OSError) -> str | None:
    """The fix for an OS error the machine gives on the user's paths (a full disk, a read-only
    or forbidden directory, a name too long, a directory where a file belongs), else None."""
    import errno

    return {
        errno.ENOSPC: "free space on that disk, or give -o / --data-dir on another",
        errno.EDQUOT: "free space within your quota, or give -o / --data-dir elsewhere",
        errno.EROFS: "that file system is read-only: give -o on a writable one",
        errno.EACCES: "you may not write or read there: fix its permissions or give another path",
        errno.EPERM: "you may not write or read there: fix its permissions or give another path",
        errno.ENAMETOOLONG: "a name in that path is too long (at most 255 bytes): shorten it",
        errno.EISDIR: "that is a directory where a file belongs: give the file's path",
        errno.ENOTDIR: "a part of that path is a file where a directory belongs: fix the path",
        errno.ELOOP: "that path is a loop of symbolic links: fix the link",
    }.get(e.errno)


#: The longest error line a command prints.
MAX_ERROR_CHARS = 2000


def run_main(prog: str, fn: Callable[[], int], level: int = log.NORMAL) -> int:
    """Runs a CLI body with tfopt's logging configured (:func:`tfopt.log.configure`), turning a
    TfoptError into one line on stderr and exit code 2."""
    log.configure(prog, level)
    try:
        return fn()
    except TfoptError as e:
        text = str(e)
        if len(text) > MAX_ERROR_CHARS:  # a value echoed whole (a 10 MB entry) stays readable
            text = f"{text[: MAX_ERROR_CHARS - 40]}... ({len(text)} characters, cut)"
        print(f"{prog}: {'error: ' if e.exit_code == 2 else ''}{text}", file=sys.stderr)
        return e.exit_code
    except OSError as e:
        fix = os_error_fix(e)
        if fix is None:  # not the machine's answer to the user's paths: a bug, with its traceback
            raise
        where = f" {e.filename!r}" if e.filename else ""
        print(
            f"{prog}: error: cannot use{where[:300]}: {e.strerror or e}; {fix} (a finished run "
            "there is untouched; a rerun resumes or starts over)",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - only TensorFlow's file errors are answered here
        # TensorFlow's own file writers (TFRecord shards, TensorBoard, checkpoints) report a full
        # or read-only disk as an OpError, not an OSError.
        text = str(e).strip().splitlines()[0] if str(e).strip() else ""
        full = "No space left on device" in text or "Read-only file system" in text
        if not (type(e).__module__.startswith("tensorflow") and full):
            raise
        print(
            f"{prog}: error: cannot write {text[:300]}; free space there or give another -o / "
            "--data-dir (a finished run there is untouched; a rerun resumes or starts over)",
            file=sys.stderr,
        )
        return 2
