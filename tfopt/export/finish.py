"""Finishing every written .tflite: the appended softmax, the I/O names and the TFLite Metadata
(normalization, labels, ``input.json``, the recipe) that MediaPipe Tasks and LiteRT read."""

from __future__ import annotations

import os

import numpy as np

from tfopt.core.fileio import write_bytes
from tfopt.export import (
    metadata,
    outputs,
    trainable,
)
from tfopt.export.evaluate import (
    TFLiteModel,
)


def write_metadata(
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
                    f", quantized by {QUANTIZED_BY[row['quantizer']]}."
                    if row.get("quantizer")
                    else "."
                ),
                files=files,
            )
            write_bytes(path, described)
            row["metadata_bytes"] = len(described) - len(content)
            row["outputs"] = outs


def write_trainable(model, got, settings, out_dir: str, name: str, version: str) -> dict:
    """Writes ``model_trainable.tflite`` (:mod:`tfopt.export.trainable`) with the same metadata
    as the other files (its ``infer`` signature is the subgraph the metadata describes).

    Args:
        model: The tf_keras model as loaded.
        got: The export's :class:`~tfopt.export.make.Inputs` (contract, test split).
        settings: The export's settings (``trainable_lr``, ``outputs``).
        out_dir: The export directory.
        name: The model's name, version: the export's fingerprint.

    Returns:
        The record's ``trainable`` section (signatures, head, parameters, checks, bytes).
    """
    content, section = trainable.make(
        model,
        got.contract,
        got.x_test[:64],
        got.y_test[:64],
        settings.trainable_lr,
        settings.outputs,
    )
    described = metadata.write(
        content,
        got.contract,
        outputs=settings.outputs,
        name=f"{name} (trainable)",
        version=version[:12],
        description=f"Image classifier over {len(got.contract.get('class_names') or [])} "
        f"classes, exported by tfopt with on-device training signatures (infer, train, save, "
        f"restore); {section['head']} trains.",
        files=metadata.files_of(got.contract),
    )
    write_bytes(os.path.join(out_dir, trainable.FILE), described)
    return {**section, "bytes": len(described)}


QUANTIZED_BY = {
    "converter": "the TFLite converter",
    "litert": "LiteRT Quantizer (ai-edge-quantizer)",
}
