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

import os
import sys

from tfopt import cli
from tfopt.core import flagcheck, native_stderr
from tfopt.core.errors import ConfigError, ModelError
from tfopt.export import choices

PROG = "tfopt export"

_FROM, _EVALUATE, _BENCHMARK = "--from", "--evaluate", "--benchmark"
_MODES = choices.MODES.names()
_CALIBRATED = tuple(m for m in _MODES if choices.MODES.get(m).calibration)
_INT_IO = tuple(m for m in _MODES if len(choices.MODES.get(m).io_types) > 1)
_LATENCY = (_FROM, _BENCHMARK)
# Who reads each flag that only some runs read (runner.run and the --evaluate/--benchmark
# functions): a --modes name, or --from (any mode), --evaluate, --benchmark. The data flags
# (--dataset ... --input-scale), --output and --trust-model serve every run: not listed.
FLAG_USERS = {
    "--modes": (_FROM,),
    "--io": _INT_IO,  # tflite.make_converter and int8_auto's search; other modes keep float I/O
    "--calibration-steps": _CALIBRATED,
    "--float-layers": ("int8",),  # the extra int8 model with these layers in float
    "--allow-select-tf-ops": (_FROM,),
    "--sparsity": tuple(m for m in _MODES if not choices.MODES.get(m).quantizer),
    "--recipe": ("recipe",),
    "--quantizer": choices.BOTH_QUANTIZERS,
    "--strip-strings": (_FROM,),
    "--auto-candidates": ("int8_auto",),
    "--min-agreement": (_FROM,),
    "--max-accuracy-drop": (_FROM,),
    "--no-selective": ("int8",),  # the selective retry of an int8 failing the gate
    "--max-float-layers": ("int8",),
    "--search-limit": ("int8", "int8_auto"),  # the validation split both searches score on
    "--eval-limit": (_FROM, _EVALUATE),
    "--split": (_EVALUATE,),
    "--keras": (_EVALUATE, _BENCHMARK),
    "--threads": _LATENCY,
    "--runs": _LATENCY,
    "--warmup": _LATENCY,
    "--rounds": _LATENCY,
    "--device": _LATENCY,
    "--benchmark-binary": _LATENCY,
    "--kernels": _LATENCY,
    "--runtime": _LATENCY,
    "--litert-benchmark": _LATENCY,
    "--no-keras-latency": (_FROM,),
    "--overwrite": (_FROM,),
    "--no-plot": (_FROM,),
    "--wide": (_FROM,),
    "--outputs": (_FROM,),
}


def build_parser() -> cli.ArgumentParser:
    """The argument parser of ``tfopt export``."""
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
    g = p.add_argument_group("conversion (--from)")
    g.add_argument(
        "--modes",
        default=",".join(choices.DEFAULT_MODES),
        help=f"comma-separated (default {','.join(choices.DEFAULT_MODES)}): {choices.MODES.help()}",
    )
    g.add_argument(
        "--io", default="float", help=f"int8 model input/output type: {', '.join(choices.IO_TYPES)}"
    )
    g.add_argument(
        "--quantizer",
        default="converter",
        help="who quantizes dynamic, float16, int8 and int16x8: converter (the TFLite converter; "
        "the better path for each in benchmark B9q) or litert (LiteRT Quantizer, "
        "ai-edge-quantizer, from the float32 model; float I/O) (default converter)",
    )
    g.add_argument(
        "--outputs",
        default="probabilities",
        help="what the exported files give out: probabilities (softmax; what apps and MediaPipe "
        "Tasks expect) or logits (default probabilities)",
    )
    g.add_argument(
        "--calibration-steps",
        type=int,
        default=25,
        help="representative batches drawn from the run's training pipeline (default 25)",
    )
    g.add_argument(
        "--float-layers",
        default="",
        metavar="LAYER,...",
        help="also write an int8 model with these Keras layers kept in float (e.g. conv0)",
    )
    g.add_argument(
        "--allow-select-tf-ops",
        action="store_true",
        help="let ops without a builtin kernel run as TF Select (Flex) ops",
    )
    g.add_argument(
        "--sparsity",
        default="auto",
        help="sparse weight encoding: auto (when >= 50%% zeros and smaller), on, off",
    )
    g.add_argument(
        "--recipe",
        metavar="FILE.json",
        default="",
        help="mode recipe: an ai-edge-quantizer recipe (e.g. the model_int8_auto_recipe.json an "
        "export wrote, edited or not)",
    )
    g.add_argument(
        "--strip-strings",
        action="store_true",
        help="strip tensor names and other strings the runtime does not need (smaller files)",
    )
    g.add_argument(
        "--auto-candidates",
        type=int,
        default=5,
        help="int8_auto: mixed models timed and gated end to end (default 5, >= 2)",
    )
    g = p.add_argument_group("fidelity gate (--from)")
    g.add_argument(
        "--min-agreement",
        type=float,
        default=0.99,
        help="top-1 agreement with Keras (default 0.99)",
    )
    g.add_argument(
        "--max-accuracy-drop",
        type=float,
        default=0.5,
        help="accuracy points it may lose (default 0.5)",
    )
    g.add_argument(
        "--no-selective", action="store_true", help="do not retry a failing int8 with float layers"
    )
    g.add_argument(
        "--max-float-layers", type=int, default=4, help="selective search bound (default 4)"
    )
    g.add_argument(
        "--search-limit", type=int, default=2000, help="validation examples for the search"
    )
    g = p.add_argument_group("evaluation")
    g.add_argument(
        "--eval-limit", type=int, default=0, help="score only the first N test examples (0 = all)"
    )
    g.add_argument(
        "--dataset",
        default="mnist",
        help="--evaluate, or --from a model file: mnist, fashion_mnist, "
        "digits, folder:PATH, tfds:NAME, ... (a run directory brings its own)",
    )
    g.add_argument("--data-dir", help="--evaluate, or --from a model file: dataset cache directory")
    g.add_argument(
        "--image-size",
        metavar="HxW",
        help="--evaluate, or --from a model file: resize images to HxW",
    )
    g.add_argument(
        "--channels",
        type=int,
        choices=(1, 3),
        help="--evaluate, or --from a model file: 1 or 3 channels",
    )
    g.add_argument(
        "--normalize",
        metavar="MEAN/STD",
        help="--evaluate, or --from a model file: the model's input "
        "scaling on [0, 1] pixels, e.g. 0.5/0.5 for [-1, 1] (see docs/your_model.md)",
    )
    g.add_argument(
        "--input-scale",
        choices=("auto", "unit", "raw"),
        help="--evaluate, or --from a model file: what the model's input gets: auto (a model "
        "file: read from its first layers; a .tflite: its packed input.json), unit (pixels / 255, "
        "then --normalize) or raw (0-255 pixels)",
    )
    g.add_argument("--split", default="test", help="--evaluate: test or validation")
    g.add_argument(
        "--keras",
        metavar="MODEL",
        help="--evaluate/--benchmark: Keras model to compare with / cost",
    )
    g = p.add_argument_group("latency")
    g.add_argument("--threads", default="1,2", help="interpreter thread counts (default 1,2)")
    g.add_argument("--runs", type=int, default=200, help="timed runs per setting (default 200)")
    g.add_argument("--warmup", type=int, default=20, help="untimed runs first (default 20)")
    g.add_argument(
        "--device",
        metavar="adb[:SERIAL]",
        help="also time every file on a connected Android phone with LiteRT's benchmark_model "
        "(needs --benchmark-binary); the ship: choice then uses the phone's figures",
    )
    g.add_argument(
        "--benchmark-binary",
        metavar="PATH",
        help="--device: LiteRT's benchmark_model built for the phone (docs/export.md says where "
        "LiteRT publishes the arm64 one)",
    )
    g.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="the runs split into this many rounds, every file timed in turn within each round "
        "(default 5); a ratio inside the rounds' spread is no measurable difference",
    )
    g.add_argument(
        "--kernels",
        default="xnnpack",
        help=f"{', '.join(choices.KERNELS)}: XNNPACK delegate "
        "(LiteRT's default) and/or builtin kernels only",
    )
    g.add_argument(
        "--runtime",
        default="interpreter",
        help=f"comma-separated LiteRT runtime settings to time: {', '.join(choices.RUNTIMES)} "
        "(the Interpreter, the Interpreter with experimental_default_delegate_latest_features, "
        "ai-edge-litert's CompiledModel on the CPU); default interpreter",
    )
    g.add_argument(
        "--litert-benchmark", action="store_true", help="also run the litert-benchmark command"
    )
    g.add_argument(
        "--no-keras-latency",
        action="store_true",
        help="--from: do not time the Keras model (its float baseline; one process per thread count)",
    )
    p.add_argument(
        "--output",
        "-o",
        help="new run directory (default <RUN>-export, then -2, ...; --evaluate/--benchmark: "
        "where to write their JSON, default none)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace a finished run at -o")
    p.add_argument("--no-plot", action="store_true", help="skip export.png")
    p.add_argument(
        "--wide",
        action="store_true",
        help="print the full table (every latency setting, p95, gzip size) and the roofline",
    )
    p.add_argument(
        "--trust-model",
        action="store_true",
        help="load models that can run code (Lambda layers, tfmot wrappers); only for files you trust",
    )
    cli.add_verbosity(p, "no progress lines")
    return p


def check_flags(args, given: set[str]) -> None:
    """Refuses a flag the run does not read: e.g. --calibration-steps without a calibrated
    mode, --float-layers without int8, --modes with --evaluate, --split with --from.

    Args:
        args: The parsed command line.
        given: The options given explicitly (:func:`tfopt.core.flagcheck.explicit`).

    Raises:
        ConfigError: one line naming the flag, what reads it and the fix.
    """
    action = (
        _FROM if args.source is not None else _EVALUATE if args.evaluate is not None else _BENCHMARK
    )
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
    modes = choices.parse_modes(args.modes)
    flagcheck.refuse_unused(
        {flag: users for flag, users in FLAG_USERS.items() if set(users) <= set(_MODES)},
        modes,
        given,
        chosen_as=f"--modes {','.join(modes)}",
        fix=lambda flag, users: f"add {flagcheck.join(users)} to --modes, or drop {flag}",
    )


def _check_args(args, given: set[str]) -> None:
    """Every flag validated before TensorFlow is imported, so mistakes fail in a blink."""
    check_flags(args, given)  # parses --modes (for --from)
    choices.check_choice("io", args.io, choices.IO_TYPES, "--io")
    choices.check_choice("outputs", args.outputs, choices.OUTPUTS, "--outputs")
    choices.check_choice("quantizer", args.quantizer, choices.QUANTIZERS, "--quantizer")
    choices.check_choice("sparsity", args.sparsity, choices.SPARSITY_CHOICES, "--sparsity")
    choices.check_choice("kernels", args.kernels, choices.KERNELS, "--kernels")
    choices.parse_runtimes(args.runtime)
    choices.check_choice("split", args.split, ("test", "validation"), "--split")
    choices.parse_threads(args.threads)
    _data_config(args)
    for flag, value, low in (
        ("--calibration-steps", args.calibration_steps, 1),
        ("--runs", args.runs, 1),
        ("--warmup", args.warmup, 0),
        ("--rounds", args.rounds, 1),
        ("--eval-limit", args.eval_limit, 0),
        ("--max-float-layers", args.max_float_layers, 1),
        ("--search-limit", args.search_limit, 0),
        ("--auto-candidates", args.auto_candidates, 2),
    ):
        if value < low:
            raise ConfigError(f"{flag} {value} must be >= {low}")
    if args.source is not None:
        _check_quantizer_modes(args)
    if args.source is not None and not os.path.exists(args.source):
        raise ConfigError(
            f"{args.source!r} does not exist; give the -o directory of a training run or a model file"
        )
    for flag, path in (("--evaluate", args.evaluate), ("--benchmark", args.benchmark)):
        if path is not None and not os.path.isfile(path):
            raise ModelError(f"{flag} {path!r}: no such file; give the path of a .tflite file")
    if args.keras is not None and not os.path.exists(args.keras):
        raise ModelError(
            f"--keras {args.keras!r} does not exist; give a .keras file or a run directory"
        )


def _check_quantizer_modes(args) -> None:
    """ai-edge-quantizer present and in range, and a readable --recipe, before TensorFlow starts."""
    modes = choices.parse_modes(args.modes)
    if not any(choices.MODES.get(m).quantizer for m in modes):
        return
    from tfopt.export import aeq

    aeq.require()
    if "recipe" in modes:
        if not args.recipe:
            raise ConfigError(
                "--modes recipe quantizes as a recipe file says; give --recipe FILE.json"
            )
        aeq.read_recipe(args.recipe)


def _data_config(args):
    """The data a model file or a .tflite is evaluated on (--dataset, --data-dir, --image-size, ...)."""
    from tfopt import config as config_lib

    data = {"dataset": args.dataset}
    for flag, key in (
        ("data_dir", "data_dir"),
        ("image_size", "image_size"),
        ("channels", "channels"),
        ("normalize", "normalize"),
        ("input_scale", "input_scale"),
    ):
        if getattr(args, flag) is not None:
            data[key] = getattr(args, flag)
    return config_lib.from_dict({"data": data}).data


def _start_tensorflow() -> None:
    """Starts TensorFlow's runtime where its start-up notices (the CUDA probe) are filtered out.

    Only this call, the converter and the interpreter creation print such notices; everything
    else (a crash's message, a traceback) reaches stderr untouched.
    """
    from tfopt.core._keras import tf

    with native_stderr.filtered():
        tf.config.list_physical_devices()  # loads the device plugins: the CUDA probe prints here


def _body(args, given: set[str]) -> int:
    _check_args(args, given)
    return _work(args)


def _work(args) -> int:
    from tfopt.core.cpu import peak_summary
    from tfopt.core.fileio import write_json
    from tfopt.export import runner, ship, summary
    from tfopt.export.fidelity import Thresholds
    from tfopt.export.tflite import ConvertOptions
    from tfopt.runtime.strategy import is_chief
    from tfopt.runtime.tf_config import parse_tf_config

    _start_tensorflow()
    if not is_chief(parse_tf_config(os.environ.get("TF_CONFIG"))):
        print(f"{PROG}: not the chief task; the chief exports", file=sys.stderr)
        return 0
    bench = runner.BenchSettings(
        threads=tuple(choices.parse_threads(args.threads)),
        runs=args.runs,
        warmup=args.warmup,
        rounds=args.rounds,
        device=args.device or "",
        benchmark_binary=args.benchmark_binary or "",
        kernels=args.kernels,
        runtimes=tuple(choices.parse_runtimes(args.runtime)),
        litert_benchmark=args.litert_benchmark,
        keras=not args.no_keras_latency,
    )
    if args.source is not None:
        settings = runner.ExportSettings(
            modes=tuple(choices.parse_modes(args.modes)),
            options=ConvertOptions(
                io=args.io,
                allow_select_tf_ops=args.allow_select_tf_ops,
                sparsity=args.sparsity,
                strip_strings=args.strip_strings,
                recipe=args.recipe,
                quantizer=args.quantizer,
            ),
            calibration_steps=args.calibration_steps,
            outputs=args.outputs,
            thresholds=Thresholds(
                min_agreement=args.min_agreement, max_accuracy_drop_pt=args.max_accuracy_drop
            ),
            selective=not args.no_selective,
            max_float_layers=args.max_float_layers,
            float_layers=tuple(n.strip() for n in args.float_layers.split(",") if n.strip()),
            eval_limit=args.eval_limit,
            search_limit=args.search_limit,
            bench=bench,
            plot=not args.no_plot,
            trust_model=args.trust_model,
            auto_candidates=args.auto_candidates,
        )
        record = runner.run(
            args.source,
            settings,
            out_dir=args.output,
            overwrite=args.overwrite,
            data=_data_config(args),
        )
        export = record.section
        print(f"latency: batch 1 on {export['host']['cpu']}, {bench.rounds} interleaved rounds")
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
        print(
            f"{PROG}: wrote {os.path.join(out, 'run.json')} (the record) and export.md (the table)"
        )
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
    if args.evaluate is not None:
        row = runner.evaluate_file(
            args.evaluate,
            _data_config(args),
            limit=args.eval_limit,
            split=args.split,
            keras_path=args.keras,
            trust_model=args.trust_model,
        )
        print(summary.export_table([row]))
        if args.output:
            write_json(os.path.join(args.output, "evaluate.json"), row)
        return 0
    row = runner.benchmark_file(
        args.benchmark, bench, keras_path=args.keras, trust_model=args.trust_model
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
