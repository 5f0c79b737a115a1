"""TFLite Metadata in every exported image classifier: what MediaPipe Tasks and LiteRT's apps read.

An app's runtime (MediaPipe Tasks' ``ImageClassifier`` on Android, iOS, the web and Python) reads
a model's labels and input normalization from the standard TFLite Metadata flatbuffer (the
model's ``TFLITE_METADATA`` buffer), never from side files. :func:`write` puts it in, as
MediaPipe's ``metadata_writers.image_classifier`` and its populator do (the flatbuffer itself is
built by :mod:`tfopt.export.metadata_fb`, which says why not with MediaPipe's package):

- name, description, version and author;
- the input as an image (RGB, or grayscale for one channel) with the ``NormalizationOptions``
  that turn 0-255 pixels into what the model takes (the input contract tfopt decided);
- the output as class scores, ``probabilities`` or ``logits``, with the class names as its
  ``TENSOR_AXIS_LABELS`` file ``labels.txt``;
- ``input.json`` (the whole input contract) and any recipe as associated files of the model.

The associated files travel as a zip after the flatbuffer (the metadata format's own packing):
:func:`read` opens them with the standard library, without MediaPipe::

    zipfile.ZipFile("model_int8.tflite").read("labels.txt").decode().splitlines()
"""

from __future__ import annotations

import io
import json
import zipfile
import zlib

from tfopt.core.errors import DataError, ModelError
from tfopt.export import metadata_fb

LABELS = "labels.txt"
INPUT = "input.json"
#: The largest associated file :func:`read` expands (a packed file is a few KiB).
MAX_MEMBER_BYTES = 16 * 1024 * 1024


def files_of(contract: dict) -> dict[str, bytes]:
    """The associated files for an input contract (``tfopt.data.sources.input_contract``).

    The labels are not among them: :func:`write` attaches them to the output tensor.
    """
    return {INPUT: (json.dumps(contract, indent=2, sort_keys=True) + "\n").encode()}


def normalization(contract: dict) -> tuple[list[float], list[float]]:
    """``(mean, std)`` per channel that map 0-255 pixels to the model's input: ``(p - mean) / std``.

    The contract's mean and std are in units of the [0, 1] image (``pixels / 255``), or absent
    for a model that takes 0-255 pixels itself (``input_scale`` ``raw``).
    """
    if contract.get("input_scale") == "raw":
        return [0.0], [1.0]
    mean = [255.0 * float(m) for m in contract.get("mean") or [0.0]]
    std = [255.0 * float(s) for s in contract.get("std") or [1.0]]
    if len(mean) != len(std):  # one value stands for every channel
        n = max(len(mean), len(std))
        mean, std = (v * n if len(v) == 1 else v for v in (mean, std))
    return mean, std


def check_labels(names: list[str]) -> None:
    """Refuses class names that would not be one line each in ``labels.txt``.

    Raises:
        DataError: a name is empty or holds a control character or a line separator (a newline
            would shift every later label by one).
    """
    from tfopt.data.folder_source import line_breaker

    for name in names:
        bad = line_breaker(name)
        if not name or bad is not None:
            what = "is empty" if not name else f"holds the control character {bad!r}"
            raise DataError(
                f"class name {name[:80]!r} {what}: labels are one line per class; rename that "
                "class folder"
            )


def write(
    content: bytes,
    contract: dict,
    *,
    outputs: str,
    name: str,
    version: str,
    description: str = "",
    files: dict[str, bytes] | None = None,
) -> bytes:
    """``content`` with TFLite Metadata for an image classifier and its associated files.

    Args:
        content: A bare converted model (one image input, one class-score output).
        contract: The input contract (``image_shape``, ``input_scale``, ``mean``, ``std``,
            ``bgr``, ``class_names``).
        outputs: ``probabilities`` or ``logits``: what the output tensor holds.
        name: The model's name.
        version: The model's version (e.g. the export's fingerprint).
        description: One sentence on what the model does.
        files: Associated files of the whole model, name -> bytes (``input.json``, a recipe).

    Returns:
        The model file's bytes: the flatbuffer with its ``TFLITE_METADATA`` buffer, then the
        associated files as a zip archive (stored, as MediaPipe's populator packs them).

    Raises:
        DataError: a class name that cannot be a label line.
        ModelError: the model does not have one input and one output.
    """
    from tfopt.core._compat import read_tflite_model, tflite_schema, write_tflite_model

    names = list(contract.get("class_names") or [])
    check_labels(names)
    schema = tflite_schema()
    model = read_tflite_model(content)
    graph = model.subgraphs[0]
    if len(graph.inputs) != 1 or len(graph.outputs) != 1:
        raise ModelError(
            f"the model has {len(graph.inputs)} inputs and {len(graph.outputs)} outputs; an "
            "image classifier's metadata describes one image in and one score tensor out"
        )
    tensor_in, tensor_out = graph.tensors[graph.inputs[0]], graph.tensors[graph.outputs[0]]
    mean, std = normalization(contract)
    shape = contract.get("image_shape") or []
    ranges = {schema.TensorType.FLOAT32: (0.0, 1.0), schema.TensorType.UINT8: (0.0, 255.0)}
    buffer = metadata_fb.model_metadata(
        name=name,
        description=description,
        version=version,
        author="tfopt",
        image=metadata_fb.image_input(
            description=_input_description(contract, mean, std, tensor_in),
            mean=mean,
            std=std,
            grayscale=bool(shape) and shape[-1] == 1,
            uint8=tensor_in.type == schema.TensorType.UINT8,
        ),
        scores=metadata_fb.class_scores(
            name=outputs,
            description=(
                "Probability of each class (softmax)."
                if outputs == "probabilities"
                else "Logit of each class (apply softmax for probabilities)."
            ),
            labels=LABELS if names else None,
            value_range=ranges.get(tensor_out.type) if outputs == "probabilities" else None,
        ),
        files=sorted(files or {}),
    )
    _attach(model, schema, buffer)
    packed = dict(files or {})
    if names:
        packed[LABELS] = ("\n".join(names) + "\n").encode()
    out = io.BytesIO()
    out.write(write_tflite_model(model))
    with zipfile.ZipFile(out, "a") as archive:  # a new archive after the flatbuffer
        for fname, raw in sorted(packed.items()):
            archive.writestr(zipfile.ZipInfo(fname, date_time=(1980, 1, 1, 0, 0, 0)), raw)
    return out.getvalue()


def _attach(model, schema, buffer: bytes) -> None:
    """Puts ``buffer`` in ``model`` as its TFLite Metadata (replacing any it had)."""
    model.metadata = [m for m in model.metadata or [] if _text(m.name) != metadata_fb.BUFFER_NAME]
    entry = schema.MetadataT()
    entry.name = metadata_fb.BUFFER_NAME
    entry.buffer = len(model.buffers)
    data = schema.BufferT()
    data.data = list(buffer)
    model.buffers.append(data)
    model.metadata.append(entry)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _input_description(contract: dict, mean: list[float], std: list[float], tensor) -> str:
    q = tensor.quantization
    text = (
        f"{'x'.join(str(d) for d in contract.get('image_shape') or [])} image: "
        f"(pixel - {_fmt(mean)}) / {_fmt(std)}"
    )
    if contract.get("bgr"):
        text += ", channels in BGR order"
    if q is not None and q.scale is not None and len(q.scale):
        zero = int(q.zeroPoint[0]) if q.zeroPoint is not None and len(q.zeroPoint) else 0
        text += f"; quantized as round(x / {float(q.scale[0]):.6g}) + {zero}"
    return text + "."


def _fmt(values: list[float]) -> str:
    return ",".join(f"{v:g}" for v in values) if len(values) > 1 else f"{values[0]:g}"


def read(path_or_bytes: str | bytes) -> dict[str, bytes]:
    """The associated files of a ``.tflite`` (empty when it has none).

    Args:
        path_or_bytes: A ``.tflite`` path or its bytes.

    Raises:
        ModelError: a packed file is larger than :data:`MAX_MEMBER_BYTES` expanded, or cannot
            be expanded.
    """
    data = path_or_bytes if isinstance(path_or_bytes, bytes) else open(path_or_bytes, "rb").read()
    where = path_or_bytes if isinstance(path_or_bytes, str) else "the model"
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        return {}  # no packed files
    out = {}
    with archive:
        for member in archive.infolist():
            if member.file_size > MAX_MEMBER_BYTES:
                raise ModelError(
                    f"{where}: its packed file {member.filename[:80]!r} expands to "
                    f"{member.file_size} bytes (at most {MAX_MEMBER_BYTES}); re-export it"
                )
            try:
                out[member.filename] = archive.read(member)
            except (
                zipfile.BadZipFile,
                zlib.error,
                NotImplementedError,
                zipfile.LargeZipFile,
                OSError,
                EOFError,
                ValueError,
            ) as e:
                raise ModelError(
                    f"{where}: its packed file {member.filename[:80]!r} cannot be read ({e}); "
                    "re-export it"
                ) from None
    return out


def labels(path_or_bytes: str | bytes) -> list[str]:
    """The class labels packed into a ``.tflite``, in output order (empty when it has none)."""
    text = read(path_or_bytes).get(LABELS, b"").decode()
    return text.split("\n")[:-1] if text else []


def contract_of(path_or_bytes: str | bytes) -> dict:
    """The input contract packed into a ``.tflite`` (``input.json``; empty when it has none).

    Raises:
        ModelError: ``input.json`` is not a JSON object.
    """
    raw = read(path_or_bytes).get(INPUT)
    if raw is None:
        return {}
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        value = None
    if not isinstance(value, dict):
        raise ModelError(
            f"{path_or_bytes if isinstance(path_or_bytes, str) else 'the model'}: its packed "
            f"{INPUT} is not a JSON object; re-export it"
        )
    return value
