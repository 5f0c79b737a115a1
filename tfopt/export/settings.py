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
    parse_runtimes,
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

    def __post_init__(self):
        outputs.check(self.outputs)


def settings_dict(settings: ExportSettings) -> dict:
    d = dataclasses.asdict(settings)
    d["modes"] = list(settings.modes)
    d["float_layers"] = list(settings.float_layers)
    d["bench"]["threads"] = list(settings.bench.threads)
    return d
