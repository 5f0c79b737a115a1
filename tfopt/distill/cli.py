"""``python -m tfopt.distill``: argument parsing only; the work is :func:`tfopt.distill.stage.run`.

    python -m tfopt.distill --teacher runs/train --student tiny_cnn --temperature 4 --alpha 0.9 --strategy mirrored
    python -m tfopt.distill --teacher runs/train --teacher runs/train-2 --student tiny_cnn --teacher-weights accuracy
    python -m tfopt.distill --teacher runs/train --student tiny_cnn --technique prune --sparsity 0.75
"""
from __future__ import annotations

import json

from tfopt import cli
from tfopt.distill.options import COMBINE_MODES, DistillOptions, parse_feature
from tfopt.errors import ConfigError
from tfopt.optimize.techniques import ONE_PHASE

PROG = "tfopt.distill"
DESCRIPTION = "Distil trained teacher runs into a student, optionally compressed while it learns."


def build_parser() -> cli.ArgumentParser:
    """The argument parser of ``python -m tfopt.distill``."""
    parser = cli.ArgumentParser(prog="python -m tfopt.distill", description=DESCRIPTION)
    g = parser.add_argument_group("distillation")
    g.add_argument("--teacher", action="append", default=[], metavar="RUN",
                   help="run directory of a trained teacher (repeat for several teachers)")
    g.add_argument("--student", help="registered student model: tiny_cnn (default), mlp, mobilenet_tiny, cnn")
    g.add_argument("--temperature", type=float, default=4.0, help="softmax temperature T (default 4)")
    g.add_argument("--alpha", type=float, default=0.9, help="weight of the teacher term in [0, 1] (default 0.9)")
    g.add_argument("--teacher-weights", default="equal",
                   help="equal (default), accuracy (from validation accuracy) or W1,W2,... (one per --teacher)")
    g.add_argument("--combine", default="probs", help=f"combine teachers' {' or '.join(COMBINE_MODES)} (default probs)")
    g.add_argument("--feature", action="append", default=[], metavar="[I/]TEACHER_LAYER:STUDENT_LAYER",
                   help="feature distillation between two named layers (repeatable)")
    g.add_argument("--feature-weight", type=float, default=1.0, help="weight of the feature term (default 1)")
    g.add_argument("--technique", default="none", help=f"compress while distilling: {', '.join(ONE_PHASE)}")
    g.add_argument("--sparsity", type=float, default=0.75, help="target sparsity for --technique prune")
    g.add_argument("--clusters", type=int, default=16, help="centroids per kernel for --technique cluster")
    g.add_argument("--baseline", metavar="RUN", help="run of the same student trained without a teacher (gap closed)")
    g.add_argument("--seed", type=int, help="seed for the student's initial weights")
    g.add_argument("--trust-model", action="store_true", help="load teacher files that can run code (see models.io)")
    cli.add_config_args(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point of ``python -m tfopt.distill``; returns the exit code."""
    args = build_parser().parse_args(argv)

    def body() -> int:
        if args.student and args.model and args.student != args.model:
            raise ConfigError(f"--student {args.student!r} and --model {args.model!r} disagree; give only --student")
        args.model = args.student or args.model or "tiny_cnn"
        cfg = cli.config_from_args(args)
        opts = DistillOptions(
            teachers=tuple(args.teacher), temperature=args.temperature, alpha=args.alpha,
            teacher_weights=args.teacher_weights, combine=args.combine,
            features=tuple(parse_feature(f) for f in args.feature), feature_weight=args.feature_weight,
            technique=args.technique, sparsity=args.sparsity, clusters=args.clusters, baseline=args.baseline,
            seed=args.seed, trust_model=args.trust_model)
        opts.fixed_weights()
        if args.print_config:
            print(json.dumps({"config": cfg.to_dict(), "distill": opts.to_dict()}, indent=2))
            return 0
        from tfopt.distill.stage import run

        run(cfg, opts, overwrite=args.overwrite)
        return 0

    return cli.run_main(PROG, body)
