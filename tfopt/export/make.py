"""Making one mode's file: its row (size, evaluation, gate), and the files searched rather than
converted: int8 with its worst layers in float (selective), ``int8_auto``, and int8 with chosen
layers in float."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from collections.abc import Callable

from tfopt.core._keras import keras

import numpy as np

from tfopt.config import DataConfig
from tfopt.core.fileio import write_bytes, write_json
from tfopt.data.sources import input_contract, prepare
from tfopt.export import (
    auto,
    device,
    fidelity,
    keras3,
    outputs,
    tflite,
)
from tfopt.export import benchmark as bench
from tfopt.export.choices import MODES
from tfopt.export.evaluate import (
    EvalResult,
    TFLiteModel,
    evaluate,
    keras_outputs,
    load_split,
)
from tfopt.export.settings import ExportSettings
from tfopt.models import inputs
from tfopt.models.io import saved_by_keras3

log = logging.getLogger(__name__)


def _is_tf_keras(model) -> bool:
    return isinstance(model, keras.Model)  # not a Keras 3 model reached through a SavedModel


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


@dataclasses.dataclass
class Inputs:
    """What every mode of one export reads: the model as exported (its outputs planned), the data
    as fed (input scale settled), the test split and the Keras model's outputs on it, the
    calibration batches, and the input contract written beside the files."""

    model: keras.Model
    data_cfg: DataConfig
    info: object
    decided: dict | None
    x_test: np.ndarray
    y_test: np.ndarray
    reference: np.ndarray
    calibration: list | None
    plan: outputs.Plan
    contract: dict
    cost: dict


def read_inputs(run, model, qat: bool, modes: list[str], settings: ExportSettings, say) -> Inputs:
    """Settles the input side, reads the test split, plans the outputs, draws calibration batches."""
    data_cfg: DataConfig = run.config.data
    info = prepare(data_cfg)
    decided = None
    if _is_tf_keras(model) and not qat:  # a QAT model's input side fake-quantizes
        origin = "flag" if run.model_file else "config"
        if saved_by_keras3(run.model_path):  # the wrapped SavedModel hides its layers: ask Keras 3
            side = keras3.input_side(
                run.model_path, info.image_shape, trust_model=settings.trust_model
            )
        else:
            side = inputs.measure(model, info.image_shape)
        data_cfg, decided = inputs.resolve(data_cfg, side, run.source, origin)
    say(f"reading the test split of {data_cfg.dataset}")
    x_test, y_test = load_split(data_cfg, "test", settings.eval_limit, info)
    plan = outputs.plan(model, settings.outputs, x_test, settings.options.io != "float")
    model = plan.model
    say(f"the exported files give {plan.note}")
    reference = keras_outputs(model, x_test)
    calibration = None
    if not qat and any(MODES.get(m).calibration for m in modes):
        say(f"drawing {settings.calibration_steps} calibration batches from the training pipeline")
        calibration = tflite.calibration_batches(data_cfg, settings.calibration_steps, info)
        warning = inputs.probe(model, calibration[0]) if decided and calibration else None
        if warning:
            log.warning(warning)
    # What a user of the .tflite files needs besides them: the input contract and the class names.
    contract = {**input_contract(data_cfg, info), **({"model_input": decided} if decided else {})}
    return Inputs(
        model,
        data_cfg,
        info,
        decided,
        x_test,
        y_test,
        reference,
        calibration,
        plan,
        contract,
        bench.keras_cost(model),
    )


def make_files(
    got: Inputs,
    qat: bool,
    modes: list[str],
    settings: ExportSettings,
    out_dir: str,
    keras: bench.KerasLatency | None,
    say: Callable[[str], None],
    notes: list[str],
    phone: device.Device | None,
) -> list[dict]:
    """One row per file: every mode converted (or searched), written, evaluated and gated."""
    model, calibration = got.model, got.calibration
    x_test, y_test, reference = got.x_test, got.y_test, got.reference
    rows: list[dict] = []
    validation = Validation(model, got.data_cfg, got.info, settings.search_limit)
    for i, mode in enumerate(modes, 1):

        def step(msg: str, i: int = i) -> None:
            say(f"[{i}/{len(modes)}] {msg}")

        if MODES.get(mode).latency_aware:
            if keras:
                keras.ready()  # nothing else may run while this process times
            rows.append(
                auto_row(
                    model,
                    calibration,
                    settings,
                    validation,
                    x_test,
                    y_test,
                    reference,
                    out_dir,
                    step,
                    notes,
                    phone,
                )
            )
            continue
        rows.extend(_converted(got, qat, mode, settings, out_dir, step, say, notes, validation))
    return rows


def _converted(
    got: Inputs,
    qat: bool,
    mode: str,
    settings: ExportSettings,
    out_dir: str,
    step: Callable[[str], None],
    say: Callable[[str], None],
    notes: list[str],
    validation: Validation,
) -> list[dict]:
    """A converted mode's row (its file written, evaluated and gated), and for int8 the rows of
    the files made from it: selective (when int8 fails the gate) and partial (chosen layers)."""
    model, calibration = got.model, got.calibration
    x_test, y_test, reference = got.x_test, got.y_test, got.reference
    out: list[dict] = []
    step(f"{mode}: converting")
    started = time.perf_counter()
    conv = tflite.convert(model, mode, calibration=calibration, options=settings.options)
    convert_s = time.perf_counter() - started
    file = f"model_{mode}.tflite"
    write_bytes(os.path.join(out_dir, file), conv.content)
    extra = {}
    if conv.recipe is not None:  # beside the model: readable, editable, --recipe re-applies it
        extra["recipe"] = f"model_{mode}_recipe.json"
        write_json(os.path.join(out_dir, extra["recipe"]), conv.recipe)
    step(f"{mode}: evaluating on {len(y_test)} test examples")
    result = evaluate(TFLiteModel(conv.content), x_test, y_test, reference)
    gate = fidelity.check(result, settings.thresholds)
    step(f"{mode}: benchmarking")
    out.append(
        row_of(
            mode,
            conv.io,
            file,
            conv.content,
            result,
            gate,
            quantizer=conv.quantizer,
            sparse=conv.sparse,
            qat=conv.qat,
            convert_seconds=round(convert_s, 2),
            notes=conv.notes,
            **extra,
        )
    )
    if mode == "int8" and not gate.passed and settings.selective and not qat:
        out.append(
            selective(
                model,
                calibration,
                conv,
                result,
                settings,
                validation,
                x_test,
                y_test,
                reference,
                out_dir,
                say,
                notes,
            )
        )
    if mode == "int8" and settings.float_layers and not qat:
        out.append(
            partial(model, calibration, conv, settings, x_test, y_test, reference, out_dir, say)
        )
    return out
