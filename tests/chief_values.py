"""Helper program for tests/test_from_chief.py: one multi_worker_mirrored worker getting
values only the chief computes (:func:`tfopt.runtime.strategy.from_chief`, which hands channel
pruning's latency table to every worker).

    python -m tfopt.launch --workers 2 -- python tests/chief_values.py

Each worker prints ``FROM_CHIEF <task> values=<a>,<b> computed=<n>``: the chief computes
``[its index + 1, 7]``, ``n`` counts the computations in this worker.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tfopt.config import RuntimeConfig  # noqa: E402
from tfopt.runtime.strategy import from_chief, is_chief, make_strategy  # noqa: E402
from tfopt.runtime.tf_config import cluster_from_env  # noqa: E402


def main() -> None:
    cluster = cluster_from_env()
    strategy = make_strategy(RuntimeConfig(strategy="multi_worker_mirrored"), cluster)
    computed = []

    def compute():
        computed.append(cluster.task_index)
        return [cluster.task_index + 1.0, 7.0]

    values = from_chief(strategy, is_chief(cluster), 2, compute)
    task = f"{cluster.task_type}:{cluster.task_index}"
    print(
        f"FROM_CHIEF {task} values={values[0]:g},{values[1]:g} computed={len(computed)}", flush=True
    )


if __name__ == "__main__":
    main()
