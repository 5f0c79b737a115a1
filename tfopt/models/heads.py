"""The output end of a model tfopt trains: logits (a final softmax removed) and a classification
layer for the data's classes (:func:`fit_head`); a copy under another dtype policy (:func:`recast`)."""

from __future__ import annotations

from tfopt.core._keras import keras

from tfopt.core.errors import ModelError


def _output_layer(model: keras.Model):
    return model.get_layer(model.output_names[0])


def _is_softmax(layer) -> bool:
    if isinstance(layer, keras.layers.Softmax):
        return True
    activation = getattr(layer, "activation", None)
    return (
        activation is keras.activations.softmax or getattr(activation, "__name__", "") == "softmax"
    )


def to_logits(model: keras.Model) -> tuple[keras.Model, str]:
    """Removes a final softmax so that the model outputs logits.

    Returns:
        The model (``model`` itself when it already ends in logits) and what was done, for the record.
    """
    if len(model.outputs) != 1:
        raise ModelError(
            f"model {model.name!r} has {len(model.outputs)} outputs; tfopt trains classifiers "
            "with one output of class scores"
        )
    layer = _output_layer(model)
    if not _is_softmax(layer):
        return model, "logits"
    if isinstance(layer, (keras.layers.Softmax, keras.layers.Activation)):
        return keras.Model(
            model.inputs, layer.input, name=model.name
        ), f"logits (softmax layer {layer.name!r} removed)"
    return recast(
        model, linear=layer.name
    ), f"logits (softmax activation of {layer.name!r} removed)"


def recast(model: keras.Model, *, linear: str = "", policy: str = "") -> keras.Model:
    """A copy of ``model`` with the layer ``linear``'s activation removed, and every layer but the
    output one under the dtype ``policy`` (a file saved in float32 then trains as configured)."""
    output = _output_layer(model).name
    if not linear and (not policy or policy == "float32"):
        return model

    def clone(layer):
        config = layer.get_config()
        if layer.name == linear:
            config["activation"] = "linear"
        if (
            policy
            and layer.name != output
            and "dtype" in config
            and not isinstance(layer, keras.layers.InputLayer)
        ):
            config["dtype"] = policy
        return layer.__class__.from_config(config)

    copy = keras.models.clone_model(model, clone_function=clone)
    copy.set_weights(model.get_weights())
    return copy


def fit_head(
    model: keras.Model, num_classes: int, head: str, name: str, *, new: bool = False
) -> tuple[keras.Model, str]:
    """Gives the model a logits layer for ``num_classes`` classes as ``head`` says.

    ``auto`` keeps the model's own layer when it has ``num_classes`` outputs, else replaces it;
    ``new`` always replaces a final Dense layer (or adds one on top of other outputs); ``keep``
    never touches it. ``new=True`` says the builder made a fresh head already.

    Returns:
        The model and what was done (``kept``, ``new``, ``replaced 'NAME'``, ``added``).

    Raises:
        ModelError: ``keep`` with another class count, or an output that is not one vector per image.
    """
    if new:
        return model, "new"
    outputs = model.output_shape[-1]
    if len(model.output_shape) != 2:
        raise ModelError(
            f"model {name!r} outputs {model.output_shape[1:]} per image, not one score per class; "
            "end it in a Dense layer, or give --head new to add one"
        )
    if head == "keep" or (head == "auto" and outputs == num_classes):
        if outputs != num_classes:
            raise ModelError(
                f"model {name!r} has {outputs} outputs but the data has {num_classes} classes; give the "
                "data it was trained on, or train it on this data with --head new (a new classification layer)"
            )
        return model, "kept"
    layer = _output_layer(model)
    taken = {l.name for l in model.layers}
    logits_name = "logits" if "logits" not in taken - {layer.name} else "head_logits"
    dense = lambda x: keras.layers.Dense(num_classes, dtype="float32", name=logits_name)(x)  # noqa: E731
    if isinstance(layer, keras.layers.Dense):
        return keras.Model(
            model.inputs, dense(layer.input), name=model.name
        ), f"replaced {layer.name!r}"
    return keras.Model(model.inputs, dense(model.output), name=model.name), "added"
