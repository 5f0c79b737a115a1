"""The ``export`` section: how ``tfopt.export`` converts, gates, scores and times a model.

A field's :attr:`~tfopt.config.Flag.read_by` names who reads it: an action (``--from``,
``--evaluate``, ``--benchmark``), a mode (``int8``) or a kind of mode of the export's registry
(``calibrated``, ``int_io``, ``converter``, ``both_quantizers``; spelled out over
:data:`tfopt.export.choices.MODES` by the command line).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tfopt.config.fields import flag
from tfopt.core.errors import ConfigError

#: What --modes means when not given. The dynamic-range entry is dynamic_auto: int8 arithmetic only
#: where it is measured not slower than float (plain dynamic is asked by name).
DEFAULT_MODES = ("float32", "dynamic_auto", "float16", "int8", "int8_auto", "int16x8")
#: The names of the modes of tfopt.export.choices.MODES, in its order (a test holds them equal).
MODE_NAMES = (
    "float32",
    "dynamic",
    "float16",
    "int8",
    "int8_auto",
    "int16x8",
    "dynamic_selective",
    "dynamic_auto",
    "int8_weights",
    "int4_weights",
    "recipe",
)
IO_TYPES = ("float", "int8", "uint8")
#: Who quantizes the modes both can make (--quantizer): the TFLite converter, or LiteRT Quantizer
#: (ai-edge-quantizer) from the float32 .tflite. The ai-edge-quantizer modes are LiteRT Quantizer's
#: only.
QUANTIZERS = ("converter", "litert")
#: What an exported classifier gives out (``--outputs``; tfopt.export.outputs).
OUTPUTS = ("probabilities", "logits")
SPARSITY_CHOICES = ("auto", "on", "off")
KERNELS = ("xnnpack", "builtin", "both")
SPLITS = ("test", "validation")
# LiteRT runtime settings a latency can be timed with (--runtime): the Interpreter with its default
# XNNPACK delegate (and --kernels), the Interpreter's experimental_default_delegate_latest_features,
# and ai-edge-litert's CompiledModel on the CPU (its XNNPACK with default CpuOptions).
RUNTIMES = ("interpreter", "latest", "compiled")
#: Interleaved rounds a latency's runs are split over (tfopt.export.rounds).
ROUNDS = 5

FROM, EVALUATE, BENCHMARK = "--from", "--evaluate", "--benchmark"
LATENCY = (FROM, BENCHMARK)


def _conv(default, name: str, help: str, read_by=(FROM,), **kw):
    return flag(default, name, help, group="conversion (--from)", read_by=read_by, **kw)


def _gate(default, name: str, help: str, read_by=(FROM,), **kw):
    return flag(default, name, help, group="fidelity gate (--from)", read_by=read_by, **kw)


def _time(default, name: str, help: str, **kw):
    return flag(default, name, help, group="latency", read_by=LATENCY, **kw)


@dataclass(frozen=True)
class ExportConfig:
    """How ``tfopt.export`` converts, gates, scores and times: the one home of every default."""

    modes: str = _conv(
        ",".join(DEFAULT_MODES), "--modes", "comma-separated PTQ modes", read_by=(FROM,)
    )
    io: str = _conv(
        "float", "--io", "int8 model input/output type", read_by=("int_io",), choices=IO_TYPES
    )
    quantizer: str = _conv(
        "converter",
        "--quantizer",
        "who quantizes dynamic, float16, int8 and int16x8: converter (the TFLite converter; the "
        "better path for each in benchmark B9q) or litert (LiteRT Quantizer, ai-edge-quantizer, "
        "from the float32 model; float I/O)",
        read_by=("both_quantizers",),
        choices=QUANTIZERS,
    )
    outputs: str = _conv(
        "probabilities",
        "--outputs",
        "what the exported files give out: probabilities (softmax; what apps and MediaPipe "
        "Tasks expect) or logits",
        choices=OUTPUTS,
    )
    calibration_steps: int = _conv(
        25,
        "--calibration-steps",
        "representative batches drawn from the run's training pipeline",
        read_by=("calibrated",),
    )
    float_layers: str = _conv(
        "",
        "--float-layers",
        "also write an int8 model with these Keras layers kept in float (e.g. conv0)",
        read_by=("int8",),
        metavar="LAYER,...",
    )
    allow_select_tf_ops: bool = _conv(
        False,
        "--allow-select-tf-ops",
        "let ops without a builtin kernel run as TF Select (Flex) ops",
    )
    sparsity: str = _conv(
        "auto",
        "--sparsity",
        "sparse weight encoding: auto (when >= 50%% zeros and smaller), on, off",
        read_by=("converter",),
        choices=SPARSITY_CHOICES,
    )
    recipe: str = _conv(
        "",
        "--recipe",
        "mode recipe: an ai-edge-quantizer recipe (e.g. the model_int8_auto_recipe.json an "
        "export wrote, edited or not)",
        read_by=("recipe",),
        metavar="FILE.json",
    )
    strip_strings: bool = _conv(
        False,
        "--strip-strings",
        "strip tensor names and other strings the runtime does not need (smaller files)",
    )
    auto_candidates: int = _conv(
        5,
        "--auto-candidates",
        "int8_auto: mixed models timed and gated end to end (>= 2)",
        read_by=("int8_auto",),
    )
    min_agreement: float = _gate(0.99, "--min-agreement", "top-1 agreement with Keras")
    max_accuracy_drop: float = _gate(0.5, "--max-accuracy-drop", "accuracy points it may lose")
    selective: bool = _gate(
        True,
        "--no-selective",
        "do not retry a failing int8 with float layers",
        read_by=("int8",),
    )
    max_float_layers: int = _gate(
        4, "--max-float-layers", "selective search bound", read_by=("int8",)
    )
    search_limit: int = _gate(
        2000,
        "--search-limit",
        "validation examples for the search",
        read_by=("int8", "int8_auto"),
    )
    eval_limit: int = flag(
        0,
        "--eval-limit",
        "score only the first N test examples (0, the default: all)",
        group="evaluation",
        read_by=(FROM, EVALUATE),
    )
    split: str = flag(
        "test",
        "--split",
        "--evaluate: the split scored",
        group="evaluation",
        read_by=(EVALUATE,),
        choices=SPLITS,
    )
    keras: str = flag(
        "",
        "--keras",
        "--evaluate/--benchmark: Keras model to compare with / cost",
        group="evaluation",
        read_by=(EVALUATE, BENCHMARK),
        metavar="MODEL",
    )
    threads: str = _time("1,2", "--threads", "interpreter thread counts")
    runs: int = _time(200, "--runs", "timed runs per setting")
    warmup: int = _time(20, "--warmup", "untimed runs first")
    rounds: int = _time(
        ROUNDS,
        "--rounds",
        "the runs split into this many rounds, every file timed in turn within each round; a "
        "ratio inside the rounds' spread is no measurable difference",
    )
    device: str = _time(
        "",
        "--device",
        "also time every file on a connected Android phone with LiteRT's benchmark_model (needs "
        "--benchmark-binary); the ship: choice then uses the phone's figures",
        metavar="adb[:SERIAL]",
    )
    benchmark_binary: str = _time(
        "",
        "--benchmark-binary",
        "--device: LiteRT's benchmark_model built for the phone (docs/export.md says where LiteRT "
        "publishes the arm64 one)",
        metavar="PATH",
    )
    kernels: str = _time(
        "xnnpack",
        "--kernels",
        "XNNPACK delegate (LiteRT's default) and/or builtin kernels only",
        choices=KERNELS,
    )
    runtimes: str = _time(
        "interpreter",
        "--runtime",
        "comma-separated LiteRT runtime settings to time: interpreter, latest, compiled (the "
        "Interpreter, the Interpreter with experimental_default_delegate_latest_features, "
        "ai-edge-litert's CompiledModel on the CPU)",
    )
    litert_benchmark: bool = _time(
        False, "--litert-benchmark", "also run the litert-benchmark command"
    )
    keras_latency: bool = flag(
        True,
        "--no-keras-latency",
        "--from: do not time the Keras model (its float baseline; one process per thread count)",
        group="latency",
        read_by=(FROM,),
    )
    plot: bool = flag(True, "--no-plot", "skip export.png", group="output", read_by=(FROM,))
    trainable: bool = flag(
        False,
        "--trainable",
        "also write model_trainable.tflite, trainable in LiteRT: infer, train (one SGD step of "
        "the last Dense layer, the rest frozen), save and restore signatures",
        group="on-device training (--from)",
        read_by=(FROM,),
    )
    trainable_lr: float = flag(
        0.01,
        "--trainable-lr",
        "--trainable: the learning rate of the train signature's SGD step",
        group="on-device training (--from)",
        read_by=(FROM,),
        metavar="LR",
    )


def check_choice(what: str, value: str, choices: Sequence[str], flag: str) -> str:
    """Returns ``value`` or raises ConfigError naming the valid choices and the flag."""
    if value not in choices:
        raise ConfigError(f"unknown {what} {value!r}; choose one of {', '.join(choices)} ({flag})")
    return value


def parse_modes(text: str | Sequence[str]) -> list[str]:
    """Parses ``"float32,int8"`` (or a list) into known modes, keeping order, dropping repeats.

    Raises:
        ConfigError: an unknown mode, or no mode at all.
    """
    items = text.split(",") if isinstance(text, str) else list(text)
    modes: list[str] = []
    for item in (i.strip() for i in items):
        if item and item not in modes:
            modes.append(check_choice("mode", item, MODE_NAMES, "--modes"))
    if not modes:
        raise ConfigError(
            f"no mode given; choose from {', '.join(MODE_NAMES)} (--modes float32,int8)"
        )
    return modes


def parse_runtimes(text: str | Sequence[str]) -> list[str]:
    """Parses ``"interpreter,compiled"`` into known runtime settings (order kept, repeats dropped).

    Raises:
        ConfigError: an unknown runtime, or none.
    """
    items = text.split(",") if isinstance(text, str) else list(text)
    out: list[str] = []
    for item in (i.strip() for i in items):
        if item and item not in out:
            out.append(check_choice("runtime", item, RUNTIMES, "--runtime"))
    if not out:
        raise ConfigError(f"no runtime given; choose from {', '.join(RUNTIMES)} (--runtime)")
    return out


def parse_threads(text: str | Sequence[int]) -> list[int]:
    """Parses ``"1,2"`` into distinct thread counts (each >= 1).

    Raises:
        ConfigError: not a comma-separated list of positive integers.
    """
    items = text.split(",") if isinstance(text, str) else list(text)
    out: list[int] = []
    for item in items:
        try:
            n = int(str(item).strip())
        except ValueError:
            raise ConfigError(
                f"thread count {item!r} is not an integer; give e.g. --threads 1,2"
            ) from None
        if n < 1:
            raise ConfigError(f"thread count {n} must be >= 1; give e.g. --threads 1,2")
        if n not in out:
            out.append(n)
    if not out:
        raise ConfigError("no thread count given; use e.g. --threads 1,2")
    return out
