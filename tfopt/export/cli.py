"""``python -m tfopt.export``: TFLite export, evaluation and latency benchmark.

    python -m tfopt.export --from runs/mnist --modes float32,dynamic,float16,int8,int16x8
    python -m tfopt.export --from runs/mnist-pqat --modes int8 --io int8 --calibration-steps 100
    python -m tfopt.export --from runs/mnist --modes float32,int8_auto --strip-strings
    python -m tfopt.export --evaluate model.tflite --dataset mnist
    python -m tfopt.export --benchmark model.tflite --threads 1,2

Exit codes: 0 done; 1 a converted model failed the fidelity gate (the run directory with every
model and its run.json is still written); 2 a user error (one line on stderr).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from tfopt import config as config_lib
from tfopt.config import cli
from tfopt.config import export as export_config
from tfopt.core import flagcheck, native_stderr
from tfopt.core.errors import ConfigError, ModelError
from tfopt.export import choices

PROG = "tfopt export"

_FROM, _EVALUATE, _BENCHMARK = export_config.FROM, export_config.EVALUATE, export_config.BENCHMARK
_MODES = choices.MODES.names()
#: The kinds of mode an export field's read_by may name, spelled out over the mode registry.
KINDS = {
    "calibrated": tuple(m for m in _MODES if choices.MODES.get(m).calibration),
    "int_io": tuple(m for m in _MODES if len(choices.MODES.get(m).io_types) > 1),
    "converter": tuple(m for m in _MODES if not choices.MODES.get(m).quantizer),
    "both_quantizers": choices.BOTH_QUANTIZERS,
}
#: The config sections tfopt export reads whole, and the fields of others it reads: the data a
#: model file or a .tflite is scored on (a run directory brings its own) and --trust-model.
SECTIONS = ("export",)
SHARED = (
    "data.dataset",
    "data.data_dir",
    "data.image_size",
    "data.channels",
    "data.normalize",
    "data.input_scale",
    "model.trust",
)
# Who reads each flag that only some runs read: a --modes name, or --from (any mode), --evaluate,
# --benchmark; from the export fields' read_by. The data flags, --output and --trust-model serve
# every run: not listed.
FLAG_USERS = {
    flag.name: tuple(dict.fromkeys(m for r in flag.read_by for m in KINDS.get(r, (r,))))
    for _, _, flag in cli.config_flags(SECTIONS)
    if flag.read_by
} | {"--overwrite": (_FROM,), "--wide": (_FROM,)}


def build_parser() -> cli.ArgumentParser:
    """The argument parser of ``tfopt export``, generated from the ``export`` section and the
    data fields it reads (no TensorFlow import: ``--help`` stays fast)."""
    p = cli.ArgumentParser(
        prog=PROG,
        description=__doc__.splitlines()[0],
        epilog="exit codes: 0 done, 1 fidelity gate failed, 2 user error",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--from",
        dest="source",
        metavar="RUN|MODEL",
        help="run directory to export (run.json + model.keras), or a model file (.keras, .h5, "
        "a SavedModel directory) with the data flags below",
    )
    what.add_argument(
        "--evaluate", metavar="TFLITE", help="score a .tflite on a dataset's test split"
    )
    what.add_argument("--benchmark", metavar="TFLITE", help="measure a .tflite's latency and size")
    cli.add_config_args(p, SECTIONS, shared=SHARED)
    modes = next(a for a in p._actions if a.dest == "modes")
    modes.help += f": {choices.MODES.help()}"
    g = cli.group(p, "output")
    g.add_argument(
        "--output",
        "-o",
        help="new run directory (default <RUN>-export, then -2, ...; --evaluate/--benchmark: "
        "where to write their JSON, default none)",
    )
    g.add_argument(
        "--wide",
        action="store_true",
        help="print the full table (every latency setting, p95, gzip size) and the roofline",
    )
    return p


def _action(args) -> str:
    return (
        _FROM if args.source is not None else _EVALUATE if args.evaluate is not None else _BENCHMARK
    )


def check_flags(args, given: set[str], cfg: config_lib.RunConfig | None = None) -> None:
    """Refuses a flag the run does not read: e.g. --calibration-steps without a calibrated
    mode, --float-layers without int8, --modes with --evaluate, --split with --from.

    Args:
        args: The parsed command line.
        given: The options given explicitly (:func:`tfopt.core.flagcheck.explicit`).
        cfg: The resolved config (default: resolved from ``args``).

    Raises:
        ConfigError: one line naming the flag, what reads it and the fix.
    """
    action = _action(args)
    # First the action (a mode's flag belongs to --from), then, for --from, the modes.
    by_action = {
        flag: tuple(dict.fromkeys(_FROM if user in _MODES else user for user in users))
        for flag, users in FLAG_USERS.items()
    }
    own = [flag for flag, users in by_action.items() if action in users]
    flagcheck.refuse_unused(
        by_action,
        (action,),
        given,
        chosen_as=action,
        fix=lambda flag, users: (
            f"use it with {flagcheck.join(users)}, or drop it"
            if action == _FROM
            else f"{action} takes {flagcheck.join(own)}"
        ),
    )
    if action != _FROM:
        return
    cfg = cfg or cli.config_from_args(args)
    if "--trainable-lr" in given and not cfg.export.trainable:
        raise ConfigError(
            "--trainable-lr is read by --trainable (the trainable file's SGD step); add "
            "--trainable, or drop --trainable-lr"
        )
    modes = choices.parse_modes(cfg.export.modes)
    flagcheck.refuse_unused(
        {flag: users for flag, users in FLAG_USERS.items() if set(users) <= set(_MODES)},
        modes,
        given,
        chosen_as=f"--modes {','.join(modes)}",
        fix=lambda flag, users: f"add {flagcheck.join(users)} to --modes, or drop {flag}",
    )


def _check_args(args, given: set[str]) -> config_lib.RunConfig:
    """The resolved config, every flag validated before TensorFlow is imported, so mistakes fail
    in a blink."""
    cfg = cli.config_from_args(args)
    check_flags(args, given, cfg)  # parses --modes (for --from)
    choices.parse_threads(cfg.export.threads)
    choices.parse_runtimes(cfg.export.runtimes)
    if args.source is not None:
        _check_quantizer_modes(cfg.export)
    if args.source is not None and not os.path.exists(args.source):
        raise ConfigError(
            f"{args.source!r} does not exist; give the -o directory of a training run or a model file"
        )
    for flag, path in (("--evaluate", args.evaluate), ("--benchmark", args.benchmark)):
        if path is not None and not os.path.isfile(path):
            raise ModelError(f"{flag} {path!r}: no such file; give the path of a .tflite file")
    if cfg.export.keras and not os.path.exists(cfg.export.keras):
        raise ModelError(
            f"--keras {cfg.export.keras!r} does not exist; give a .keras file or a run directory"
        )
    return cfg


def _check_quantizer_modes(e) -> None:
    """ai-edge-quantizer present and in range, and a readable --recipe, before TensorFlow starts."""
    modes = choices.parse_modes(e.modes)
    if not any(choices.MODES.get(m).quantizer for m in modes):
        return
    from tfopt.export import aeq

    aeq.require()
    if "recipe" in modes:
        if not e.recipe:
            raise ConfigError(
                "--modes recipe quantizes as a recipe file says; give --recipe FILE.json"
            )
        aeq.read_recipe(e.recipe)


def _start_tensorflow() -> None:
    """Starts TensorFlow's runtime where its start-up notices (the CUDA probe) are filtered out.

    Only this call, the converter and the interpreter creation print such notices; everything
    else (a crash's message, a traceback) reaches stderr untouched.
    """
    from tfopt.core._keras import tf

    with native_stderr.filtered():
        tf.config.list_physical_devices()  # loads the device plugins: the CUDA probe prints here


def _body(args, given: set[str]) -> int:
    cfg = _check_args(args, given)
    if args.print_config:
        shown = {**cfg.to_dict("export"), "export": dataclasses.asdict(cfg.export)}
        print(json.dumps({k: shown[k] for k in ("data", "model", "export")}, indent=2))
        return 0
    from tfopt.runtime.strategy import is_chief
    from tfopt.runtime.tf_config import parse_tf_config

    _start_tensorflow()
    if not is_chief(parse_tf_config(os.environ.get("TF_CONFIG"))):
        print(f"{PROG}: not the chief task; the chief exports", file=sys.stderr)
        return 0
    if args.source is not None:
        return _export(args, cfg)
    if args.evaluate is not None:
        return _evaluate(args, cfg)
    return _benchmark(args, cfg)


def _export(args, cfg: config_lib.RunConfig) -> int:
    from tfopt.export import runner, ship, summary
    from tfopt.export import settings as settings_lib

    settings = settings_lib.settings_from(cfg.export, cfg.model.trust)
    record = runner.run(
        args.source, settings, out_dir=args.output, overwrite=args.overwrite, data=cfg.data
    )
    export = record.section
    print(
        f"latency: batch 1 on {export['host']['cpu']}, {settings.bench.rounds} interleaved rounds"
    )
    if args.wide:
        print(export["table"])
        if export.get("roofline_table"):
            print(export["roofline_table"])
    else:
        print(summary.compact_table(export["modes"]))
        print(f"(every setting, p95 and the roofline: {export['output']}/export.md, or --wide)")
    for note in export["notes"]:
        print(f"note: {note}")
    out = export["output"]
    for row in export["modes"]:
        if row.get("file"):
            print(f"{PROG}: wrote {os.path.join(out, row['file'])}")
    if export.get("trainable"):
        t = export["trainable"]
        print(
            f"{PROG}: wrote {os.path.join(out, t['file'])} (signatures "
            f"{', '.join(sorted(t['signatures']))}; {t['head']} trains on the device)"
        )
    print(f"{PROG}: wrote {os.path.join(out, 'run.json')} (the record) and export.md (the table)")
    if export.get("ship"):
        print(ship.line(export["ship"], out))
    failures = export["gate_failures"]
    if failures:
        print(
            f"{PROG}: fidelity gate failed: "
            + ", ".join(f"{m} ({why})" for m, why in failures.items()),
            file=sys.stderr,
        )
        print(f"{PROG}: {_next_step(failures, export)}", file=sys.stderr)
        return 1
    return 0


def _evaluate(args, cfg: config_lib.RunConfig) -> int:
    from tfopt.core.fileio import write_json
    from tfopt.export import runner, summary

    row = runner.evaluate_file(
        args.evaluate,
        cfg.data,
        limit=cfg.export.eval_limit,
        split=cfg.export.split,
        keras_path=cfg.export.keras or None,
        trust_model=cfg.model.trust,
    )
    print(summary.export_table([row]))
    if args.output:
        write_json(os.path.join(args.output, "evaluate.json"), row)
    return 0


def _benchmark(args, cfg: config_lib.RunConfig) -> int:
    from tfopt.core.cpu import peak_summary
    from tfopt.core.fileio import write_json
    from tfopt.export import runner, summary
    from tfopt.export import settings as settings_lib

    bench = settings_lib.bench_from(cfg.export)
    row = runner.benchmark_file(
        args.benchmark, bench, keras_path=cfg.export.keras or None, trust_model=cfg.model.trust
    )
    print(f"latency: batch 1 on {row['host']}, {bench.rounds} rounds")
    print(summary.export_table([row]))
    if row.get("roofline"):
        print(f"{peak_summary(row['cpu_peaks'])}\n\n{summary.roofline_table([row])}")
    fastest = summary.fastest_runtime(row)
    if fastest:
        print(fastest)
    for key, k in row["kernels"].items():
        print(
            f"kernels {key}: {k['delegated_ops']}/{k['total_ops']} ops in {k['delegate_partitions']} XNNPACK "
            f"partition(s); builtin kernels: {', '.join(k['builtin_kernel_ops']) or 'none'}"
        )
    if "keras" in row:
        print(
            f"keras model: {row['keras']['params']} params, {row['keras']['flops']} FLOPs per example"
        )
    if args.output:
        write_json(os.path.join(args.output, "benchmark.json"), row)
    return 0


def _next_step(failures: dict, export: dict) -> str:
    """What to try after a failed fidelity gate, and what was written anyway."""
    written = "the files above were written and measured"
    if export.get("ship"):
        written += f"; {export['ship']['file']} is {export['ship']['from']}, which passed"
    else:
        written += "; none passed, so no model.tflite was written"
    tries = []
    if any(m.startswith("int8") for m in failures):
        tries += [
            "--modes int8_auto (keeps the layers int8 hurts in float, chosen by measuring)",
            "--float-layers LAYER,... (name the layers to keep in float)",
        ]
    tries.append("--min-agreement 0.97 or --max-accuracy-drop 1.0 (accept a looser match)")
    return f"{written}. Next: " + "; or ".join(tries)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point of ``python -m tfopt.export``; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    given = flagcheck.explicit(parser, argv)
    return cli.run_main(PROG, lambda: _body(args, given), cli.verbosity(args))


if __name__ == "__main__":
    sys.exit(main())
