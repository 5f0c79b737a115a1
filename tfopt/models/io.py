"""Saving and safely loading models: the one way every tfopt stage reads a model.

Keras model files can carry code: an ``.h5`` or SavedModel with a ``Lambda`` layer stores
Python bytecode, and a ``.keras`` config may name any importable module. Those are refused
unless the user trusts the file (``--trust-model``).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import zipfile
from collections.abc import Iterator
from typing import Any

from tfopt.core._keras import ensure_tf_keras, keras

from tfopt.core import _compat
from tfopt.core.errors import ModelError
from tfopt.core.fileio import atomic_dir, atomic_path
from tfopt.runtime import sharding

# tfmot wrappers (QAT, pruning, clustering) are registered Keras classes of a known library.
_SAFE_MODULE_PREFIXES = ("keras", "tf_keras", "tensorflow_model_optimization")
_FIX = "pass --trust-model (trust_model=True) only if you trust where the file came from"
# Serialized objects that carry Python: a Lambda layer (its function, output_shape and mask as
# bytecode or a module path) and a lambda anywhere in the new format (e.g. an activation).
_CODE_CLASSES = ("Lambda", "__lambda__")


def _walk(node: Any) -> Iterator[Any]:
    """Every value of a parsed config: the objects, lists and strings of every nesting level."""
    yield node
    for value in (
        node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    ):
        yield from _walk(value)


def _is_bytecode(text: str) -> bool:
    """True for Keras's serialized function: base64 of a marshalled code object (type byte ``c``, flagged or not)."""
    if len(text) < 16 or text[0] not in "4Y":
        return False
    try:
        return base64.b64decode("".join(text.split()), validate=True)[:1] in (b"\xe3", b"c")
    except ValueError:  # binascii.Error included: not base64, so not a stored function
        return False


def _check_config(config: Any, path: str) -> None:
    """Refuses a parsed model config (nested models and every format's encoding included) that can run code."""
    if not isinstance(config, dict):
        raise ModelError(
            f"{path}'s model config is a {type(config).__name__}, not an object; re-save the model"
        )
    for node in _walk(config):
        if isinstance(node, str) and _is_bytecode(node):
            raise ModelError(
                f"{path} holds a serialized Python function (e.g. a lambda activation), which runs on "
                f"load; {_FIX}"
            )
        if not isinstance(node, dict):
            continue
        if node.get("class_name") in _CODE_CLASSES or "function_type" in node:
            inner = node.get("config")
            name = inner.get("name", "?") if isinstance(inner, dict) else node.get("name", "?")
            kind = {"Lambda": "Lambda layer", "__lambda__": "lambda"}.get(
                node.get("class_name"), "function"
            )
            raise ModelError(
                f"{path} has a {kind} {name!r} holding stored Python code, which runs on load; {_FIX}"
            )
        module = node.get("module")
        if isinstance(module, str) and module and module.split(".")[0] not in _SAFE_MODULE_PREFIXES:
            raise ModelError(
                f"{path} names the module {module!r} (class {node.get('class_name')!r}), which would be "
                f"imported on load; {_FIX}"
            )


#: The largest ``config.json`` / ``metadata.json`` tfopt expands from a ``.keras`` file (a real
#: model's config is a few MB; a zip bomb's expands to gigabytes).
MAX_CONFIG_BYTES = 64 * 1024 * 1024


def read_member(z: zipfile.ZipFile, name: str, path: str) -> bytes:
    """The bytes of member ``name`` of the model file ``path``, refused past ``MAX_CONFIG_BYTES``.

    Raises:
        KeyError: no such member.
        ModelError: it expands past the cap.
    """
    size = z.getinfo(name).file_size
    if size > MAX_CONFIG_BYTES:
        raise ModelError(
            f"{path}: its {name} expands to {size} bytes (at most {MAX_CONFIG_BYTES} are read); "
            "this is not a model file tfopt will open: re-save the model"
        )
    return z.read(name)


def saved_by_keras3(path: str) -> str | None:
    """The Keras version that saved ``path`` when it is 3 or later (a file tf_keras cannot load), else None."""
    try:
        if os.path.isfile(path) and zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                found = str(
                    json.loads(read_member(z, "metadata.json", path)).get("keras_version", "")
                )
        elif path.endswith((".h5", ".hdf5")) and os.path.isfile(path):
            import h5py

            with h5py.File(path, "r") as f:
                raw = f.attrs.get("keras_version", "")
            found = raw if isinstance(raw, str) else raw.decode()
        else:
            return None
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None
    return found if found.split(".")[0].isdigit() and int(found.split(".")[0]) >= 3 else None


def _refuse_keras3(path: str) -> None:
    found = saved_by_keras3(path)
    if found:
        raise ModelError(
            f"{path} was saved by Keras 3 ({found}); tfopt trains with tf_keras (Keras 2), which tfmot "
            "needs: build the model with `import tf_keras as keras` (or TF_USE_LEGACY_KERAS=1 before "
            f"TensorFlow is imported) and save it again; to quantize it as it is: python -m tfopt.export "
            f"--from {path} --dataset ..."
        )


def _inspect(path: str) -> None:
    if path.endswith(".keras"):
        try:
            with zipfile.ZipFile(path) as z:
                config = json.loads(read_member(z, "config.json", path))
        except (zipfile.BadZipFile, KeyError, ValueError) as e:
            raise ModelError(
                f"{path} is not a valid .keras file ({e}); re-save the model"
            ) from None
        _check_config(config, path)
    elif path.endswith((".h5", ".hdf5")):
        import h5py

        try:
            with h5py.File(path, "r") as f:
                raw = f.attrs.get("model_config")
        except OSError as e:
            raise ModelError(
                f"{path} is not a valid .h5 model file ({str(e).splitlines()[0]}); re-save the model"
            ) from None
        if raw is None:
            raise ModelError(f"{path} holds no model config (weights only?); save the whole model")
        _check_config(json.loads(raw if isinstance(raw, str) else raw.decode()), path)
    elif os.path.isdir(path):
        if not os.path.exists(os.path.join(path, "keras_metadata.pb")):
            raise ModelError(
                f"{path} is a SavedModel without Keras metadata; save it with tf_keras"
            )
        from google.protobuf.message import DecodeError

        try:
            nodes = _compat.keras_saved_model_metadata(path)
        except (OSError, DecodeError) as e:
            raise ModelError(
                f"{path}'s keras_metadata.pb cannot be read ({e}), so it cannot be checked for "
                f"stored code; re-save the model, or {_FIX}"
            ) from None
        for node_path, metadata in nodes:
            try:
                config = json.loads(metadata) if metadata else {}
            except ValueError:
                raise ModelError(
                    f"{path}: the metadata of {node_path!r} is not JSON, so it cannot be checked for "
                    f"stored code; re-save the model, or {_FIX}"
                ) from None
            _check_config(config, path)
    else:
        raise ModelError(
            f"{path} is not a model file; give a .keras file, an .h5 file or a SavedModel directory"
        )


def _mentions(path: str, text: str) -> bool:
    """True when the model file's stored config (.keras, .h5 or SavedModel metadata) contains ``text``."""
    try:
        if os.path.isdir(path):
            with open(os.path.join(path, "keras_metadata.pb"), "rb") as f:
                return text.encode() in f.read()
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                return text in read_member(z, "config.json", path).decode("utf-8", "replace")
        if path.endswith((".h5", ".hdf5")):
            import h5py

            with h5py.File(path, "r") as f:
                raw = f.attrs.get("model_config")
            return raw is not None and text in (
                raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
            )
    except (OSError, KeyError, zipfile.BadZipFile):
        return False
    return False


def tfmot_objects() -> dict:
    """tfmot's Keras classes (quantization, pruning, clustering), for deserializing wrapped models."""
    import tensorflow_model_optimization as tfmot

    custom: dict = {}
    for scope in (
        tfmot.quantization.keras.quantize_scope(),
        tfmot.sparsity.keras.prune_scope(),
        tfmot.clustering.keras.cluster_scope(),
    ):
        for objects in scope.custom_objects:
            custom.update(objects)
    return custom


def load_model(
    path: str,
    *,
    trust_model: bool = False,
    custom_objects: dict | None = None,
    compile: bool = False,
) -> keras.Model:
    """Loads a tf_keras model, refusing files that can run code unless trusted.

    Models holding tfmot wrappers (a quantization-aware model, an unstripped pruned or
    clustered one) load with tfmot's classes.

    Args:
        path: A ``.keras`` file, an ``.h5`` file, a SavedModel directory, or a tfopt run
            directory (its ``model.keras`` is loaded).
        trust_model: Skip the code checks and load with Keras safe mode off.
        custom_objects: Extra classes for deserialization.
        compile: Restore the training config too.

    Returns:
        The loaded tf_keras model.

    Raises:
        ModelError: the path is missing or not a model, or it can run code on load and is
            not trusted.
    """
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "model.keras")):
        path = os.path.join(path, "model.keras")
    if not os.path.exists(path):
        raise ModelError(
            f"model {path!r} does not exist; give a .keras/.h5 file, a SavedModel or a run directory"
        )
    if (
        os.path.isdir(path)
        and os.path.exists(os.path.join(path, "saved_model.pb"))
        and not os.path.exists(os.path.join(path, "keras_metadata.pb"))
    ):
        raise ModelError(
            f"{path!r} is an inference SavedModel without Keras metadata (a run's saved_model/ is one, "
            "for serving); give the run directory or its model.keras, or load it with tf.saved_model.load"
        )
    _refuse_keras3(path)
    if not trust_model:
        _inspect(path)
    if _mentions(path, "tensorflow_model_optimization"):
        # Pruned, clustered and quantization-aware models deserialize only with tfmot's classes.
        custom_objects = {**tfmot_objects(), **(custom_objects or {})}
    kwargs = {"custom_objects": custom_objects, "compile": compile}
    if path.endswith(".keras"):
        kwargs["safe_mode"] = not trust_model
    try:
        # A model file's weights are whole: under a variable partitioner (parameter servers with
        # --shard-variables) its layers must not be created sharded, or they would not load.
        with sharding.kept_whole():
            model = keras.models.load_model(path, **kwargs)
    except (ValueError, TypeError, OSError) as e:
        raise ModelError(f"cannot load {path}: {str(e).splitlines()[0]}") from None
    return ensure_tf_keras(model)


def save_model(model: keras.Model, out_dir: str) -> dict[str, str]:
    """Saves ``model`` as ``out_dir/model.keras`` and ``out_dir/saved_model``, each atomically.

    ``model.keras`` is the model to load back into Keras (every later stage reads it);
    ``saved_model/`` is the inference SavedModel for serving (TF Serving, ``tf.saved_model.load``):
    Keras's ``Model.export``, whose ``serve`` endpoint and ``serving_default`` signature take a
    batch of inputs and return the model's outputs (no training config, no per-layer functions).

    Args:
        model: A tf_keras model.
        out_dir: The run directory.

    Returns:
        ``{"keras": path, "saved_model": path}``.
    """
    ensure_tf_keras(model)
    keras_path = os.path.join(out_dir, "model.keras")
    with atomic_path(keras_path) as tmp:
        model.save(tmp)
    sm_path = os.path.join(out_dir, "saved_model")
    with atomic_dir(sm_path) as tmp:
        with contextlib.redirect_stdout(
            io.StringIO()
        ):  # "Saved artifact at ..." and the endpoint's signature
            model.export(tmp)
    return {"keras": keras_path, "saved_model": sm_path}
