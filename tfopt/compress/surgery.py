"""Model surgery: edit a functional tf_keras model's config, rebuild it, carry its weights over.

Structured compression (low-rank factorization, channel pruning) changes layer shapes and adds
layers, which neither ``clone_model`` nor a tfmot wrapper can do. :class:`Graph` edits the model's
functional config instead (layer settings, inserted layers, weights by layer name) and builds a
plain, flat tf_keras model from it: QAT, PTQ, distillation and export take it like any other.

    graph = Graph(model)
    graph.insert_before("fc", "fc_lr", "Dense", {"units": 32, "use_bias": False}, [a])
    graph.set_layer("fc", weights=[b, bias])
    smaller = graph.build()
"""

from __future__ import annotations

import copy
from typing import Any

from tfopt.core._keras import keras

import numpy as np

from tfopt.compress.common import OptimizeError
from tfopt.core._compat import is_graph_network


def functional(model: keras.Model) -> keras.Model:
    """``model`` as a functional model: a Sequential becomes one over the same layers.

    Raises:
        OptimizeError: a subclassed model (its graph is Python code, not a config to edit).
    """
    if isinstance(model, keras.Sequential):
        if not model.built or not model.inputs:
            raise OptimizeError(
                f"Sequential model {model.name!r} has no input shape; start it with "
                "keras.Input(shape=...) so its graph can be rewritten"
            )
        return keras.Model(model.inputs, model.outputs, name=model.name)
    if not is_graph_network(model):
        raise OptimizeError(
            f"model {model.name!r} is a subclassed keras.Model, whose graph is Python code; "
            "structured compression needs a functional or Sequential model"
        )
    return model


def fresh(model: keras.Model) -> keras.Model:
    """A functional copy of ``model`` with its weights whose layers belong to it alone.

    A layer object shared with another model (the source of a clone, a tfmot-stripped model)
    has that model's calls too; shapes and call counts are then ambiguous.
    """
    model = functional(model)
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    return copy


class Graph:
    """An editable copy of a functional model's config and weights.

    Args:
        model: A functional or Sequential tf_keras model.
    """

    def __init__(self, model: keras.Model):
        self.model = functional(model)
        self.config = copy.deepcopy(self.model.get_config())
        self.entries: dict[str, dict] = {entry["name"]: entry for entry in self.config["layers"]}
        self.layers = {layer.name: layer for layer in self.model.layers}
        self.weights: dict[str, list[np.ndarray]] = {
            name: layer.get_weights() for name, layer in self.layers.items()
        }

    def inbound(self, name: str) -> list[str]:
        """Names of the layers whose outputs ``name`` takes (over all its calls)."""
        return [ref[0] for node in self.entries[name]["inbound_nodes"] for ref in node]

    def consumers(self, name: str) -> list[str]:
        """Names of the layers that take an output of ``name``, in config order."""
        return [
            other
            for other, entry in self.entries.items()
            if any(ref[0] == name for node in entry["inbound_nodes"] for ref in node)
        ]

    def calls(self, name: str) -> int:
        """How many times the model calls layer ``name`` (a shared layer: more than once)."""
        return len(self.entries[name]["inbound_nodes"])

    def set_layer(self, name: str, weights: list[np.ndarray] | None = None, **config: Any) -> None:
        """Changes settings of layer ``name`` (e.g. ``units=32``) and/or replaces its weights."""
        self.entries[name]["config"].update(config)
        if weights is not None:
            self.weights[name] = list(weights)

    def insert_before(
        self,
        name: str,
        new_name: str,
        class_name: str,
        config: dict[str, Any],
        weights: list[np.ndarray],
    ) -> None:
        """Inserts layer ``new_name`` between layer ``name`` and its inputs.

        The new layer takes what ``name`` took; ``name`` takes the new layer's output. The
        consumers of ``name`` and the model's outputs are unchanged.

        Raises:
            OptimizeError: ``name`` is called more than once or ``new_name`` is taken.
        """
        if self.calls(name) != 1:
            raise OptimizeError(
                f"layer {name!r} is shared ({self.calls(name)} calls); it cannot be rewritten"
            )
        if new_name in self.entries:
            raise OptimizeError(f"layer name {new_name!r} is taken; rename that layer")
        template = self.entries[name]
        entry = {
            "class_name": class_name,
            "name": new_name,
            "inbound_nodes": template["inbound_nodes"],
            "config": {
                "name": new_name,
                "trainable": template["config"].get("trainable", True),
                "dtype": template["config"].get("dtype", "float32"),
                **config,
            },
        }
        if "module" in template:
            entry["module"] = template["module"]
            entry["registered_name"] = None
        template["inbound_nodes"] = [[[new_name, 0, 0, {}]]]
        layers = self.config["layers"]
        layers.insert(layers.index(template), entry)
        self.entries = {e["name"]: e for e in layers}
        self.weights[new_name] = list(weights)

    def build(self) -> keras.Model:
        """The edited model, built fresh (outside any strategy scope) with the edited weights.

        Raises:
            OptimizeError: a weight shape does not fit the edited layer (a bug of the edit).
        """
        config = copy.deepcopy(self.config)
        for entry in config["layers"]:
            entry.pop(
                "build_config", None
            )  # input shapes change; each layer builds on its new inputs
        model = keras.Model.from_config(config)
        for layer in model.layers:
            weights = self.weights.get(layer.name)
            if weights:
                layer.set_weights(weights)
        return model
