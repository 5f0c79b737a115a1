"""Reading a pipeline run: ``pipeline.json``, every stage's ``run.json``, and the variants they describe.

A *variant* is one (model, format) pair: ``teacher/keras`` (the float Keras model itself),
``teacher/float32``, ``teacher/int8``, ..., ``student-pqat/int8``. Every figure of a variant comes
from the records the stages wrote; nothing is measured again here:

- accuracy, agreement: the export stage's scoring of each .tflite on the test split against its
  own Keras model (``eval``); the Keras variant's accuracy is that same scoring's
  ``keras_accuracy``, so every variant of a run is scored on the same test examples.
- delta: points against the baseline ``<first train stage>/keras`` (the teacher).
- size: the .tflite file and its gzip -9 size; for a Keras variant, the bytes of its weights at
  their dtype (float32), which is what a float model costs to ship (``model.keras`` adds a zip
  container and the config).
- latency: LiteRT with the XNNPACK delegate at batch 1 (``xnnpack/1t``, ``xnnpack/2t``), or on
  the phone when the export timed there (``device/1t``, ``device/2t``, ``--device``); for a
  Keras variant, ``model(x, training=False)`` in a ``tf.function`` with that many TensorFlow
  intra-op threads (the export's ``keras`` section).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

from tfopt.core.errors import ConfigError
from tfopt.runs import RunRecord

STATE_FILE = "pipeline.json"
MODEL_KINDS = ("train", "distill", "optimize")
KERAS = "keras"


@dataclass
class StageInfo:
    """One stage of the pipeline run as ``pipeline.json`` lists it, with its record when it has one."""

    name: str
    kind: str
    dir: str  # absolute
    inputs: list[str]
    status: str
    seconds: float | None
    record: RunRecord | None = None

    def to_dict(self) -> dict:
        """The JSON-friendly part (without the record)."""
        return {
            "name": self.name,
            "kind": self.kind,
            "dir": self.dir,
            "inputs": self.inputs,
            "status": self.status,
            "seconds": self.seconds,
            "has_record": self.record is not None,
        }


@dataclass
class Variant:
    """One (model, format) pair and its figures (None = not measured).

    Attributes:
        name: ``<model>/<format>``, e.g. ``student-pqat/int8``.
        model: The stage that made the model (``teacher``, ``student``, ``student-pqat``).
        format: ``keras`` or the export mode (``float32``, ``int8``, ``int8-selective``, ...).
        arch: The registered model name (``cnn``, ``small_cnn``).
        technique: How the model was made: ``trained``, ``distilled``, ``distilled+pqat``, ...
        accuracy_pct: Test accuracy in percent.
        delta_pt: Accuracy minus the baseline's (``teacher/keras``), in points.
        agreement_pct: Top-1 agreement with its own Keras model in percent (None for Keras rows).
        examples: Test examples scored.
        params: Parameters of the Keras model.
        flops: FLOPs per example of the Keras model (multiply-add = 2).
        size_bytes: The .tflite file, or the Keras model's weight bytes.
        gzip_bytes: gzip -9 of the .tflite (None for Keras rows).
        p50_us, p95_us: Batch-1 latency at 1 thread, microseconds.
        p50_us_2t, p95_us_2t: The same at 2 threads.
        bound_us: The compute bound at 1 thread on the machine that measured p50_us
            (:mod:`tfopt.export.roofline`); None where unknown.
        roofline: The 1-thread roofline of a .tflite: per kernel class, its multiply-adds, time,
            GMAC/s and bound, and the line saying where the time goes.
        gate: The export's fidelity gate verdict (``{"passed", "reasons"}``) or None.
        file: The .tflite (or model.keras) path.
        notes: What a reader must know about this row's figures.
    """

    name: str
    model: str
    format: str
    arch: str = ""
    technique: str = ""
    accuracy_pct: float | None = None
    delta_pt: float | None = None
    agreement_pct: float | None = None
    examples: int | None = None
    params: int | None = None
    flops: int | None = None
    size_bytes: int | None = None
    gzip_bytes: int | None = None
    p50_us: float | None = None
    p95_us: float | None = None
    p50_us_2t: float | None = None
    p95_us_2t: float | None = None
    bound_us: float | None = None
    roofline: dict | None = None
    gate: dict | None = None
    file: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def is_tflite(self) -> bool:
        """True for an edge (.tflite) variant."""
        return self.format != KERAS

    def to_dict(self) -> dict:
        """JSON-friendly dict."""
        return {**asdict(self), "tflite": self.is_tflite}


@dataclass
class PipelineRun:
    """Everything the report reads from a pipeline run directory."""

    path: str
    state: dict
    stages: list[StageInfo]
    variants: list[Variant]
    baseline: str | None  # the variant every delta is taken against
    warnings: list[str] = field(default_factory=list)

    def stage(self, name: str) -> StageInfo | None:
        """The stage called ``name``, or None."""
        return next((s for s in self.stages if s.name == name), None)

    def variant(self, name: str) -> Variant | None:
        """The variant called ``name``, or None."""
        return next((v for v in self.variants if v.name == name), None)


def read_state(run_dir: str) -> dict:
    """Reads ``<run_dir>/pipeline.json``.

    Raises:
        ConfigError: no such directory, no ``pipeline.json``, or not a readable one.
    """
    if not os.path.isdir(run_dir):
        raise ConfigError(
            f"pipeline run directory {run_dir!r} does not exist; give the -o directory of "
            "`python -m tfopt.pipeline`"
        )
    path = os.path.join(run_dir, STATE_FILE)
    if not os.path.isfile(path):
        raise ConfigError(
            f"{run_dir!r} has no {STATE_FILE}; give the -o directory of `python -m tfopt.pipeline`"
        )
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"{path} cannot be read ({e}); run the pipeline again to rewrite it"
        ) from None
    if not isinstance(state, dict) or not isinstance(state.get("stages"), list):
        raise ConfigError(
            f"{path} is not a pipeline state (no 'stages' list); run the pipeline again"
        )
    return state


def _load_record(path: str) -> RunRecord | None:
    record_path = os.path.join(path, "run.json")
    if not os.path.isfile(record_path):
        return None
    try:
        with open(record_path, encoding="utf-8") as f:
            return RunRecord.from_dict(json.load(f))
    except ValueError as e:  # a hand-edited or truncated record: its line names it
        raise ConfigError(
            f"{record_path} cannot be read ({str(e)[:200]}); run its stage again to rewrite it"
        ) from None


def _technique(stage: StageInfo, by_name: dict[str, StageInfo]) -> str:
    rec = stage.record
    section = rec.section if rec else {}
    if stage.kind == "train":
        return "trained"
    if stage.kind == "distill":
        extra = (section.get("settings") or {}).get("technique", "none")
        return "distilled" if extra in (None, "none") else f"distilled+{extra}"
    parent = by_name.get(stage.inputs[0]) if stage.inputs else None
    base = _technique(parent, by_name) if parent else ""
    technique = section.get("technique", "?")
    return f"{base}+{technique}" if base else technique


def _us(latency: dict | None, key: str, field_: str) -> float | None:
    value = ((latency or {}).get(key) or {}).get(field_)
    return None if value is None else 1000.0 * float(value)


def _pct(fraction: float | None) -> float | None:
    return None if fraction is None else 100.0 * float(fraction)


def _keras_variant(stage: StageInfo, export: StageInfo | None, technique: str) -> Variant:
    rec = stage.record
    v = Variant(
        name=f"{stage.name}/{KERAS}",
        model=stage.name,
        format=KERAS,
        arch=rec.config.get("model", {}).get("name", rec.model.get("name", "")),
        technique=technique,
        file=os.path.join(stage.dir, "model.keras"),
    )
    v.params = rec.model.get("params")
    rows = (export.record.section.get("modes") or []) if export and export.record else []
    ev = (rows[0].get("eval") or {}) if rows else {}
    if ev.get("keras_accuracy") is not None:
        v.accuracy_pct, v.examples = _pct(ev["keras_accuracy"]), ev.get("examples")
    else:
        v.accuracy_pct = _pct(rec.metrics.get("test_accuracy"))
        v.examples = (rec.data.get("splits") or {}).get("test")
        v.notes.append("accuracy from the stage's own test evaluation (no export scored it)")
    if export and export.record:
        em = export.record.model
        v.params = em.get("params", v.params)
        v.flops = em.get("flops")
        keras = export.record.section.get("keras") or {}
        v.size_bytes = keras.get("weights_bytes")
        lat = keras.get("latency") or {}
        v.p50_us, v.p95_us = _us(lat, "1t", "p50_ms"), _us(lat, "1t", "p95_ms")
        v.p50_us_2t, v.p95_us_2t = _us(lat, "2t", "p50_ms"), _us(lat, "2t", "p95_ms")
        if not lat:
            v.notes.append("Keras latency not measured by this export")
    fed = (rec.data or {}).get("model_input")
    if fed:  # what the model's input gets, and what decided it (tfopt.models.inputs)
        what = "0-255 pixels" if fed["input_scale"] == "raw" else "pixels / 255"
        layers = ", ".join(fed.get("layers") or []) or "no preprocessing layer"
        v.notes.append(f"input: {what} ({fed['input_scale']}, by {fed['decided_by']}: {layers})")
    # What the stage and its export found doubtful (a test accuracy at chance, ...), said once per model.
    found = list(rec.warnings) + (list(export.record.warnings) if export and export.record else [])
    v.notes.extend(f"warning: {w}" for w in dict.fromkeys(found))
    if v.size_bytes is None and v.params is not None:
        v.size_bytes = 4 * int(v.params)
        v.notes.append("size estimated as params x 4 bytes (the export recorded no weight bytes)")
    return v


def _tflite_variant(
    stage: StageInfo, export: StageInfo, row: dict, technique: str, keras: Variant
) -> Variant:
    ev = row.get("eval") or {}
    lat = row.get("latency") or {}
    roof = (row.get("roofline") or {}).get("xnnpack/1t")
    # timed on the phone (--device): those figures select and rank
    on_phone = (lat.get("device/1t") or {}).get("p50_ms") is not None
    one, two = ("device/1t", "device/2t") if on_phone else ("xnnpack/1t", "xnnpack/2t")
    v = Variant(
        name=f"{stage.name}/{row['mode']}",
        model=stage.name,
        format=row["mode"],
        arch=keras.arch,
        technique=technique,
        accuracy_pct=_pct(ev.get("accuracy")),
        agreement_pct=_pct(ev.get("agreement")),
        examples=ev.get("examples"),
        params=keras.params,
        flops=keras.flops,
        size_bytes=row.get("size_bytes"),
        gzip_bytes=row.get("gzip_bytes"),
        p50_us=_us(lat, one, "p50_ms"),
        p95_us=_us(lat, one, "p95_ms"),
        p50_us_2t=_us(lat, two, "p50_ms"),
        p95_us_2t=_us(lat, two, "p95_ms"),
        bound_us=roof["bound_ms"] * 1e3 if roof and roof.get("bound_ms") else None,
        roofline=roof,
        notes=[row["fastest_runtime"]] if row.get("fastest_runtime") else [],
        gate=row.get("gate"),
        file=os.path.join(export.dir, row["file"]) if row.get("file") else None,
    )
    return v


def collect(run_dir: str) -> PipelineRun:
    """Reads a pipeline run directory into stages and variants.

    Stages that are pending or have no ``run.json`` are listed (with a warning) and give no
    variants; the report of an unfinished run shows what there is.

    Args:
        run_dir: The pipeline run directory (holding ``pipeline.json``).

    Returns:
        The run: its state, stages (with records), variants (models in stage order, each model's
        Keras variant first, then its .tflite variants in export order) and the baseline.

    Raises:
        ConfigError: no pipeline run at ``run_dir``.
    """
    run_dir = os.path.abspath(run_dir)
    state = read_state(run_dir)
    warnings: list[str] = []
    stages: list[StageInfo] = []
    for entry in state["stages"]:
        path = os.path.join(run_dir, entry.get("dir") or entry["name"])
        try:
            record = _load_record(path)
        except (OSError, ValueError, TypeError) as e:
            record = None
            warnings.append(
                f"stage {entry['name']}: {os.path.join(path, 'run.json')} cannot be read ({e})"
            )
        info = StageInfo(
            name=entry["name"],
            kind=entry.get("kind", "?"),
            dir=path,
            inputs=list(entry.get("inputs", [])),
            status=entry.get("status", "?"),
            seconds=entry.get("seconds"),
            record=record,
        )
        if record is None and not any(w.startswith(f"stage {info.name}:") for w in warnings):
            warnings.append(
                f"stage {info.name} ({info.kind}) has no run.json yet (status {info.status}): "
                "its figures are missing"
            )
        stages.append(info)
    by_name = {s.name: s for s in stages}
    variants: list[Variant] = []
    for stage in stages:
        if stage.kind not in MODEL_KINDS or stage.record is None:
            continue
        technique = _technique(stage, by_name)
        export = next((s for s in stages if s.kind == "export" and stage.name in s.inputs), None)
        keras = _keras_variant(stage, export, technique)
        variants.append(keras)
        if export is None or export.record is None:
            continue
        for row in export.record.section.get("modes") or []:
            variants.append(_tflite_variant(stage, export, row, technique, keras))
    baseline_stage = next((s for s in stages if s.kind == "train" and s.record is not None), None)
    baseline = f"{baseline_stage.name}/{KERAS}" if baseline_stage else None
    base = next((v for v in variants if v.name == baseline), None)
    if base is None or base.accuracy_pct is None:
        warnings.append("no trained (teacher) model with a test accuracy: deltas are not computed")
    else:
        for v in variants:
            if v.accuracy_pct is not None:
                v.delta_pt = v.accuracy_pct - base.accuracy_pct
        counts = {v.examples for v in variants if v.examples is not None}
        if len(counts) > 1:
            warnings.append(
                f"variants were scored on different numbers of test examples ({sorted(counts)}): "
                "deltas mix example sets"
            )
    return PipelineRun(
        path=run_dir,
        state=state,
        stages=stages,
        variants=variants,
        baseline=baseline,
        warnings=warnings,
    )


def training_curves(run: PipelineRun) -> list[dict]:
    """Per model stage, its history as series: ``epoch``, ``loss``, ``accuracy``, ``val_loss``, ``val_accuracy``.

    Train and distill records hold one row per epoch (a distill row's ``loss`` is the combined
    distillation loss; its ``student_loss``, the cross-entropy comparable with ``val_loss``, is
    used when present). Optimize records hold one row per phase (``train_loss``,
    ``train_accuracy`` after ``epochs`` epochs): its x is the epoch at the end of the phase.
    Missing values are None.
    """
    out = []
    for stage in run.stages:
        if stage.kind not in MODEL_KINDS or stage.record is None or not stage.record.history:
            continue
        series: dict = {
            "stage": stage.name,
            "kind": stage.kind,
            "epoch": [],
            "loss": [],
            "accuracy": [],
            "val_loss": [],
            "val_accuracy": [],
            "phase": [],
            "loss_name": "loss",
        }
        done = 0
        for i, row in enumerate(stage.record.history):
            if not isinstance(row, dict):
                continue
            if "phase" in row:  # optimize: one row per phase
                done += int(row.get("epochs") or 1)
                series["epoch"].append(done)
                series["loss"].append(row.get("train_loss", row.get("loss")))
                series["accuracy"].append(row.get("train_accuracy", row.get("accuracy")))
                series["phase"].append(row["phase"])
            else:
                series["epoch"].append(int(row.get("epoch", i + 1)))
                if row.get("student_loss") is not None:
                    series["loss"].append(row["student_loss"])
                    series["loss_name"] = "student_loss"
                else:
                    series["loss"].append(row.get("loss"))
                series["accuracy"].append(row.get("accuracy"))
                series["phase"].append(None)
            series["val_loss"].append(row.get("val_loss"))
            series["val_accuracy"].append(row.get("val_accuracy"))
        out.append(series)
    return out
