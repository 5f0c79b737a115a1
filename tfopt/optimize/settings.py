"""The :class:`~tfopt.optimize.runner.OptimizeSettings` of one technique, from the ``optimize``
section of the config tree (:class:`tfopt.config.OptimizeConfig`)."""

from __future__ import annotations

from tfopt.config import OptimizeConfig


def settings_for(o: OptimizeConfig, technique: str, trust_model: bool = False):
    """What ``technique`` runs with, from the config's ``optimize`` section.

    Without ``frequency`` the pruning masks are updated about 20 times per phase (at most every
    100 steps), counted from the real training split when the job starts. With ``epochs`` 0,
    pruning, low-rank and channel pruning fine-tune 3 epochs per phase and the others 1.

    Args:
        o: The ``optimize`` section (the technique-specific fields are read by their techniques).
        technique: One name of :data:`tfopt.compress.techniques.TECHNIQUES`.
        trust_model: Load a model file that can run code (``model.trust``).

    Raises:
        ConfigError: a ``phase_epochs`` or ``block_size`` that does not parse.
    """
    from tfopt.compress.channel_prune import ChannelSpec
    from tfopt.compress.cluster import ClusterSpec
    from tfopt.compress.common import Selection
    from tfopt.compress.low_rank import LowRankSpec
    from tfopt.compress.prune import PruneSpec
    from tfopt.optimize.runner import OptimizeSettings

    selection = Selection(_csv(o.layers), _csv(o.layer_types))
    return OptimizeSettings(
        technique=technique,
        prune=PruneSpec(
            sparsity=o.sparsity,
            schedule=o.schedule,
            initial_sparsity=o.initial_sparsity,
            begin_step=o.begin_step,
            end_step=o.end_step,
            frequency=o.frequency,
            block_size=o.block(),
            policy=o.policy,
            selection=selection,
        ),
        cluster=ClusterSpec(
            clusters=o.clusters,
            init=o.centroid_init,
            per_channel=o.per_channel,
            selection=selection,
        ),
        low_rank=LowRankSpec(
            rank_by=o.low_rank_by,
            energy=o.low_rank_energy,
            flops=o.low_rank_flops,
            round_to=o.low_rank_round_to,
            conv=o.low_rank_conv,
            selection=selection,
        ),
        channels=ChannelSpec(
            flops=o.channels_flops,
            ratio=o.channels_ratio,
            importance=o.importance,
            ranking=o.ranking,
            round_to=o.round_to,
            iterations=o.prune_iterations,
            taylor_batches=o.taylor_batches,
            latency_us=o.target_latency_us,
            latency_threads=o.latency_threads,
            selection=selection,
        ),
        qat_selection=selection,
        epochs=o.epochs or 1,
        phase_epochs=o.phase_epochs_of(),
        steps_per_epoch=o.steps_per_epoch,
        learning_rate=o.learning_rate,
        tensorboard=o.tensorboard,
        saved_model=o.saved_model,
        trust_model=trust_model,
    )


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())
