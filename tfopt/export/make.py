"""Making one mode's file: its row (size, evaluation, gate), and the files searched rather than
converted: int8 with its worst layers in float (selective), ``int8_auto``, and int8 with chosen
layers in float."""

from __future__ import annotations

import functools
import os
import time

from tfopt.config import DataConfig
from tfopt.core.fileio import write_bytes, write_json
from tfopt.export import (
    auto,
    device,
    fidelity,
    tflite,
)
from tfopt.export import benchmark as bench
from tfopt.export.evaluate import (
    EvalResult,
    TFLiteModel,
    evaluate,
    keras_outputs,
    load_split,
)
from tfopt.export.settings import ExportSettings


def row_of(
    mode: str,
    converted_io: str,
    file: str,
    content: bytes,
    result: EvalResult,
    gate: fidelity.GateResult | None,
    quantizer: str | None = "converter",
    **extra,
) -> dict:
    """A mode's row; its latency comes later (:func:`measured`), all files timed together.

    ``quantizer`` is who quantized the file: ``converter`` (the TFLite converter and its
    quantization debugger), ``litert`` (LiteRT Quantizer) or None (float32).
    """
    return {
        "mode": mode,
        "io": converted_io,
        "quantizer": quantizer,
        "file": file,
        **bench.file_sizes(content),
        "eval": result.to_dict(),
        "gate": gate.to_dict() if gate else None,
        **extra,
    }


class Validation:
    """The validation split the searches score candidates on (never the test split), read on first use."""

    def __init__(self, model, data_cfg: DataConfig, info, limit: int):
        self.model, self.data_cfg, self.info, self.limit = model, data_cfg, info, limit
        self._data = None

    @property
    def examples(self) -> int:
        return int(len(self._load()[1]))

    def _load(self):
        if self._data is None:
            x, y = load_split(self.data_cfg, "validation", self.limit, self.info)
            self._data = (x, y, keras_outputs(self.model, x))
        return self._data

    def score(self, content: bytes) -> EvalResult:
        """A candidate's accuracy and agreement with the Keras model on the validation split."""
        x, y, ref = self._load()
        return evaluate(TFLiteModel(content), x, y, ref)


def selective(
    model,
    calibration,
    conv,
    full: EvalResult,
    settings: ExportSettings,
    validation: Validation,
    x_test,
    y_test,
    reference,
    out_dir,
    say,
    notes,
) -> dict:
    say("int8 failed the fidelity gate: ranking layers with the quantization debugger")
    found = fidelity.selective_search(
        model,
        calibration,
        validation.score,
        settings.thresholds,
        io_type=conv.io,
        max_float_layers=settings.max_float_layers,
    )
    found.content = tflite.finish(found.content, settings.options)
    file = "model_int8_selective.tflite"
    write_bytes(os.path.join(out_dir, file), found.content)
    result = evaluate(TFLiteModel(found.content), x_test, y_test, reference)
    gate = fidelity.check(result, settings.thresholds)
    chosen = found.trials[found.chosen]
    trade = (
        f"int8 failed the gate ({'; '.join(fidelity.check(full, settings.thresholds).reasons)}); leaving "
        f"{len(chosen.float_layers)} layer(s) in float ({', '.join(chosen.float_layers)}) gives test agreement "
        f"{result.agreement:.4f} and accuracy {100 * result.accuracy:.2f}% at {len(found.content) / 1024:.1f} KiB "
        f"instead of {len(conv.content) / 1024:.1f} KiB: gate {'passed' if gate.passed else 'still failed'}"
    )
    notes.append(trade)
    say(trade)
    return row_of(
        "int8-selective",
        io_of(found.content),
        file,
        found.content,
        result,
        gate,
        selective={
            **found.to_dict(),
            "search_split": "validation",
            "search_examples": validation.examples,
        },
        notes=[trade],
    )


def auto_row(
    model,
    calibration,
    settings: ExportSettings,
    validation: Validation,
    x_test,
    y_test,
    reference,
    out_dir,
    say,
    notes,
    phone: device.Device | None = None,
) -> dict:
    """int8_auto: the latency-aware search (ops timed alone at the first --threads count,
    candidates at every one: on the phone when ``--device`` gave one), then the usual row."""
    b = settings.bench
    started = time.perf_counter()
    on_phone = None
    if phone is not None:
        on_phone = functools.partial(phone.p50, runs=b.runs, warmup=b.warmup)
    found = auto.search(
        model,
        calibration,
        validation.score,
        settings.thresholds,
        io_type=settings.options.io,
        threads=b.threads,
        rounds=settings.auto_rounds,
        runs=b.runs,
        warmup=b.warmup,
        max_candidates=settings.auto_candidates,
        time_fn=on_phone,
    )
    content = tflite.finish(found.content, settings.options)
    search_s = time.perf_counter() - started
    file = "model_int8_auto.tflite"
    write_bytes(os.path.join(out_dir, file), content)
    say("int8_auto: evaluating the chosen model on the test split")
    result = evaluate(TFLiteModel(content), x_test, y_test, reference)
    gate = fidelity.check(result, settings.thresholds)
    trade = auto.explain(found, b.threads)
    notes.append(trade)
    say(trade)
    recipe = "model_int8_auto_recipe.json"
    write_json(os.path.join(out_dir, recipe), auto.recipe(found))
    return row_of(
        "int8_auto",
        io_of(content),
        file,
        content,
        result,
        gate,
        float_nodes=found.candidates[found.chosen].float_nodes,
        recipe=recipe,
        search_seconds=round(search_s, 2),
        auto={
            **found.to_dict(),
            "search_split": "validation",
            "search_examples": validation.examples,
        },
        notes=[trade],
    )


def io_of(content: bytes) -> str:
    # The converter keeps float I/O when the first/last op stays float, whatever was asked.
    dtype = TFLiteModel(content).input_dtype
    return "float" if dtype.kind == "f" else str(dtype)


def partial(
    model, calibration, conv, settings: ExportSettings, x_test, y_test, reference, out_dir, say
) -> dict:
    layers = list(settings.float_layers)
    say(f"int8 with {', '.join(layers)} kept in float")
    debugger = fidelity.quantization_debugger(model, calibration, calibration[:1])
    nodes = fidelity.nodes_for_layers(fidelity.rank_layers(debugger), layers)
    content = tflite.finish(fidelity.requantize(debugger, nodes, conv.io), settings.options)
    file = "model_int8_partial.tflite"
    write_bytes(os.path.join(out_dir, file), content)
    result = evaluate(TFLiteModel(content), x_test, y_test, reference)
    return row_of(
        f"int8+float:{','.join(layers)}",
        io_of(content),
        file,
        content,
        result,
        fidelity.check(result, settings.thresholds),
        float_layers=layers,
        float_nodes=nodes,
    )
