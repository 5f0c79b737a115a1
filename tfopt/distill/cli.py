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

import json

from tfopt import cli
from tfopt import config as config_lib
from tfopt.compress.techniques import ONE_PHASE
from tfopt.config import COMBINE_MODES
from tfopt.core import flagcheck
from tfopt.core.errors import ConfigError
from tfopt.distill.options import DistillOptions, parse_feature

PROG = "tfopt distill"
DESCRIPTION = (
    "Distil trained teacher runs into a student, optionally compressed while it learns. Defaults chosen "
    "on the validation split: bench/results/distill_defaults.json."
)
# The student's training recipe where the user sets none (flags, --set and --config win); chosen
# on validation with the temperature and alpha defaults (DistillOptions), see the module doc.
RECIPE = {("train", "learning_rate"): 0.01, ("data", "augment"): "shift"}
# The --technique each compression flag is read by (tfopt.compress.student.wrap).
FLAG_USERS = {"--sparsity": ("prune",), "--clusters": ("cluster",)}


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
    """The argument parser of ``python -m tfopt.distill``."""
    parser = cli.ArgumentParser(prog=PROG, description=DESCRIPTION)
    g = parser.add_argument_group("distillation")
    g.add_argument(
        "--teacher",
        action="append",
        default=[],
        metavar="RUN|MODEL",
        help="run directory of a trained teacher, or a model file trained on the same data "
        "(repeat for several teachers)",
    )
    g.add_argument(
        "--student",
        help="the student, any --model form: tiny_cnn (default), small_cnn, ..., "
        "keras.applications:NAME, a model file, package.module:function",
    )
    recipe = ", ".join(f"{s}.{k}={v}" for (s, k), v in RECIPE.items())
    d = DistillOptions(
        teachers=()
    )  # every default below is DistillOptions' (tfopt.config.DistillConfig's)
    g.add_argument(
        "--temperature",
        type=float,
        default=d.temperature,
        help=f"softmax temperature T (default {d.temperature:g}, chosen on validation)",
    )
    g.add_argument(
        "--alpha",
        type=float,
        default=d.alpha,
        help=f"weight of the teacher term in [0, 1] (default {d.alpha:g}, chosen on "
        f"validation); the student's recipe defaults to {recipe} unless set",
    )
    g.add_argument(
        "--teacher-weights",
        default=d.teacher_weights,
        help=f"equal, accuracy (from validation accuracy) or W1,W2,... (one per --teacher; default "
        f"{d.teacher_weights})",
    )
    g.add_argument(
        "--combine",
        default=d.combine,
        help=f"combine teachers' {' or '.join(COMBINE_MODES)} (default {d.combine})",
    )
    g.add_argument(
        "--feature",
        action="append",
        default=[],
        metavar="[I/]TEACHER_LAYER:STUDENT_LAYER",
        help="feature distillation between two named layers (repeatable)",
    )
    g.add_argument(
        "--feature-weight",
        type=float,
        default=d.feature_weight,
        help=f"weight of the feature term (default {d.feature_weight:g})",
    )
    g.add_argument(
        "--technique",
        default=d.technique,
        help=f"compress while distilling: {', '.join(ONE_PHASE)} (default {d.technique})",
    )
    g.add_argument(
        "--sparsity",
        type=float,
        default=d.sparsity,
        help=f"target sparsity for --technique prune (default {d.sparsity:g})",
    )
    g.add_argument(
        "--clusters",
        type=int,
        default=d.clusters,
        help=f"centroids per kernel for --technique cluster (default {d.clusters})",
    )
    g.add_argument(
        "--baseline",
        metavar="RUN",
        help="run of the same student trained without a teacher (gap closed)",
    )
    g.add_argument(
        "--seed",
        type=int,
        help="seed of the run: initial weights, data order, augmentation "
        "(sets train.seed and data.seed; default 42, as tfopt.train)",
    )
    g.add_argument(
        "--trust-model",
        action="store_true",
        help="load teacher files that can run code (see models.io)",
    )
    cli.add_config_args(parser)
    return parser


def check_flags(args, given: set[str]) -> None:
    """Refuses --sparsity or --clusters with a --technique that does not read it, and
    --teacher-weights, --combine with one teacher or --feature-weight without --feature.

    Args:
        args: The parsed command line.
        given: The options given explicitly (:func:`tfopt.core.flagcheck.explicit`).

    Raises:
        ConfigError: e.g. ``--sparsity is not used by --technique cluster (it belongs to
            prune); ...``. An unknown technique is left to DistillOptions' own check.
    """
    if args.technique in ONE_PHASE:
        own = [flag for flag, users in FLAG_USERS.items() if args.technique in users]
        takes = f"{args.technique} takes {flagcheck.join(own)}; " if own else ""
        flagcheck.refuse_unused(
            FLAG_USERS,
            (args.technique,),
            given,
            chosen_as=f"--technique {args.technique}",
            fix=lambda flag, users: (
                f"{takes}give --technique {flagcheck.join(users)}, or drop {flag}"
            ),
        )
    teachers = "one --teacher"
    flagcheck.refuse_off(
        {
            "--teacher-weights": (len(args.teacher) != 1, teachers, "several --teacher", None),
            "--combine": (len(args.teacher) != 1, teachers, "several --teacher", None),
            "--feature-weight": (
                bool(args.feature),
                "no --feature",
                "--feature TEACHER_LAYER:STUDENT_LAYER",
                None,
            ),
        },
        given,
    )


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point of ``python -m tfopt.distill``; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    given = flagcheck.explicit(parser, argv)

    def body() -> int:
        check_flags(args, given)
        if args.student and args.model and args.student != args.model:
            raise ConfigError(
                f"--student {args.student!r} and --model {args.model!r} disagree; give only --student"
            )
        args.model = args.student or args.model or "tiny_cnn"
        seeds = [] if args.seed is None else [f"train.seed={args.seed}", f"data.seed={args.seed}"]
        args.set = [*_recipe_overrides(args.config), *seeds, *args.set]
        cfg = cli.config_from_args(args)
        cli.check_config_flags(cfg, given)
        opts = DistillOptions(
            teachers=tuple(args.teacher),
            temperature=args.temperature,
            alpha=args.alpha,
            teacher_weights=args.teacher_weights,
            combine=args.combine,
            features=tuple(parse_feature(f) for f in args.feature),
            feature_weight=args.feature_weight,
            technique=args.technique,
            sparsity=args.sparsity,
            clusters=args.clusters,
            baseline=args.baseline,
            trust_model=args.trust_model,
        )
        opts.fixed_weights()
        if args.print_config:
            print(json.dumps({"config": cfg.to_dict(), "distill": opts.to_dict()}, indent=2))
            return 0
        from tfopt.distill.stage import run

        run(cfg, opts, overwrite=args.overwrite)
        return 0

    return cli.run_main(PROG, body, cli.verbosity(args))
