"""The config's constants and the :class:`Flag` a field carries onto the command line."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

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

    :func:`tfopt.config.cli.add_config_args` makes the options from these: one per field that has a
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
