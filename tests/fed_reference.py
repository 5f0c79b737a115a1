"""FedAvg recomputed in one process from a finished ``tfopt federated`` run (argv[1]): its round-0
model, its partition and the clients' training code, every client of every round in turn. Prints
one JSON line: the largest difference from the run's model, the same for an unweighted average
of the last round (how far a wrong aggregation would land). Under ``--client-runtime litert``
the clients' head is trained in the same .tflite, made again from the round-0 model."""

import json
import os
import sys

from tfopt.core._keras import keras

import numpy as np

from tfopt.data import sources
from tfopt.data.pipeline import load_split
from tfopt.federated import local
from tfopt.federated.partition import partition
from tfopt.runs import load_run


def fedavg(models: list[list[np.ndarray]], sizes: list[int]) -> list[np.ndarray]:
    """The average of ``models`` weighted by ``sizes``, in float32 and in the clients' order, as
    the run's server sums them (float32 arrays times Python floats, added in place)."""
    factors = [n / sum(sizes) for n in sizes]
    out = [w * factors[0] for w in models[0]]
    for model, factor in zip(models[1:], factors[1:]):
        for total, w in zip(out, model):
            total += w * factor
    return out


def main(run_dir: str) -> dict:
    local.deterministic()
    keras.utils.set_random_seed(0)  # saving traces the model's random ops (dropout): seeded
    run = load_run(run_dir)
    cfg = run.config
    fed = cfg.federated
    info = sources.prepare(cfg.data)
    x, y = load_split(cfg.data, "train", info=info)
    parts = partition(y, fed, cfg.data.seed)
    spec = {"cfg": cfg, "image_shape": list(info.image_shape), "num_classes": info.num_classes}
    model = local.build(spec)
    weights, _ = local.load_arrays(os.path.join(run_dir, "federated", "initial.npz"))
    model.set_weights(weights)
    final = keras.models.load_model(run.model_path, compile=False)
    on_device = fed.client_runtime == "litert"
    if on_device:  # the run's head trains in the same file, made again from the round-0 model
        from tfopt.models import ondevice

        part = ondevice.split(model)
        trainable = os.path.join(run_dir, "model_trainable.tflite")
        with open(trainable, "wb") as f:
            f.write(ondevice.convert(part, info.image_shape, fed.client_lr, "logits"))
        model, final = model.get_layer(part.head.name), final.get_layer(part.head.name)
        weights = model.get_weights()
    sizes = [len(p) for p in parts]
    for round_ in range(1, fed.rounds + 1):
        outs = []
        for i, idx in enumerate(parts):
            common = {
                "epochs": fed.local_epochs,
                "batch_size": cfg.data.global_batch_size,
                "seed": local.client_seed(cfg.train.seed, round_, i),
            }
            if on_device:
                outs.append(local.fit_litert(trainable, weights, x[idx], y[idx], **common)[0])
            else:
                mu = fed.proximal_mu if fed.algorithm == "fedprox" else 0.0
                got = local.fit(model, weights, x[idx], y[idx], lr=fed.client_lr, mu=mu, **common)
                outs.append(got[0])
        weights = fedavg(outs, sizes)
    plain = [np.mean([o[k] for o in outs], axis=0) for k in range(len(outs[0]))]
    final = final.get_weights()
    return {
        "max_abs_diff": max(float(np.max(np.abs(a - b))) for a, b in zip(final, weights)),
        "unweighted_diff": max(float(np.max(np.abs(a - b))) for a, b in zip(plain, weights)),
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
