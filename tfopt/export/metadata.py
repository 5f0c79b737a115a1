"""TFLite Metadata in every exported image classifier: what MediaPipe Tasks and LiteRT's apps read.

An app's runtime (MediaPipe Tasks' ``ImageClassifier`` on Android, iOS, the web and Python) reads
a model's labels and input normalization from the standard TFLite Metadata flatbuffer (the
model's ``TFLITE_METADATA`` buffer), never from side files. :func:`write` builds it with
MediaPipe's own metadata classes (``metadata_info`` and ``MetadataPopulator``, the code behind
its ``metadata_writers``):

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
import os
import tempfile
import unicodedata
import zipfile

from tfopt.errors import DataError, ModelError

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
        DataError: a name is empty or holds a control character (a newline would shift every
            later label by one).
    """
    for name in names:
        bad = next((c for c in name if unicodedata.category(c)[0] == "C"), None)
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
        The model file's bytes: the flatbuffer with its metadata buffer, then the packed files.

    Raises:
        DataError: a class name that cannot be a label line.
        ModelError: MediaPipe's populator refuses the model (not one input and one output).
    """
    from tfopt._compat import mediapipe_metadata

    metadata, info, fb = mediapipe_metadata()
    names = list(contract.get("class_names") or [])
    check_labels(names)
    shape = contract.get("image_shape") or []
    mean, std = normalization(contract)
    with tempfile.TemporaryDirectory(prefix="tfopt-metadata-") as tmp:
        paths = []
        for fname, data in sorted((files or {}).items()):
            paths.append(os.path.join(tmp, fname))
            with open(paths[-1], "wb") as f:
                f.write(data)
        label_files = None
        if names:
            paths.append(os.path.join(tmp, LABELS))
            with open(paths[-1], "w", encoding="utf-8") as f:
                f.write("\n".join(names) + "\n")
            label_files = [info.LabelFileMd(paths[-1])]
        model_md = info.GeneralMd(
            name=name, version=version, description=description, author="tfopt"
        ).create_metadata()
        model_md.associatedFiles = [
            _associated(fb, fname, "Associated file of the model.") for fname in sorted(files or {})
        ] or None
        in_type, out_type = _io_types(fb, content)
        image = info.InputImageTensorMd(
            name="image",
            description=_input_description(contract, mean, std, content),
            norm_mean=mean,
            norm_std=std,
            color_space_type=(
                fb.ColorSpaceType.GRAYSCALE if shape and shape[-1] == 1 else fb.ColorSpaceType.RGB
            ),
            tensor_type=in_type,
        ).create_metadata()
        scores = info.ClassificationTensorMd(
            name=outputs,
            description=(
                "Probability of each class (softmax)."
                if outputs == "probabilities"
                else "Logit of each class (apply softmax for probabilities)."
            ),
            label_files=label_files,
            tensor_type=out_type,
        ).create_metadata()
        graph = fb.SubGraphMetadataT()
        graph.inputTensorMetadata = [image]
        graph.outputTensorMetadata = [scores]
        model_md.subgraphMetadata = [graph]
        import flatbuffers

        builder = flatbuffers.Builder(0)
        builder.Finish(model_md.Pack(builder), metadata.MetadataPopulator.METADATA_FILE_IDENTIFIER)
        populator = metadata.MetadataPopulator.with_model_buffer(bytearray(content))
        try:
            populator.load_metadata_buffer(bytes(builder.Output()))
            populator.load_associated_files(paths)
            populator.populate()
            return bytes(populator.get_model_buffer())
        except ValueError as e:
            raise ModelError(f"cannot write TFLite Metadata into the model ({e})") from None
        finally:
            del populator  # its temporary model file goes now, not at interpreter exit


def _associated(fb, fname: str, description: str):
    item = fb.AssociatedFileT()
    item.name = fname
    item.description = description
    item.type = fb.AssociatedFileType.DESCRIPTIONS
    return item


def _io_types(fb, content: bytes):
    """The flatbuffer tensor types of the model's one input and one output."""
    from tfopt._compat import read_tflite_model

    model = read_tflite_model(content)
    graph = model.subgraphs[0]
    if len(graph.inputs) != 1 or len(graph.outputs) != 1:
        raise ModelError(
            f"the model has {len(graph.inputs)} inputs and {len(graph.outputs)} outputs; an "
            "image classifier's metadata describes one image in and one score tensor out"
        )
    return graph.tensors[graph.inputs[0]].type, graph.tensors[graph.outputs[0]].type


def _input_description(contract: dict, mean: list[float], std: list[float], content: bytes) -> str:
    from tfopt._compat import read_tflite_model

    graph = read_tflite_model(content).subgraphs[0]
    tensor = graph.tensors[graph.inputs[0]]
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
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            out = {}
            for member in archive.infolist():
                if member.file_size > MAX_MEMBER_BYTES:
                    raise ModelError(
                        f"{where}: its packed file {member.filename[:80]!r} expands to "
                        f"{member.file_size} bytes (at most {MAX_MEMBER_BYTES}); re-export it"
                    )
                out[member.filename] = archive.read(member)
            return out
    except zipfile.BadZipFile:
        return {}
    except (NotImplementedError, zipfile.LargeZipFile, OSError, EOFError, ValueError) as e:
        raise ModelError(f"{where}: its packed files cannot be read ({e}); re-export it") from None


def labels(path_or_bytes: str | bytes) -> list[str]:
    """The class labels packed into a ``.tflite``, in output order (empty when it has none)."""
    text = read(path_or_bytes).get(LABELS, b"").decode()
    return text.splitlines()


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
