"""GPipe pipeline parallelism: a model's layers in K stages on K devices, each batch in M micro-batches.

Huang et al. (2019): the layers are split into K contiguous stages, each placed on its own device
(its variables and its ops), and every batch into M micro-batches. In one ``tf.function`` each
stage runs the forward pass of every micro-batch as soon as the previous stage hands it over, so
stage k works on micro-batch m while stage k+1 works on micro-batch m-1; the loss is taken over
the whole batch's predictions, so the backward passes follow all the forward ones and the
gradients each stage's variables receive from the M micro-batches are summed before one optimizer
step. The step therefore computes what the unsplit model's step computes, up to the order of
float additions. A stage may recompute its activations in the backward pass instead of keeping
them (``remat``, ``tf.recompute_grad``): only the activations crossing stage boundaries are kept.
BatchNormalization normalizes each micro-batch by its own statistics and updates its moving
averages once per micro-batch, as GPipe does.

    part = partition(model, stages=2, by="time", seconds=piece_seconds(model, x))
    pipelined = Pipelined(build_stages(model, part, stage_devices(2)), microbatches=8)
    pipelined.compile(optimizer, loss, metrics)   # then fit / evaluate as any Keras model
    copy_weights_back(pipelined, model)           # the trained weights in the user's model

A stage boundary carries exactly one tensor: a functional model can be cut only where its main
path is the one tensor alive (not inside a residual block). Sequential and functional tf_keras
models with one input and one output are split; a subclassed model has no layer graph to split.
"""

from tfopt.runtime.gpipe.model import (
    SCHEDULES,
    Pipelined,
    copy_weights_back,
    split,
)
from tfopt.runtime.gpipe.schedule import microbatch_sizes
from tfopt.runtime.gpipe.stages import (
    BALANCE,
    Partition,
    build_stages,
    partition,
    stage_devices,
)

__all__ = [
    "BALANCE",
    "Partition",
    "Pipelined",
    "SCHEDULES",
    "build_stages",
    "copy_weights_back",
    "microbatch_sizes",
    "partition",
    "split",
    "stage_devices",
]
