"""Shared command-line plumbing: one-line errors, exit code 2, config flags."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from tfopt import config as config_lib
from tfopt.errors import TfoptError
from tfopt.specs import MODEL_SOURCES, PRECISIONS, STRATEGIES


class ArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr and exit code 2."""

    def error(self, message):  # noqa: D102 - argparse hook
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """Adds the flags every training-like command shares (config file, overrides, common knobs)."""
    g = parser.add_argument_group("configuration")
    g.add_argument("--config", help="YAML or JSON config file; flags override its values")
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
    g.add_argument("--strategy", help=f"one of: {STRATEGIES.help()}")
    g.add_argument("--precision", help=f"one of: {PRECISIONS.help()}")
    g.add_argument(
        "--cpu-replicas",
        type=int,
        help="logical CPU devices for `mirrored` without GPUs (default 2); they share the CPU cores, "
        "so on one CPU host mirrored is no faster than one_device",
    )
    g.add_argument(
        "--collective",
        help=f"multi_worker_mirrored all-reduce: {', '.join(config_lib.COLLECTIVES)}",
    )
    g.add_argument(
        "--dataset",
        help="mnist, fashion_mnist, digits, folder:PATH (one subfolder per class), "
        "tfds:NAME[/CONFIG] or tfrecord:GLOB",
    )
    g.add_argument(
        "--image-size",
        metavar="HxW",
        help="resize every image to HxW (bilinear; the aspect ratio is not "
        "kept: crop or pad beforehand to keep it)",
    )
    g.add_argument(
        "--channels",
        type=int,
        choices=(1, 3),
        help="convert images to 1 (gray) or 3 (RGB) channels",
    )
    g.add_argument("--data-dir", help="where datasets are cached as TFRecord shards")
    g.add_argument("--limit", type=int, help="use only the first N records of each split")
    g.add_argument("--batch-size", type=int, help="global batch size (split across replicas)")
    g.add_argument(
        "--model",
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
        help="the classification layer: auto (replaced when the class count differs, "
        "default), new (always replaced) or keep",
    )
    g.add_argument(
        "--freeze-epochs",
        type=int,
        metavar="N",
        help="train only the classification layer for the first N epochs, then every layer (fine-tuning)",
    )
    g.add_argument("--epochs", type=int)
    g.add_argument("--lr", type=float, help="learning rate")
    g.add_argument(
        "--scale-lr",
        action="store_true",
        default=None,
        help="multiply the learning rate by the replica count",
    )
    g.add_argument("--steps-per-epoch", type=int)
    g.add_argument("--steps-per-execution", type=int, help="steps per tf.function call (0 = auto)")
    g.add_argument(
        "--backup-every",
        type=int,
        metavar="N",
        help="back up every N steps as well as at each epoch end (a restart resumes there)",
    )
    g.add_argument(
        "--deterministic",
        action="store_true",
        default=None,
        help="op determinism and a deterministic input: reruns and resumes give identical weights",
    )
    g.add_argument(
        "--data-service",
        metavar="local|grpc://HOST:PORT",
        help="feed the input through the tf.data service: in-process (local) or an existing dispatcher",
    )
    g.add_argument(
        "--data-service-mode", help="tf.data service sharing: parallel_epochs or distributed_epoch"
    )
    g.add_argument(
        "--verify",
        action="store_true",
        default=None,
        help="re-hash every data shard against its manifest (default: size and mtime checks)",
    )
    g.add_argument(
        "--output",
        "-o",
        help="run directory to write (default: a new runs/<stage>[-N]; "
        "runs/latest points at the newest run)",
    )
    g.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a finished run at -o, or discard an unfinished run of other settings there",
    )
    g.add_argument("--quiet", action="store_true", help="no progress bar")


_FLAG_KEYS = {
    "strategy": ("runtime", "strategy"),
    "precision": ("runtime", "precision"),
    "cpu_replicas": ("runtime", "cpu_replicas"),
    "collective": ("runtime", "collective"),
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
    "head": ("model", "head"),
    "trust_model_file": ("model", "trust"),
    "freeze_epochs": ("model", "freeze_epochs"),
}


def config_from_args(args: argparse.Namespace) -> config_lib.RunConfig:
    """Resolves the config: defaults < --config file < --set overrides < dedicated flags."""
    cfg = config_lib.load(args.config) if args.config else config_lib.RunConfig()
    cfg = config_lib.apply_overrides(cfg, args.set)
    raw: dict[str, dict] = {}
    for flag, (section, key) in _FLAG_KEYS.items():
        value = getattr(args, flag, None)
        if value is not None:
            raw.setdefault(section, {})[key] = value
    if getattr(args, "model_arg", None):
        raw.setdefault("model", {})["args"] = ",".join(args.model_arg)
    if getattr(args, "quiet", False):
        raw.setdefault("train", {})["verbose"] = 0
    return config_lib.from_dict(raw, cfg)


def run_main(prog: str, fn: Callable[[], int]) -> int:
    """Runs a CLI body, turning a TfoptError into one line on stderr and exit code 2."""
    try:
        return fn()
    except TfoptError as e:
        print(f"{prog}: {'error: ' if e.exit_code == 2 else ''}{e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
