"""Exporting a run: convert every mode, evaluate, gate, benchmark, write artifacts and export.json.

``export_run`` is what ``python -m tfopt.export --from RUN`` does. For each mode: convert ->
write ``model_<mode>.tflite`` atomically -> evaluate on the held-out test split against the Keras
model -> fidelity gate -> (int8 failing the gate: selective quantization, searched on the
validation split, the chosen model re-scored on test) -> latency per thread count and kernel
setting. ``int8_auto`` is searched, not converted (:mod:`tfopt.export.auto`: per-op timings, then
candidates timed end to end and gated on the validation split); its row carries the timings and
the decision. Then ``export.json``, ``export.md`` (the table) and ``export.png`` go next to the models.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tfopt._keras import keras

import numpy as np

from tfopt.compress.common import strip_wrappers
from tfopt.config import DataConfig, RunConfig
from tfopt.cpu import has_int8_dot, host_label, host_words, peak_summary, peaks
from tfopt.data.sources import input_contract, prepare
from tfopt.errors import ConfigError
from tfopt.export import (
    auto,
    device,
    fidelity,
    keras3,
    metadata,
    outputs,
    roofline,
    ship,
    summary,
    tflite,
)
from tfopt.export import benchmark as bench
from tfopt.export import rounds as rounds_lib
from tfopt.export.choices import (
    DEFAULT_MODES,
    KERNELS,
    MODES,
    check_choice,
    parse_modes,
    parse_runtimes,
)
from tfopt.export.evaluate import (
    EvalResult,
    TFLiteModel,
    evaluate,
    keras_outputs,
    load_split,
    read_tflite,
)
from tfopt.fileio import write_bytes, write_json, write_text
from tfopt.log import PROGRESS
from tfopt.models import inputs
from tfopt.models.io import load_model, saved_by_keras3
from tfopt.runs import RunRecord, fingerprint, fresh_dir, load_input, refuse_input_as_output
from tfopt.runtime import quality
from tfopt.runtime.job import run_record
from tfopt.runtime.rundir import RunDir

log = logging.getLogger(__name__)


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


def load_source_model(path: str, trust_model: bool = False) -> keras.Model:
    """Loads a run's model (tfmot wrappers deserialized, see ``io.load_model``).

    Pruning and clustering wrappers are stripped (the .tflite holds the plain layers with the
    sparse / clustered weights); QAT wrappers stay, they carry the ranges int8 conversion uses.
    """
    return strip_wrappers(load_model(path, trust_model=trust_model))


def _litert_benchmark(settings: BenchSettings, path: str) -> dict:
    """The ``litert-benchmark`` cross-check figures of one file, when asked and installed."""
    out = {}
    if settings.litert_benchmark:
        for t in settings.threads:
            res = bench.litert_benchmark(
                path, threads=t, runs=settings.runs, warmup=settings.warmup
            )
            if res is not None:
                out[f"litert-benchmark/{t}t"] = res
    return out


def _time(
    files: dict[str, str], settings: BenchSettings, say=None, phone: device.Device | None = None
) -> tuple[dict, dict]:
    """Every file timed (identical graphs once, interleaved rounds; see :mod:`rounds`), and on
    the phone when one is connected (``device/<N>t``).

    Args:
        files: Name -> .tflite path.
        phone: A connected device (``--device``).

    Returns:
        ``(latency, same)``: per name, ``{setting key: figures (with kernels)}``; per name of a
        file whose graph an earlier one has, that file's name.
    """
    contents = {}
    for name, path in files.items():
        with open(path, "rb") as f:
            contents[name] = f.read()
    figures, same = rounds_lib.time_files(
        contents,
        settings.settings(),
        warmup=settings.warmup,
        runs=settings.runs,
        rounds=settings.rounds,
        say=say,
    )
    for name, path in files.items():
        figures[name] = {**figures[name], **_litert_benchmark(settings, path)}
    if phone is not None:
        for name, path in files.items():
            if name in same:
                continue
            for t in settings.threads:
                if say:
                    say(f"timing {os.path.basename(path)} on {phone.label} at {t} thread(s)")
                figures[name][f"device/{t}t"] = phone.time(
                    path, threads=t, runs=settings.runs, warmup=settings.warmup
                )
        for name, twin in same.items():
            figures[name] = figures[twin]
    return figures, same


def _measured(
    row: dict, content: bytes, latency: dict, same_as: str | None = None, roof: dict | None = None
) -> dict:
    """``row`` with its latency, kernels, roofline (``roof``: its twin's) and fastest runtime."""
    row["kernels"] = next(
        (v["kernels"] for v in latency.values() if "kernels" in v and v["kernels"]["xnnpack"]), None
    )
    row["latency"] = {
        k: {kk: vv for kk, vv in v.items() if kk != "kernels"} for k, v in latency.items()
    }
    row["roofline"] = roof if roof is not None else roofline.measure(content, latency)
    row["fastest_runtime"] = summary.fastest_runtime(row)
    if same_as:
        row["same_graph_as"] = same_as
    return row


def _row(
    mode: str,
    converted_io: str,
    file: str,
    content: bytes,
    result: EvalResult,
    gate: fidelity.GateResult | None,
    quantizer: str | None = "converter",
    **extra,
) -> dict:
    """A mode's row; its latency comes later (:func:`_measured`), all files timed together.

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


def run(
    run_dir: str,
    settings: ExportSettings = ExportSettings(),
    out_dir: str | None = None,
    *,
    overwrite: bool = False,
    data: DataConfig | None = None,
) -> RunRecord:
    """Exports one run (or model file) to .tflite in every requested mode, measures each and commits a new run directory.

    Args:
        run_dir: A run directory (``run.json`` + ``model.keras``), or a model file (``.keras``,
            ``.h5``, a SavedModel directory) to export with the data ``data`` describes.
        settings: Modes, conversion options, gate, benchmark settings.
        out_dir: The new run directory (default ``<run_dir>-export``, or ``<file without suffix>-export``,
            then ``-export-2``, ...).
        overwrite: Replace a finished run at ``out_dir``.
        data: A model file's data: evaluation, calibration and the input scaling (a run's own otherwise).

    Returns:
        The RunRecord of ``run.json``; its ``export`` section holds every mode's row (size,
        accuracy, agreement, gate, latency), the notes and the printed table.

    Raises:
        TfoptError: bad run, data, options, or an unconvertible model.
    """
    say = functools.partial(log.log, PROGRESS)  # shown unless --quiet
    modes = parse_modes(settings.modes)
    run = load_input(run_dir, RunConfig(data=data) if data is not None else None)
    pick = (lambda: fresh_dir(run.stem.rstrip(os.sep) + "-export")) if not out_dir else None
    out = os.path.abspath(out_dir or pick())
    refuse_input_as_output(out, [run.source])
    options = {"source": run.source, "source_digest": run.digest, **_settings_dict(settings)}
    rd = RunDir(
        out, fingerprint("export", options), {"export": options}, overwrite=overwrite, pick=pick
    )
    scratch = tempfile.mkdtemp(prefix="tfopt-export-")
    try:
        rd.check()
        if saved_by_keras3(run.model_path):
            say(f"{run.model_path} was saved by Keras 3: exporting it as a SavedModel with Keras 3")
            model = keras3.as_tf_keras(
                keras3.to_saved_model(
                    run.model_path,
                    os.path.join(scratch, "keras3"),
                    trust_model=settings.trust_model,
                ),
                os.path.basename(run.model_path),
            )
            # tf_keras cannot load the file to time it, and the debugger's layers are one opaque call.
            settings = dataclasses.replace(
                settings,
                bench=dataclasses.replace(settings.bench, keras=False),
                selective=False,
                float_layers=(),
            )
        else:
            model = load_source_model(run.model_path, settings.trust_model)
        qat = tflite.is_qat_model(model)
        tflite.check_modes_for(model, modes)  # refuse before spending minutes on the others
        b = settings.bench
        # A phone that is missing, unauthorized or full is said before minutes of converting.
        phone = device.Device.connect(b.device, b.benchmark_binary) if b.device else None
        # The Keras baseline's timing children start TensorFlow while this process converts.
        with (
            (
                bench.KerasLatency(
                    run.model_path,
                    threads=b.threads,
                    warmup=b.warmup,
                    runs=b.runs,
                    trust_model=settings.trust_model,
                )
                if b.keras
                else contextlib.nullcontext()
            ) as keras,
            tflite.saved_models(),
        ):
            return _export(run, model, qat, modes, settings, rd, keras, say, phone)
    finally:
        rd.release()
        shutil.rmtree(scratch, ignore_errors=True)


def _is_tf_keras(model) -> bool:
    return isinstance(model, keras.Model)  # not a Keras 3 model reached through a SavedModel


def _export(
    run,
    model,
    qat: bool,
    modes: list[str],
    settings: ExportSettings,
    rd: RunDir,
    keras: bench.KerasLatency | None,
    say: Callable[[str], None],
    phone: device.Device | None = None,
) -> RunRecord:
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
    cost = bench.keras_cost(model)
    rd.open()
    out_dir = rd.work
    # What a user of the .tflite files needs besides them: the input contract and the class names.
    contract = {**input_contract(data_cfg, info), **({"model_input": decided} if decided else {})}
    write_json(os.path.join(out_dir, "input.json"), contract)
    if contract["class_names"]:
        write_text(os.path.join(out_dir, "labels.txt"), "\n".join(contract["class_names"]) + "\n")
    rows: list[dict] = []
    notes: list[str] = []
    validation = _Validation(model, data_cfg, info, settings.search_limit)
    for i, mode in enumerate(modes, 1):
        if MODES.get(mode).latency_aware:
            if keras:
                keras.ready()  # nothing else may run while this process times
            rows.append(
                _auto(
                    model,
                    calibration,
                    settings,
                    validation,
                    x_test,
                    y_test,
                    reference,
                    out_dir,
                    lambda msg, i=i: say(f"[{i}/{len(modes)}] {msg}"),
                    notes,
                    phone,
                )
            )
            continue
        say(f"[{i}/{len(modes)}] {mode}: converting")
        started = time.perf_counter()
        conv = tflite.convert(model, mode, calibration=calibration, options=settings.options)
        convert_s = time.perf_counter() - started
        file = f"model_{mode}.tflite"
        write_bytes(os.path.join(out_dir, file), conv.content)
        extra = {}
        if conv.recipe is not None:  # beside the model: readable, editable, --recipe re-applies it
            extra["recipe"] = f"model_{mode}_recipe.json"
            write_json(os.path.join(out_dir, extra["recipe"]), conv.recipe)
        say(f"[{i}/{len(modes)}] {mode}: evaluating on {len(y_test)} test examples")
        result = evaluate(TFLiteModel(conv.content), x_test, y_test, reference)
        gate = fidelity.check(result, settings.thresholds)
        say(f"[{i}/{len(modes)}] {mode}: benchmarking")
        rows.append(
            _row(
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
            rows.append(
                _selective(
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
            rows.append(
                _partial(
                    model, calibration, conv, settings, x_test, y_test, reference, out_dir, say
                )
            )
    _write_metadata(
        rows, out_dir, contract, plan, settings.outputs, run.config.model.name, rd.fingerprint
    )
    if keras:
        keras.ready()  # nothing else may run while this process times
    files = {r["mode"]: os.path.join(out_dir, r["file"]) for r in rows if r.get("file")}
    latency, same = _time(files, settings.bench, say, phone)
    rooflines: dict[str, dict] = {}
    for row in rows:
        name = row["mode"]
        if name in files:
            twin = same.get(name)
            _measured(row, read_tflite(files[name]), latency[name], twin, rooflines.get(twin))
            rooflines[name] = row["roofline"]
    host = host_words(threads=1)
    chosen = ship.choose(rows)
    shipped = None
    if chosen is not None:
        shutil.copyfile(os.path.join(out_dir, chosen["file"]), os.path.join(out_dir, ship.FILE))
        shipped = ship.describe(chosen, host)
    # A gate that passes says the .tflite agrees with the Keras model, not that the model is any good.
    keras_accuracy = float(np.mean(np.argmax(reference, axis=-1) == y_test))
    worth = quality.verdict(
        quality.Evidence(
            keras_accuracy,
            info.num_classes,
            int(len(y_test)),
            input_read=decided["decided_by"] != "default" if decided else None,
        )
    )
    if worth:
        log.warning(worth)
    slower = summary.slower_than_float(rows, host_words(), has_int8_dot())
    notes.extend(
        f"{r['mode']} has {r['same_graph_as']}'s graph: timed once"
        for r in rows
        if r.get("same_graph_as")
    )
    for line in slower:
        log.warning(line)
    notes.extend(slower)
    notes.extend(f"{r['mode']}: {r['fastest_runtime']}" for r in rows if r.get("fastest_runtime"))
    keras_figures = _keras_figures(model, run.model_path, cost, settings, keras, say)
    table = summary.export_table(rows)
    cpu_peaks = peaks()
    roofline_md = summary.roofline_table(rows)
    if roofline_md:
        roofline_md = f"## Roofline\n\n{peak_summary(cpu_peaks)}.\n\n{roofline_md}\n"
    write_text(
        os.path.join(out_dir, "export.md"),
        f"# Export of {run.source}\n\nLatency: batch 1 on {host_words()}, "
        f"{settings.bench.rounds} interleaved rounds.\n\n{table}\n\n{roofline_md}",
    )
    plot = None
    if settings.plot:
        plot = summary.plot(
            rows, os.path.join(out_dir, "export.png"), f"{run.config.model.name}: {run.source}"
        )
    artifacts = {r["mode"]: r["file"] for r in rows if r.get("file")}
    artifacts.update({f"{r['mode']}_recipe": r["recipe"] for r in rows if r.get("recipe")})
    artifacts.update(
        table="export.md",
        input="input.json",
        **({"plot": os.path.basename(plot)} if plot else {}),
        **({"labels": "labels.txt"} if contract["class_names"] else {}),
        **({"ship": ship.FILE} if shipped else {}),
    )
    record = run_record(
        "export",
        run.config,
        rd.path,
        data={"dataset": data_cfg.dataset, "test_examples": int(len(y_test)), "input": contract},
        model={
            "name": run.config.model.name,
            "qat": qat,
            **cost,
            "weight_sparsity": round(tflite.weight_sparsity(model), 4),
        },
        metrics={
            "keras_test_accuracy": rows[0]["eval"]["keras_accuracy"] if rows else None,
            **{f"{r['mode']}_test_accuracy": r["eval"]["accuracy"] for r in rows},
        },
        artifacts=artifacts,
        fingerprint=rd.fingerprint,
        warnings=([worth] if worth else []) + slower,
        section={
            "source": run.source,
            "output": rd.path,
            "settings": _settings_dict(settings),
            "modes": rows,
            "keras": keras_figures,
            "notes": notes,
            "table": table,
            "cpu_peaks": cpu_peaks,
            "host": {"cpu": host_words(), "isa": host_label(), "int8_dot": has_int8_dot()},
            "device": phone.label if phone is not None else None,
            "roofline_table": roofline_md,
            "gate_failures": gate_failures(rows),
            "ship": shipped,
            "outputs": settings.outputs,
        },
    )
    rd.commit(record)
    return record


def _write_metadata(
    rows: list[dict],
    out_dir: str,
    contract: dict,
    plan: outputs.Plan,
    outs: str,
    name: str,
    version: str,
) -> None:
    """Finishes every written .tflite: its softmax (see ``outputs.plan``), names and metadata.

    See :mod:`tfopt.export.metadata`: the normalization, the labels, ``input.json`` and the
    mode's recipe travel inside the file. An appended softmax is checked on random inputs against
    numpy's. Sizes in the rows stay the evaluated flatbuffer's; ``metadata_bytes`` is what the
    softmax, the names, the metadata and the packed files add.
    """
    rng = np.random.default_rng(0)
    for row in rows:
        if row.get("file"):
            path = os.path.join(out_dir, row["file"])
            with open(path, "rb") as f:
                content = f.read()
            final = content
            if plan.append_softmax:
                final = outputs.append_softmax(content)
                probe = rng.random((4, *contract["image_shape"]), dtype=np.float32)
                logits = TFLiteModel(content).predict(probe).astype(np.float64)
                want = np.exp(logits - logits.max(axis=1, keepdims=True))
                got = TFLiteModel(final).predict(probe)
                assert np.allclose(got, want / want.sum(axis=1, keepdims=True), atol=1e-5), row[
                    "file"
                ]
            files = metadata.files_of(contract)
            if row.get("recipe"):
                with open(os.path.join(out_dir, row["recipe"]), "rb") as f:
                    files["recipe.json"] = f.read()
            described = metadata.write(
                outputs.name_io(final, outs),
                contract,
                outputs=outs,
                name=f"{name} ({row['mode']})",
                version=version[:12],
                description=f"Image classifier over {len(contract.get('class_names') or [])} "
                f"classes, exported by tfopt as {row['mode']}"
                + (
                    f", quantized by {_QUANTIZED_BY[row['quantizer']]}."
                    if row.get("quantizer")
                    else "."
                ),
                files=files,
            )
            write_bytes(path, described)
            row["metadata_bytes"] = len(described) - len(content)
            row["outputs"] = outs


_QUANTIZED_BY = {
    "converter": "the TFLite converter",
    "litert": "LiteRT Quantizer (ai-edge-quantizer)",
}


def gate_failures(rows: list[dict]) -> dict[str, str]:
    """The export's verdict: mode -> why it failed the fidelity gate (empty when every gated mode passed).

    A selective int8 that passes stands in for the plain int8 that failed.
    """
    failed = {
        r["mode"]: "; ".join(r["gate"]["reasons"])
        for r in rows
        if r["gate"] and not r["gate"]["passed"]
    }
    if "int8" in failed and any(
        r["mode"] == "int8-selective" and r["gate"]["passed"] for r in rows
    ):
        del failed["int8"]
    return failed


def _keras_figures(
    model, path: str, cost: dict, settings: ExportSettings, keras: bench.KerasLatency | None, say
) -> dict:
    """The float Keras model's own figures (the baseline of every .tflite): latency, bytes, params, FLOPs."""
    latency = {}
    if keras:
        say(f"timing the Keras model at {', '.join(map(str, settings.bench.threads))} thread(s)")
        latency = keras.result()
    return {
        "latency": latency,
        "weights_bytes": bench.weights_bytes(model),
        "file_bytes": os.path.getsize(path),
        **cost,
    }


class _Validation:
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


def _selective(
    model,
    calibration,
    conv,
    full: EvalResult,
    settings: ExportSettings,
    validation: _Validation,
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
    return _row(
        "int8-selective",
        _io_of(found.content),
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


def _auto(
    model,
    calibration,
    settings: ExportSettings,
    validation: _Validation,
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
    return _row(
        "int8_auto",
        _io_of(content),
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


def _io_of(content: bytes) -> str:
    # The converter keeps float I/O when the first/last op stays float, whatever was asked.
    dtype = TFLiteModel(content).input_dtype
    return "float" if dtype.kind == "f" else str(dtype)


def _partial(
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
    return _row(
        f"int8+float:{','.join(layers)}",
        _io_of(content),
        file,
        content,
        result,
        fidelity.check(result, settings.thresholds),
        float_layers=layers,
        float_nodes=nodes,
    )


def _settings_dict(settings: ExportSettings) -> dict:
    d = dataclasses.asdict(settings)
    d["modes"] = list(settings.modes)
    d["float_layers"] = list(settings.float_layers)
    d["bench"]["threads"] = list(settings.bench.threads)
    return d


def evaluate_file(
    path: str,
    data_cfg: DataConfig,
    *,
    limit: int = 0,
    split: str = "test",
    keras_path: str | None = None,
    trust_model: bool = False,
    threads: int | None = None,
) -> dict:
    """``--evaluate``: scores one .tflite on a dataset split (and against a Keras model when given)."""
    content = read_tflite(path)
    model = TFLiteModel(content, num_threads=threads)
    packed = metadata.contract_of(content)
    if data_cfg.input_scale == "auto" and packed.get("input_scale") in ("unit", "raw"):
        # The contract the export packed says what the file takes (0-255 pixels for a model
        # that scales inside); data.normalize stays the user's (--normalize).
        data_cfg = dataclasses.replace(data_cfg, input_scale=packed["input_scale"])
    x, y = load_split(data_cfg, split, limit)
    reference = keras_outputs(load_source_model(keras_path, trust_model), x) if keras_path else None
    result = evaluate(model, x, y, reference)
    return {
        "mode": os.path.basename(path),
        "io": str(model.input_dtype),
        "file": os.path.abspath(path),
        **bench.file_sizes(content),
        "eval": result.to_dict(),
        "gate": None,
        "latency": {},
        "dataset": data_cfg.dataset,
        "split": split,
    }


def benchmark_file(
    path: str, settings: BenchSettings, keras_path: str | None = None, trust_model: bool = False
) -> dict:
    """``--benchmark``: latency (per thread count and kernel setting) and sizes of one .tflite."""
    content = read_tflite(path)
    phone = (
        device.Device.connect(settings.device, settings.benchmark_binary)
        if settings.device
        else None
    )
    latency = _time({"file": path}, settings, phone=phone)[0]["file"]
    out = _measured(
        {
            "mode": os.path.basename(path),
            "io": str(TFLiteModel(content).input_dtype),
            "file": os.path.abspath(path),
            **bench.file_sizes(content),
        },
        content,
        latency,
    )
    out.pop("fastest_runtime", None)
    out["kernels"] = {k: v["kernels"] for k, v in latency.items() if "kernels" in v}
    out.update(cpu_peaks=peaks(), host=host_words(), **({"device": phone.label} if phone else {}))
    if keras_path:
        out["keras"] = bench.keras_cost(load_source_model(keras_path, trust_model))
    return out
