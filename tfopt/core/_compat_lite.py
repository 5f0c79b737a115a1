"""The LiteRT and TFLite-converter entries of :mod:`tfopt.core._compat` (which re-exports them):
private APIs with no public equivalent, each checked by ``tests/test_compat.py``."""

from __future__ import annotations

from tfopt.core._keras import tf  # noqa: F401 - TensorFlow's logging set up before its modules load

# TensorFlow 2.21: tf.lite.TFLiteConverter.convert() raises ConverterError (unsupported ops, failed
# legalization), which tf.lite does not export; catching it by class needs the private module.
from tensorflow.lite.python.convert_phase import ConverterError  # noqa: F401


def interpreter_ops_details(interpreter) -> list[dict]:
    """The execution plan of a LiteRT / TFLite interpreter: one dict per node (``op_name``, ``index``,
    ``inputs``, ``outputs``), delegate nodes included.

    ai-edge-litert 2.3 (and tf.lite in TF 2.21) exposes it only as the private
    ``Interpreter._get_ops_details``; it is the only way to see which kernels XNNPACK took.
    """
    return interpreter._get_ops_details()


def signature_invoker(runner):
    """A function that invokes one signature of a multi-signature .tflite and nothing else.

    ``SignatureRunner.__call__`` resizes, allocates, copies the inputs in and the outputs out on
    every call; timing one subgraph needs its bare ``Invoke``. ai-edge-litert 2.3 keeps it in the
    private ``_interpreter_wrapper`` and ``_subgraph_index``. Call the runner once with inputs first.
    """
    wrapper, index = runner._interpreter_wrapper, runner._subgraph_index
    return lambda: wrapper.Invoke(index)


def modify_model_io_type(content: bytes, dtype) -> bytes:
    """The quantized flatbuffer ``content`` with inputs and outputs of ``dtype`` (tf.int8, tf.uint8).

    The converter applies this post-processing step itself, but TensorFlow 2.21 exposes it only as
    ``tensorflow.lite.python.util.modify_model_io_type``; the quantization debugger returns
    float-I/O models, so selective int8 needs it to give them integer I/O.
    """
    from tensorflow.lite.python import util as lite_util

    return bytes(lite_util.modify_model_io_type(content, dtype, dtype))


def read_tflite_model(content: bytes):
    """A .tflite flatbuffer as an editable object (``schema_py_generated.ModelT``).

    ai-edge-litert 2.3 ships the reader in ``ai_edge_litert.tools.flatbuffer_utils``, which is not
    part of its documented API (nor is TensorFlow's copy, ``tensorflow.lite.tools``); neither
    tf.lite nor LiteRT has a public way to edit a model (e.g. to strip its tensor names).
    """
    from ai_edge_litert.tools import flatbuffer_utils

    return flatbuffer_utils.read_model_from_bytearray(bytearray(content))


def tflite_schema():
    """The flatbuffer schema's generated Python module (``BuiltinOperator`` codes, ``BufferT``...).

    ai-edge-litert 2.3 ships it as ``ai_edge_litert.schema_py_generated``, undocumented, the
    module :func:`read_tflite_model`'s objects come from.
    """
    from ai_edge_litert import schema_py_generated

    return schema_py_generated


def write_tflite_model(model) -> bytes:
    """The flatbuffer of an object from :func:`read_tflite_model` (same private module)."""
    from ai_edge_litert.tools import flatbuffer_utils

    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def save_for_converter(model, path: str) -> None:
    """Writes the tf_keras ``model`` to ``path`` as ``from_keras_model`` does before converting it,
    less the per-layer functions no converter reads.

    TensorFlow 2.21's ``from_keras_model`` calls ``tf.saved_model.save(model, dir,
    options=SaveOptions(save_debug_info=True))``, and tf_keras then traces every layer's call for
    its own reloading (its ``save_traces``): for MobileNetV2 (alpha 0.35, 32x32) 7.3 of the save's
    seconds, and loading them back triples the conversion. The converter reads only the
    ``serving_default`` signature, Keras's trace of the whole model's call
    (``saving_utils.trace_model_call``). This writes that signature alone, under tf_keras's private
    ``keras_option_scope(save_traces=False)``: 1.6 s, and the same flatbuffer, byte for byte.
    """
    from tf_keras.src.saving.legacy import saving_utils
    from tf_keras.src.saving.legacy.saved_model.utils import keras_option_scope

    with keras_option_scope(save_traces=False, in_tf_saved_model_scope=True):
        tf.saved_model.save(
            model,
            path,
            signatures=saving_utils.trace_model_call(model),
            options=tf.saved_model.SaveOptions(save_debug_info=True),
        )


def saved_model_converter(path: str):
    """``TFLiteConverter.from_keras_model(model)`` for a Keras model already written to ``path``.

    TensorFlow 2.21: ``from_keras_model`` writes the model with ``tf.saved_model.save`` to a
    temporary directory on every call and converts that SavedModel; converting one model to
    several modes writes it each time. This converts a SavedModel the caller wrote once that
    way, with the converter class and arguments ``from_saved_model`` uses (its up-front load only
    checks the signature keys that ``tf.saved_model.save`` always writes) and the conversion
    metadata ``from_keras_model`` records (model type KERAS_MODEL): the same flatbuffer, byte
    for byte.
    """
    from tensorflow.lite.python import conversion_metadata_schema_py_generated as metadata
    from tensorflow.lite.python.lite import TFLiteConverterBase, TFLiteSavedModelConverterV2

    TFLiteConverterBase._set_original_model_type(metadata.ModelType.KERAS_MODEL)
    return TFLiteSavedModelConverterV2(path, {"serve"}, ["serving_default"])


# -- workarounds for upstream defects ---------------------------------------------------------
