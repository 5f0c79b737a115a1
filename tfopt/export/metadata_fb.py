"""The TFLite Metadata flatbuffer (``metadata_schema.fbs``, file identifier ``M001``) of an image classifier.

The schema is the one MediaPipe Tasks and LiteRT's metadata readers parse (it lives in MediaPipe's
``mediapipe/tasks/metadata/metadata_schema.fbs``). Its Python writers come with the ``mediapipe``
package, which pins ``absl-py~=2.3`` while tfmot 0.8.1 pins ``absl-py~=1.2``: pip cannot install
both, so tfopt builds the few tables an image classifier needs with ``flatbuffers``' own Builder,
field for field as MediaPipe's ``metadata_writers.image_classifier`` fills them (the suite reads
every exported file back with MediaPipe's displayer and runs it in MediaPipe's ImageClassifier).

Field slots follow the schema's declaration order; a union takes two slots (type, value).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import flatbuffers

IDENTIFIER = b"M001"
BUFFER_NAME = "TFLITE_METADATA"
#: Every field written here is in the schema's first version.
PARSER_VERSION = "1.0.0"

# enum and union values of metadata_schema.fbs
_DESCRIPTIONS, _TENSOR_AXIS_LABELS = 1, 2  # AssociatedFileType
_RGB, _GRAYSCALE = 1, 2  # ColorSpaceType
_FEATURE_PROPERTIES, _IMAGE_PROPERTIES = 1, 2  # ContentProperties
_NORMALIZATION_OPTIONS = 1  # ProcessUnitOptions

_LABELS_DESCRIPTION = "Labels for categories that the model can recognize."
_FILE_DESCRIPTION = "File of the model."


@dataclass(frozen=True)
class Tensor:
    """What one tensor's ``TensorMetadata`` says (built by :func:`image_input`, :func:`class_scores`)."""

    name: str
    description: str
    image: bool  # ImageProperties (else FeatureProperties)
    grayscale: bool = False
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    stats: tuple[tuple[float, ...], tuple[float, ...]] | None = None  # (max, min) per channel
    labels: str | None = None  # a TENSOR_AXIS_LABELS file


def image_input(
    *, description: str, mean: Sequence[float], std: Sequence[float], grayscale: bool, uint8: bool
) -> Tensor:
    """The input image: ``NormalizationOptions`` ``(pixel - mean) / std``, its colour space, and
    the range of values it takes (0-255 for uint8, else the normalized pixel range)."""
    if uint8:
        stats = ((255.0,), (0.0,))
    else:
        stats = (
            tuple((255.0 - m) / s for m, s in zip(mean, std)),
            tuple((0.0 - m) / s for m, s in zip(mean, std)),
        )
    return Tensor("image", description, True, grayscale, tuple(mean), tuple(std), stats)


def class_scores(
    *,
    name: str,
    description: str,
    labels: str | None,
    value_range: tuple[float, float] | None,
) -> Tensor:
    """The class-score output, its label file and the range of its values (None: unbounded)."""
    stats = ((value_range[1],), (value_range[0],)) if value_range else None
    return Tensor(name, description, False, stats=stats, labels=labels)


def model_metadata(
    *,
    name: str,
    description: str,
    version: str,
    author: str,
    image: Tensor,
    scores: Tensor,
    files: Sequence[str] = (),
) -> bytes:
    """The ``ModelMetadata`` flatbuffer (finished with the ``M001`` identifier).

    Args:
        name, description, version, author: The model's general information.
        image: The input tensor's metadata.
        scores: The output tensor's metadata.
        files: Names of the files associated with the whole model (``DESCRIPTIONS``).
    """
    b = flatbuffers.Builder(1024)
    inputs = _vector(b, [_tensor(b, image)])
    outputs = _vector(b, [_tensor(b, scores)])
    graph = _table(b, 10, {2: inputs, 3: outputs})
    graphs = _vector(b, [graph])
    associated = (
        _vector(b, [_file(b, f, _FILE_DESCRIPTION, _DESCRIPTIONS) for f in files]) if files else 0
    )
    strings = {k: b.CreateString(v) for k, v in enumerate((name, description, version))}
    by = b.CreateString(author)
    parser = b.CreateString(PARSER_VERSION)
    fields = {**strings, 3: graphs, 4: by, 7: parser}
    if files:
        fields[6] = associated
    b.Finish(_table(b, 8, fields), file_identifier=IDENTIFIER)
    return bytes(b.Output())


def _table(b: flatbuffers.Builder, slots: int, offsets: dict, scalars: dict | None = None) -> int:
    """A table of ``slots`` fields: ``offsets`` (slot -> offset) and ``scalars`` (slot -> (prepend, value))."""
    b.StartObject(slots)
    for slot, (prepend, value) in sorted((scalars or {}).items()):
        prepend(b)(slot, value, 0)
    for slot, offset in sorted(offsets.items()):
        b.PrependUOffsetTRelativeSlot(slot, offset, 0)
    return b.EndObject()


def _byte(b: flatbuffers.Builder) -> Callable:
    return b.PrependInt8Slot


def _ubyte(b: flatbuffers.Builder) -> Callable:
    return b.PrependUint8Slot


def _vector(b: flatbuffers.Builder, offsets: Sequence[int]) -> int:
    b.StartVector(4, len(offsets), 4)
    for offset in reversed(offsets):
        b.PrependUOffsetTRelative(offset)
    return b.EndVector()


def _floats(b: flatbuffers.Builder, values: Sequence[float]) -> int:
    b.StartVector(4, len(values), 4)
    for value in reversed(values):
        b.PrependFloat32(float(value))
    return b.EndVector()


def _file(b: flatbuffers.Builder, name: str, description: str, kind: int) -> int:
    """An ``AssociatedFile``: name 0, description 1, type 2."""
    n, d = b.CreateString(name), b.CreateString(description)
    return _table(b, 5, {0: n, 1: d}, {2: (_byte, kind)})


def _tensor(b: flatbuffers.Builder, t: Tensor) -> int:
    """A ``TensorMetadata``: name 0, description 1, content 3, process_units 4, stats 5, files 6."""
    if t.image:  # ImageProperties: color_space 0
        properties = _table(b, 2, {}, {0: (_byte, _GRAYSCALE if t.grayscale else _RGB)})
    else:  # FeatureProperties: no field
        properties = _table(b, 0, {})
    kind = _IMAGE_PROPERTIES if t.image else _FEATURE_PROPERTIES
    content = _table(b, 3, {1: properties}, {0: (_ubyte, kind)})  # Content: type 0, value 1
    fields = {3: content}
    if t.mean:  # ProcessUnit(NormalizationOptions: mean 0, std 1): type 0, value 1
        options = _table(b, 2, {0: _floats(b, t.mean), 1: _floats(b, t.std)})
        fields[4] = _vector(b, [_table(b, 2, {1: options}, {0: (_ubyte, _NORMALIZATION_OPTIONS)})])
    if t.stats:  # Stats: max 0, min 1
        fields[5] = _table(b, 2, {0: _floats(b, t.stats[0]), 1: _floats(b, t.stats[1])})
    if t.labels:
        fields[6] = _vector(b, [_file(b, t.labels, _LABELS_DESCRIPTION, _TENSOR_AXIS_LABELS)])
    fields[0], fields[1] = b.CreateString(t.name), b.CreateString(t.description)
    return _table(b, 7, fields)
