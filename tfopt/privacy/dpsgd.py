"""DP-SGD in a tf_keras model's train step: each example's gradient clipped, Gaussian noise once.

Abadi et al. (2016): per step, every example's gradient is clipped to L2 norm ``C``, the clipped
gradients are summed, Gaussian noise of standard deviation ``noise_multiplier * C`` is added to
the sum, and the noisy sum over the batch size is what the optimizer applies.

Per-example norms and the clipped sum come from a formula for Dense, Conv2D and Embedding layers
(:mod:`tfopt.privacy.ghost`); the other layers' per-example gradients come vectorized: one
example's forward and backward pass, mapped over the batch with ``tf.vectorized_map`` (pfor),
one graph for the whole batch. (``GradientTape.jacobian`` of the per-example losses computes the
same gradients but falls back to a loop for convolution filters: 26x slower on ``dp_cnn``.) Under a synchronous strategy each replica clips and sums its own examples and the
optimizer's all-reduce adds the replicas' sums; the noise is added once, by replica 0, so the
global sum carries exactly one draw of it, whatever the number of replicas. The noise is drawn
from a stateless generator keyed by the step, so a run resumed from a backup draws the same
noise as the uninterrupted one. Under mixed_float16 the per-example losses are scaled by the loss
scale and the gradients unscaled before clipping.

Batch normalization mixes the examples of a batch: no example's gradient exists alone, so a
model with it is refused (as TensorFlow Privacy and Opacus do).
"""

from __future__ import annotations

from tfopt.core._keras import keras, tf

from tfopt.core.errors import ModelError
from tfopt.privacy import ghost
from tfopt.privacy.objective import objective_of

#: Layers whose output for one example depends on the others of its batch.
_BATCH_COUPLED = (keras.layers.BatchNormalization,)


def check_model(model: keras.Model) -> None:
    """Refuses a model whose layers mix the examples of a batch.

    Raises:
        ModelError: one line naming the layer and the fix.
    """
    for layer in ghost.leaves(model):
        if isinstance(layer, _BATCH_COUPLED) and layer.trainable:
            raise ModelError(
                f"model {model.name!r} has {type(layer).__name__} layer {layer.name!r}: its batch "
                "statistics mix the examples of a batch, so no example's gradient can be clipped "
                "alone (DP-SGD); use a model without it (e.g. --model dp_cnn or cnn_gn, or GroupNormalization "
                "or LayerNormalization in its place)"
            )


def make_private(
    model: keras.Model,
    l2_clip: float,
    noise_multiplier: float,
    global_batch_size: int,
    seed: int = 0,
    *,
    ghost_norms: bool = True,
) -> dict[str, str]:
    """Makes ``model``'s train step DP-SGD's (call it after ``compile``, before ``fit``).

    Args:
        model: A compiled tf_keras classifier with integer labels and logits out.
        l2_clip: Each example's gradient is clipped to this L2 norm.
        noise_multiplier: The noise's standard deviation over ``l2_clip``.
        global_batch_size: What the noisy sum is divided by: the batch of one step over all
            replicas.
        seed: Keys the noise, with the step number.
        ghost_norms: Per-example norms from a formula where a layer has one
            (:mod:`tfopt.privacy.ghost`); False: every layer's gradients vectorized.

    Returns:
        Each trainable layer's name -> how its per-example norms are computed.

    Raises:
        ModelError: the model has a layer that mixes the examples of a batch.
    """
    check_model(model)
    part = ghost.split(model, formulas=ghost_norms)
    goal = objective_of(model)

    def train_step(data):
        return _private_step(
            model, goal, part, data, l2_clip, noise_multiplier, global_batch_size, seed
        )

    model.train_step = train_step
    return dict(part.methods)


def _per_example(model, goal, variables, x, y, scaled):
    """Each example's gradients of ``variables`` (vectorized), its logits and its extras."""
    optimizer = model.optimizer

    def one(example):
        xi, yi = example
        with tf.GradientTape() as tape:
            loss, logits, extras = goal.losses(xi[None], yi[None])
            loss = loss[0]
            objective = optimizer.get_scaled_loss(loss) if scaled else loss
        grads = tape.gradient(objective, variables, unconnected_gradients="zero")
        return grads, logits[0], {k: v[0] for k, v in extras.items()}

    per_example, logits, extras = tf.vectorized_map(one, (x, y))
    if scaled:
        per_example = optimizer.get_unscaled_gradients(per_example)
    return per_example, logits, extras


def _private_step(model, goal, part, data, l2_clip, noise_multiplier, global_batch_size, seed):
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    variables = model.trainable_variables
    optimizer = model.optimizer
    scaled = isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer)
    noise_seed = tf.stack([tf.cast(seed, tf.int64), tf.cast(optimizer.iterations, tf.int64)])
    if part.ghost:
        sums, logits, extras = _ghost_sums(model, goal, part, x, y, l2_clip, scaled)
        grads = noisy_mean(
            sums, l2_clip, noise_multiplier, global_batch_size, noise_seed, _first_replica()
        )
    else:
        per_example, logits, extras = _per_example(model, goal, variables, x, y, scaled)
        grads = clipped_noisy_mean(
            per_example,
            l2_clip,
            noise_multiplier,
            global_batch_size,
            noise_seed=noise_seed,
            add_noise=_first_replica(),
        )
    regularization = goal.penalties()
    if regularization:  # data-independent: its gradient costs no privacy
        with tf.GradientTape() as tape:
            penalty = tf.add_n(regularization)
        extra = tape.gradient(penalty, variables, unconnected_gradients="zero")
        grads = [g + e for g, e in zip(grads, extra)]
    optimizer.apply_gradients(zip(grads, variables))
    return goal.report(x, y, logits, sample_weight, extras)


def _ghost_sums(model, goal, part, x, y, l2_clip, scaled):
    """The sum of the clipped per-example gradients, the batch's logits and extras: one
    backward pass to the recorded layers' outputs gives their norms and their clipped sums
    (:mod:`tfopt.privacy.ghost`); the other layers' come vectorized."""
    optimizer = model.optimizer
    variables = model.trainable_variables
    with tf.GradientTape() as tape:
        with ghost.recording(part.ghost) as records:
            losses, logits, extras = goal.losses(x, y)
        total = tf.reduce_sum(losses)
        objective = optimizer.get_scaled_loss(total) if scaled else total
    zs = [r.z for r in records]
    by_z = tape.gradient(objective, zs, unconnected_gradients="zero")
    if scaled:
        by_z = optimizer.get_unscaled_gradients(by_z)
    operands = ghost.operands(records, by_z)
    squares = ghost.squared_norms(operands)
    others = part.vectorized_variables
    if others:
        per_example, _, _ = _per_example(model, goal, others, x, y, scaled)
        n = tf.shape(x)[0]
        squares += tf.add_n(
            [
                tf.reduce_sum(tf.reshape(tf.square(tf.cast(g, tf.float32)), [n, -1]), axis=1)
                for g in per_example
            ]
        )
    factor = tf.minimum(1.0, l2_clip / tf.maximum(tf.sqrt(squares), 1e-12))
    sums = ghost.weighted_sums(operands, factor)
    if others:
        sums.update(
            {
                v.ref(): tf.tensordot(factor, tf.cast(g, tf.float32), axes=1)
                for v, g in zip(others, per_example)
            }
        )
    return [sums[v.ref()] for v in variables], logits, extras


def _first_replica():
    replica = tf.distribute.get_replica_context()
    if replica is None:
        return tf.constant(True)
    return tf.equal(tf.cast(replica.replica_id_in_sync_group, tf.int32), 0)


def clipped_noisy_mean(
    per_example: list,
    l2_clip: float,
    noise_multiplier: float,
    global_batch_size: int,
    *,
    noise_seed,
    add_noise=True,
) -> list:
    """The DP-SGD gradient of per-example gradients: each example's clipped to ``l2_clip``, summed,
    Gaussian noise of std ``noise_multiplier * l2_clip`` added (when ``add_noise``), over the
    global batch size.

    Args:
        per_example: One tensor per variable, shaped ``[examples, *variable shape]``.
        l2_clip: The clipping norm C.
        noise_multiplier: sigma: the noise's standard deviation is sigma * C.
        global_batch_size: The divisor.
        noise_seed: A shape-[2] int64 seed of the stateless noise (each variable offsets it).
        add_noise: A boolean (tensor): this replica adds the noise.
    """
    per_example = [tf.cast(g, tf.float32) for g in per_example]
    n = tf.shape(per_example[0])[0]
    squares = tf.add_n(
        [tf.reduce_sum(tf.reshape(tf.square(g), [n, -1]), axis=1) for g in per_example]
    )
    factor = tf.minimum(1.0, l2_clip / tf.maximum(tf.sqrt(squares), 1e-12))
    sums = [tf.tensordot(factor, g, axes=1) for g in per_example]
    return noisy_mean(sums, l2_clip, noise_multiplier, global_batch_size, noise_seed, add_noise)


def noisy_mean(sums, l2_clip, noise_multiplier, global_batch_size, noise_seed, add_noise=True):
    """Sums of clipped gradients with Gaussian noise of std ``noise_multiplier * l2_clip`` added
    (when ``add_noise``; each variable's draw keyed by ``noise_seed`` and its index), over the
    global batch size."""
    on = tf.cast(add_noise, tf.float32)
    out = []
    for i, total in enumerate(sums):
        seed = tf.random.experimental.stateless_fold_in(noise_seed, i)
        noise = tf.random.stateless_normal(tf.shape(total), seed=seed)
        out.append((total + on * noise_multiplier * l2_clip * noise) / global_batch_size)
    return out


class EpsilonLog(keras.callbacks.Callback):
    """Puts the epsilon spent so far (RDP; PLD as ``epsilon_pld``) into each epoch's logs: the
    progress line, ``metrics.csv`` and the run's history show it.

    Args:
        plan: The run's :class:`~tfopt.privacy.plan.Plan`.
        steps_per_epoch: Optimizer steps per epoch.
        first_epoch: Epochs of the run fitted before this fit (a later phase).
    """

    def __init__(self, plan, steps_per_epoch: int, first_epoch: int = 0):
        super().__init__()
        self.plan, self.steps_per_epoch, self.first_epoch = plan, steps_per_epoch, first_epoch

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        spent = self.plan.spent((self.first_epoch + int(epoch) + 1) * self.steps_per_epoch)
        logs["epsilon"] = spent["rdp"]
        if spent["pld"] is not None:
            logs["epsilon_pld"] = spent["pld"]
