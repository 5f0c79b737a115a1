"""``python -m tfopt.federated``: argument parsing only; the work is :func:`tfopt.federated.stage.run`.

python -m tfopt.federated --clients 3 --rounds 5 --limit 3000
python -m tfopt.federated --clients 10 --partition shards --algorithm fedprox --proximal-mu 0.01
"""

from __future__ import annotations

import json
import sys

from tfopt.config import cli
from tfopt.core import flagcheck
from tfopt.core.errors import ConfigError
from tfopt.federated import kube

PROG = "tfopt federated"
DESCRIPTION = (
    "Train a model over Flower clients that each keep a partition of the data (FedAvg, FedProx), "
    "with a SuperLink and one SuperNode per client started as processes; write a run directory."
)
#: The config sections tfopt federated reads (of ``train``: the output, seed and verbosity).
SECTIONS = ("federated", "data", "model")
SHARED = ("train.output_dir",)


def build_parser() -> cli.ArgumentParser:
    """The argument parser of ``tfopt federated``, generated from its config sections' fields."""
    parser = cli.ArgumentParser(prog=PROG, description=DESCRIPTION)
    cli.add_config_args(parser, SECTIONS, shared=SHARED)
    kube.add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point of ``python -m tfopt.federated``; returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    given = flagcheck.explicit(parser, argv)

    def body() -> int:
        cfg = cli.config_from_args(args)
        cli.check_read(cfg, given, SECTIONS)
        if not args.render:
            unused = [f for f in kube.RENDER_OPTIONS if f in given]
            if unused:
                raise ConfigError(
                    f"{', '.join(unused)} apply to --render kubernetes only; add --render "
                    f"kubernetes, or drop {', '.join(unused)}"
                )
        else:
            objects = kube.render(
                argv,
                cfg.federated.clients,
                image=args.image,
                name=args.name,
                namespace=args.namespace,
                claim=args.volume_claim,
                mount=args.mount_path,
            )
            sys.stdout.write(kube.to_yaml(objects))
            return 0
        if args.print_config:
            print(json.dumps(cfg.to_dict("federated"), indent=2))
            return 0
        from tfopt.federated.flower import require_flower
        from tfopt.federated.stage import run

        require_flower()

        run(cfg, overwrite=args.overwrite)
        return 0

    return cli.run_main(PROG, body, cli.verbosity(args))
