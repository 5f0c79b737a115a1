"""What an export does and how it measures: the settings ``tfopt export`` and the pipeline give
the export runner."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from tfopt.core.errors import ConfigError
from tfopt.export import (
    fidelity,
    outputs,
    tflite,
)
from tfopt.export import rounds as rounds_lib
from tfopt.export.choices import (
    DEFAULT_MODES,
    KERNELS,
    check_choice,
    parse_modes,
    parse_runtimes,
    parse_threads,
)


@dataclass(frozen=True)
class BenchSettings:
    """How latency is measured."""

    threads: tuple[int, ...] = (1, 2)
    runs: int = 200
    warmup: int = 20
    rounds: int = rounds_lib.ROUNDS  # interleaved rounds the runs are split over
    kernels: str = "xnnpack"  # xnnpack (LiteRT's default) | builtin (no delegate) | both
    runtimes: tuple[str, ...] = ("interpreter",)  # and/or latest, compiled (choices.RUNTIMES)
    litert_benchmark: bool = False  # also run the `litert-benchmark` command
    device: str = ""  # adb or adb:SERIAL: also time on that Android device (see export.device)
    benchmark_binary: str = ""  # LiteRT's benchmark_model for the device
    keras: bool = (
        True  # also time the Keras model (float baseline), one child process per thread count
    )

    def __post_init__(self):
        check_choice("kernels", self.kernels, KERNELS, "--kernels")
        parse_runtimes(self.runtimes)
        if not self.threads:
            raise ConfigError("no thread count given; use e.g. --threads 1,2")

    def settings(self) -> list[tuple[str, str, bool, int]]:
        """``(key, runtime, xnnpack, threads)`` for every measurement, e.g.
        ``("xnnpack/1t", "interpreter", True, 1)`` or ``("compiled/2t", "compiled", True, 2)``."""
        kinds = {"xnnpack": [True], "builtin": [False], "both": [True, False]}[self.kernels]
        out = []
        for runtime in self.runtimes:
            if runtime == "interpreter":
                out += [
                    (f"{'xnnpack' if x else 'builtin'}/{t}t", runtime, x, t)
                    for x in kinds
                    for t in self.threads
                ]
            else:
                out += [(f"{runtime}/{t}t", runtime, True, t) for t in self.threads]
        return out


@dataclass(frozen=True)
class ExportSettings:
    """Everything ``export_run`` needs besides the run."""

    modes: tuple[str, ...] = DEFAULT_MODES
    options: tflite.ConvertOptions = field(default_factory=tflite.ConvertOptions)
    calibration_steps: int = 25
    thresholds: fidelity.Thresholds = field(default_factory=fidelity.Thresholds)
    selective: bool = True  # retry a failing int8 with the worst layers in float
    max_float_layers: int = 4
    float_layers: tuple[str, ...] = ()  # Keras layers to keep in float in an extra int8 model
    auto_candidates: int = 5  # int8_auto: mixed models timed and gated end to end
    auto_rounds: int = 3  # int8_auto: interleaved timing rounds (per op and end to end)
    eval_limit: int = 0  # test examples to score (0 = the whole split)
    search_limit: int = 2000  # validation examples for the selective search
    bench: BenchSettings = field(default_factory=BenchSettings)
    plot: bool = True
    trust_model: bool = False
    outputs: str = "probabilities"  # what the exported files give out: probabilities | logits
    trainable: bool = False  # also write model_trainable.tflite (tfopt.export.trainable)
    trainable_lr: float = 0.01  # the SGD learning rate of its train signature

    def __post_init__(self):
        outputs.check(self.outputs)


def settings_dict(settings: ExportSettings) -> dict:
    d = dataclasses.asdict(settings)
    d["modes"] = list(settings.modes)
    d["float_layers"] = list(settings.float_layers)
    d["bench"]["threads"] = list(settings.bench.threads)
    return d


def bench_from(e) -> BenchSettings:
    """The :class:`BenchSettings` of an ``export`` config section (:class:`tfopt.config.ExportConfig`).

    Raises:
        ConfigError: a thread count or runtime that does not parse.
    """
    return BenchSettings(
        threads=tuple(parse_threads(e.threads)),
        runs=e.runs,
        warmup=e.warmup,
        rounds=e.rounds,
        device=e.device,
        benchmark_binary=e.benchmark_binary,
        kernels=e.kernels,
        runtimes=tuple(parse_runtimes(e.runtimes)),
        litert_benchmark=e.litert_benchmark,
        keras=e.keras_latency,
    )


def settings_from(e, trust_model: bool = False) -> ExportSettings:
    """The :class:`ExportSettings` of an ``export`` config section.

    Args:
        e: The section (:class:`tfopt.config.ExportConfig`).
        trust_model: Load models that can run code (``model.trust``).

    Raises:
        ConfigError: a mode, thread count or runtime that does not parse.
    """
    return ExportSettings(
        modes=tuple(parse_modes(e.modes)),
        options=tflite.ConvertOptions(
            io=e.io,
            allow_select_tf_ops=e.allow_select_tf_ops,
            sparsity=e.sparsity,
            strip_strings=e.strip_strings,
            recipe=e.recipe,
            quantizer=e.quantizer,
        ),
        calibration_steps=e.calibration_steps,
        outputs=e.outputs,
        thresholds=fidelity.Thresholds(
            min_agreement=e.min_agreement, max_accuracy_drop_pt=e.max_accuracy_drop
        ),
        selective=e.selective,
        max_float_layers=e.max_float_layers,
        float_layers=tuple(n.strip() for n in e.float_layers.split(",") if n.strip()),
        eval_limit=e.eval_limit,
        search_limit=e.search_limit,
        bench=bench_from(e),
        plot=e.plot,
        trust_model=trust_model,
        auto_candidates=e.auto_candidates,
        trainable=e.trainable,
        trainable_lr=e.trainable_lr,
    )
