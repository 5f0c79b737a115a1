"""Edits of a converted .tflite flatbuffer: its I/O types and the strings the runtime never reads."""

from __future__ import annotations

import logging

from tfopt.core._keras import tf

from tfopt.core._compat import modify_model_io_type, read_tflite_model, write_tflite_model
from tfopt.core.errors import ModelError

IO_DTYPES = {"float": tf.float32, "int8": tf.int8, "uint8": tf.uint8}


class ConversionError(ModelError):
    """The TFLite converter cannot turn the model into the requested .tflite."""


def finish(content: bytes, options) -> bytes:
    """The last step of every exported flatbuffer: strips its strings when ``options`` (a
    :class:`~tfopt.export.converter.ConvertOptions`) ask for it."""
    return strip_strings(content) if options.strip_strings else content


def strip_strings(content: bytes) -> bytes:
    """Removes the strings the runtime does not need: tensor names, subgraph names, the description.

    The same fields TFLite's own ``flatbuffer_utils.strip_strings`` clears, except the signature
    defs: they are kept (a few bytes), because LiteRT's CompiledModel API and the interpreter's
    signature runner address inputs and outputs by their signature names. Op codes, custom op
    names and metadata stay. The model computes exactly what it computed before.
    """
    model = read_tflite_model(content)
    model.description = None
    for subgraph in model.subgraphs or []:
        subgraph.name = None
        for tensor in subgraph.tensors or []:
            tensor.name = None
    return write_tflite_model(model)


def modify_io(content: bytes, io_type: str) -> bytes:
    """Sets the I/O type of a quantized flatbuffer (e.g. after selective quantization).

    Uses the converter's own post-processing step (:func:`tfopt.core._compat.modify_model_io_type`)
    because the quantization debugger only returns float-I/O models.
    """
    if io_type == "float":
        return content
    absl = logging.getLogger("absl")
    level = absl.level
    # It warns when the first op stays float and the input keeps float: the caller reads the type back.
    absl.setLevel(logging.ERROR)
    try:
        return modify_model_io_type(content, IO_DTYPES[io_type])
    except (ValueError, RuntimeError) as e:
        raise ConversionError(
            f"cannot give the model {io_type} inputs/outputs ({str(e).splitlines()[0]}); "
            "use --io float"
        ) from None
    finally:
        absl.setLevel(level)
