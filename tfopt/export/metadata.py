"""Files packed into a ``.tflite``: the class labels and the input contract travel with the model.

LiteRT's convention for a model's associated files (the TFLite Metadata "model with metadata"
format that ``tflite_support``'s writers produce and MediaPipe's tasks read) appends a zip
archive after the flatbuffer: interpreters read the flatbuffer and ignore what follows, and any
zip reader opens the same file. tfopt packs two members:

- ``labels.txt``: one class name per line, in output order (written when the data has names);
- ``input.json``: the input contract (shape, dtype, value range, normalization, channel order).

Read them back with :func:`read` or with the standard library::

    zipfile.ZipFile("model_int8.tflite").read("labels.txt").decode().splitlines()
"""

from __future__ import annotations

import io
import json
import zipfile

LABELS = "labels.txt"
INPUT = "input.json"


def files_of(contract: dict) -> dict[str, bytes]:
    """The members packed for an input contract (``tfopt.models.sources.input_contract``)."""
    out = {INPUT: (json.dumps(contract, indent=2, sort_keys=True) + "\n").encode()}
    if contract.get("class_names"):
        out[LABELS] = ("\n".join(contract["class_names"]) + "\n").encode()
    return out


def pack(content: bytes, files: dict[str, bytes]) -> bytes:
    """``content`` (a bare flatbuffer) followed by a zip archive holding ``files``.

    Args:
        content: The converted model, as the converter returned it.
        files: Member name -> bytes.

    Returns:
        The model file's bytes; the flatbuffer part is ``content`` unchanged.
    """
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in sorted(files.items()):
            info = zipfile.ZipInfo(
                name, date_time=(1980, 1, 1, 0, 0, 0)
            )  # same content, same bytes
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    packed = buf.getvalue()
    # A zip's offsets count from the start of the archive; make them count from the start of the
    # file, as a zip appended to an executable does, so the packed file is itself a valid zip.
    return content + _shift_offsets(packed, len(content))


def read(path_or_bytes: str | bytes) -> dict[str, bytes]:
    """The files packed into a ``.tflite`` (empty when it has none).

    Args:
        path_or_bytes: A ``.tflite`` path or its bytes.
    """
    data = path_or_bytes if isinstance(path_or_bytes, bytes) else open(path_or_bytes, "rb").read()
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return {name: archive.read(name) for name in archive.namelist()}
    except zipfile.BadZipFile:
        return {}


def labels(path_or_bytes: str | bytes) -> list[str]:
    """The class labels packed into a ``.tflite``, in output order (empty when it has none)."""
    text = read(path_or_bytes).get(LABELS, b"").decode()
    return text.splitlines()


def _shift_offsets(archive: bytes, shift: int) -> bytes:
    """Re-writes a zip's central directory so that every offset is ``shift`` bytes further on."""
    out = bytearray(archive)
    end = out.rfind(b"PK\x05\x06")
    entries = int.from_bytes(out[end + 10 : end + 12], "little")
    directory = int.from_bytes(out[end + 16 : end + 20], "little")
    out[end + 16 : end + 20] = (directory + shift).to_bytes(4, "little")
    pos = directory
    for _ in range(entries):
        assert out[pos : pos + 4] == b"PK\x01\x02", "not a central directory entry"
        local = int.from_bytes(out[pos + 42 : pos + 46], "little")
        out[pos + 42 : pos + 46] = (local + shift).to_bytes(4, "little")
        name, extra, comment = (
            int.from_bytes(out[pos + k : pos + k + 2], "little") for k in (28, 30, 32)
        )
        pos += 46 + name + extra + comment
    return bytes(out)
