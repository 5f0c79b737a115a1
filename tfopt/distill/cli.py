"""``python -m tfopt.distill``: argument parsing only; the work is :func:`tfopt.distill.stage.run`.

    python -m tfopt.distill --teacher runs/train --student tiny_cnn --epochs 2     # the defaults below
    python -m tfopt.distill --teacher runs/train --teacher runs/train-2 --student tiny_cnn --teacher-weights accuracy
    python -m tfopt.distill --teacher runs/train --student tiny_cnn --technique prune --sparsity 0.75

Defaults (temperature, alpha and the student's recipe: learning rate, augmentation) were chosen
on the validation split by ``bench/distill_defaults.py`` (every configuration tried, its seeds and
validation accuracies: ``bench/results/distill_defaults.json``): with them, ``--student tiny_cnn
--epochs 2`` from the main job's teacher beats ``python -m tfopt.train --model tiny_cnn --epochs 2``
at the same seed and budget. The recipe applies where neither a flag, ``--set`` nor the
``--config`` file sets its key; like ``tfopt.train``, runs are seeded (``train.seed``, default 42).
"""

from __future__ import annotations

import copy
import json

from tfopt import config as config_lib
from tfopt.config import cli
from tfopt.core import flagcheck
from tfopt.core.errors import ConfigError
from tfopt.distill.options import fixed_weights

PROG = "tfopt distill"
DESCRIPTION = (
    "Distil trained teacher runs into a student, optionally compressed while it learns. Defaults chosen "
    "on the validation split: bench/results/distill_defaults.json."
)
# The student's training recipe where the user sets none (flags, --set and --config win); chosen
# on validation with the temperature and alpha defaults (tfopt.config.DistillConfig).
RECIPE = {("train", "learning_rate"): 0.01, ("data", "augment"): "shift"}
#: The config sections tfopt distill reads.
SECTIONS = config_lib.STAGE_SECTIONS["distill"]


def _recipe_overrides(config_path: str | None) -> list[str]:
    """``--set`` entries for the RECIPE keys that the ``--config`` file (if any) leaves unset."""
    nested: dict = {}
    for (section, key), value in RECIPE.items():
        nested.setdefault(section, {})[key] = value
    if config_path:  # a key the file sets comes out the same whatever the base
        plain, based = (
            config_lib.load(config_path),
            config_lib.load(config_path, config_lib.from_dict(nested)),
        )
    return [
        f"{section}.{key}={value}"
        for (section, key), value in RECIPE.items()
        if not config_path
        or getattr(getattr(plain, section), key) != getattr(getattr(based, section), key)
    ]


def build_parser() -> cli.ArgumentParser:
    """The argument parser of ``python -m tfopt.distill``: the teachers and the student, then the
    options of the config sections it reads (``distill`` first), generated from their fields."""
    parser = cli.ArgumentParser(prog=PROG, description=DESCRIPTION)
    g = parser.add_argument_group("inputs")
    g.add_argument(
        "--teacher",
        action="append",
        default=[],
        metavar="RUN|MODEL",
        help="run directory of a trained teacher, or a model file trained on the same data "
        "(repeat for several teachers)",
    )
    recipe = ", ".join(f"{s}.{k}={v}" for (s, k), v in RECIPE.items())
    g.add_argument(
        "--student",
        help="the student, any --model form: tiny_cnn (default), small_cnn, ..., "
        f"keras.applications:NAME, a model file, package.module:function; its recipe defaults "
        f"to {recipe} unless set",
    )
    g.add_argument(
        "--seed",
        type=int,
        help="seed of the run: initial weights, data order, augmentation "
        "(sets train.seed and data.seed; default 42, as tfopt.train)",
    )
    cli.add_config_args(parser, SECTIONS)
    return parser


def resolve(args) -> config_lib.RunConfig:
    """The config the command line asks for: the student's recipe < ``--config`` < ``--set`` <
    flags; ``--seed`` seeds both the weights and the data.

    Raises:
        ConfigError: a bad value, or ``--student`` and ``--model`` that disagree.
    """
    if args.student and args.model and args.student != args.model:
        raise ConfigError(
            f"--student {args.student!r} and --model {args.model!r} disagree; give only --student"
        )
    seeds = [] if args.seed is None else [f"train.seed={args.seed}", f"data.seed={args.seed}"]
    args = copy.copy(args)
    args.model = args.student or args.model or "tiny_cnn"
    args.set = [*_recipe_overrides(args.config), *seeds, *args.set]
    return cli.config_from_args(args)


def check_flags(args, given: set[str], cfg: config_lib.RunConfig | None = None) -> None:
    """Refuses a flag the resolved settings do not read: ``--sparsity`` or ``--clusters`` with a
    ``--technique`` that does not read it, ``--teacher-weights`` or ``--combine`` with one
    teacher, ``--feature-weight`` without ``--feature``, a distribution flag the strategy ignores.

    Args:
        args: The parsed command line.
        given: The options given explicitly (:func:`tfopt.core.flagcheck.explicit`).
        cfg: The resolved config (default: resolved from ``args``).

    Raises:
        ConfigError: e.g. ``--sparsity is not used by --technique cluster (it belongs to
            prune); ...``.
    """
    cfg = cfg or resolve(args)
    cli.check_read(cfg, given, SECTIONS)
    teachers = "one --teacher"
    flagcheck.refuse_off(
        {
            "--teacher-weights": (len(args.teacher) != 1, teachers, "several --teacher", None),
            "--combine": (len(args.teacher) != 1, teachers, "several --teacher", None),
            "--feature-weight": (
                bool(cfg.distill.features),
                "no --feature",
                "--feature TEACHER_LAYER:STUDENT_LAYER",
                None,
            ),
        },
        given,
    )
    cli.check_config_flags(cfg, given)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point of ``python -m tfopt.distill``; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    given = flagcheck.explicit(parser, argv)

    def body() -> int:
        cfg = resolve(args)
        check_flags(args, given, cfg)
        fixed_weights(cfg.distill, args.teacher)
        if args.print_config:
            print(json.dumps(cfg.to_dict("distill"), indent=2))
            return 0
        from tfopt.distill.stage import run

        run(cfg, tuple(args.teacher), overwrite=args.overwrite)
        return 0

    return cli.run_main(PROG, body, cli.verbosity(args))
