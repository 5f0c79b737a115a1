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
from collections.abc import Callable

from tfopt.core._keras import keras

import numpy as np

from tfopt.compress.common import strip_wrappers
from tfopt.config import DataConfig, RunConfig
from tfopt.core.cpu import has_int8_dot, host_label, host_words, peak_summary, peaks
from tfopt.core.fileio import write_json, write_text
from tfopt.core.log import PROGRESS
from tfopt.export import benchmark as bench
from tfopt.export import (
    device,
    keras3,
    metadata,
    ship,
    summary,
    tflite,
    trainable,
)
from tfopt.export.choices import (
    parse_modes,
)
from tfopt.export.evaluate import (
    TFLiteModel,
    evaluate,
    keras_outputs,
    load_split,
    read_tflite,
)
from tfopt.export.finish import write_metadata, write_trainable
from tfopt.export.make import (
    make_files,
    read_inputs,
)
from tfopt.export.measure import measured, time_all, time_files
from tfopt.export.settings import (  # noqa: F401  (importable from here, as before)
    BenchSettings,
    ExportSettings,
    settings_dict,
)
from tfopt.models.io import load_model, saved_by_keras3
from tfopt.runs import RunRecord, fingerprint, fresh_dir, load_input, refuse_input_as_output
from tfopt.runtime import quality
from tfopt.runtime.job import run_record
from tfopt.runtime.rundir import RunDir

log = logging.getLogger(__name__)


def load_source_model(path: str, trust_model: bool = False) -> keras.Model:
    """Loads a run's model (tfmot wrappers deserialized, see ``io.load_model``).

    Pruning and clustering wrappers are stripped (the .tflite holds the plain layers with the
    sparse / clustered weights); QAT wrappers stay, they carry the ranges int8 conversion uses.
    """
    return strip_wrappers(load_model(path, trust_model=trust_model))


def run(
    run_dir: str,
    settings: ExportSettings | None = None,
    out_dir: str | None = None,
    *,
    overwrite: bool = False,
    data: DataConfig | None = None,
) -> RunRecord:
    """Exports one run (or model file) to .tflite in every requested mode, measures each and commits a new run directory.

    Args:
        run_dir: A run directory (``run.json`` + ``model.keras``), or a model file (``.keras``,
            ``.h5``, a SavedModel directory) to export with the data ``data`` describes.
        settings: Modes, conversion options, gate, benchmark settings (default
            ``ExportSettings()``).
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
    settings = settings or ExportSettings()
    say = functools.partial(log.log, PROGRESS)  # shown unless --quiet
    modes = parse_modes(settings.modes)
    run = load_input(run_dir, RunConfig(data=data) if data is not None else None)
    pick = (lambda: fresh_dir(run.stem.rstrip(os.sep) + "-export")) if not out_dir else None
    out = os.path.abspath(out_dir or pick())
    refuse_input_as_output(out, [run.source])
    options = {"source": run.source, "source_digest": run.digest, **settings_dict(settings)}
    rd = RunDir(
        out, fingerprint("export", options), {"export": options}, overwrite=overwrite, pick=pick
    )
    scratch = tempfile.mkdtemp(prefix="tfopt-export-")
    try:
        rd.check()
        model, settings = _load(run, settings, scratch, say)
        qat = tflite.is_qat_model(model)
        tflite.check_modes_for(model, modes)  # refuse before spending minutes on the others
        if settings.trainable:
            trainable.refuse_qat(model)
            trainable.split(model)  # the same: a model without a Dense head is refused now
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


def _load(run, settings: ExportSettings, scratch: str, say):
    """The model to export, and the settings it can be exported with: a Keras 3 file goes
    through a SavedModel (under ``scratch``), which tf_keras can neither time nor debug."""
    if not saved_by_keras3(run.model_path):
        return load_source_model(run.model_path, settings.trust_model), settings
    say(f"{run.model_path} was saved by Keras 3: exporting it as a SavedModel with Keras 3")
    saved = keras3.to_saved_model(
        run.model_path, os.path.join(scratch, "keras3"), trust_model=settings.trust_model
    )
    model = keras3.as_tf_keras(saved, os.path.basename(run.model_path))
    # tf_keras cannot load the file to time it, and the debugger's layers are one opaque call.
    settings = dataclasses.replace(
        settings,
        bench=dataclasses.replace(settings.bench, keras=False),
        selective=False,
        float_layers=(),
    )
    return model, settings


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
    got = read_inputs(run, model, qat, modes, settings, say)
    loaded, model, contract = model, got.model, got.contract
    rd.open()
    out_dir = rd.work
    write_json(os.path.join(out_dir, "input.json"), contract)
    if contract["class_names"]:
        write_text(os.path.join(out_dir, "labels.txt"), "\n".join(contract["class_names"]) + "\n")
    notes: list[str] = []
    rows = make_files(got, qat, modes, settings, out_dir, keras, say, notes, phone)
    write_metadata(
        rows, out_dir, contract, got.plan, settings.outputs, run.config.model.name, rd.fingerprint
    )
    on_device = None
    if settings.trainable:
        say(f"writing {trainable.FILE}: {', '.join(trainable.SIGNATURES)} signatures")
        on_device = write_trainable(
            loaded, got, settings, out_dir, run.config.model.name, rd.fingerprint
        )
    if keras:
        keras.ready()  # nothing else may run while this process times
    time_all(rows, out_dir, settings.bench, say, phone)
    host = host_words(threads=1)
    chosen = ship.choose(rows)
    shipped = None
    if chosen is not None:
        shutil.copyfile(os.path.join(out_dir, chosen["file"]), os.path.join(out_dir, ship.FILE))
        shipped = ship.describe(chosen, host)
    # A gate that passes says the .tflite agrees with the Keras model, not that the model is any good.
    keras_accuracy = float(np.mean(np.argmax(got.reference, axis=-1) == got.y_test))
    worth = quality.verdict(
        quality.Evidence(
            keras_accuracy,
            got.info.num_classes,
            int(len(got.y_test)),
            input_read=got.decided["decided_by"] != "default" if got.decided else None,
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
    keras_figures = _keras_figures(model, run.model_path, got.cost, settings, keras, say)
    return _record(
        run,
        got,
        qat,
        rows,
        settings,
        rd,
        notes,
        keras_figures,
        shipped,
        worth,
        slower,
        phone,
        on_device,
    )


def _record(
    run,
    got,
    qat,
    rows,
    settings,
    rd,
    notes,
    keras_figures,
    shipped,
    worth,
    slower,
    phone,
    on_device,
):
    """Writes export.md and export.png, then commits the run with its record."""
    out_dir, contract = rd.work, got.contract
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
    artifacts = _artifacts(rows, contract, plot, shipped, on_device)
    record = run_record(
        "export",
        run.config,
        rd.path,
        data={
            "dataset": got.data_cfg.dataset,
            "test_examples": int(len(got.y_test)),
            "input": contract,
        },
        model={
            "name": run.config.model.name,
            "qat": qat,
            **got.cost,
            "weight_sparsity": round(tflite.weight_sparsity(got.model), 4),
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
            "settings": settings_dict(settings),
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
            "trainable": on_device,
        },
    )
    rd.commit(record)
    return record


def _artifacts(rows, contract, plot, shipped, on_device) -> dict:
    """The record's ``artifacts``: every file the export wrote, by what it is."""
    artifacts = {r["mode"]: r["file"] for r in rows if r.get("file")}
    artifacts.update({f"{r['mode']}_recipe": r["recipe"] for r in rows if r.get("recipe")})
    artifacts.update(
        table="export.md",
        input="input.json",
        **({"plot": os.path.basename(plot)} if plot else {}),
        **({"labels": "labels.txt"} if contract["class_names"] else {}),
        **({"ship": ship.FILE} if shipped else {}),
        **({"trainable": on_device["file"]} if on_device else {}),
    )
    return artifacts


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
    latency = time_files({"file": path}, settings, phone=phone)[0]["file"]
    out = measured(
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
