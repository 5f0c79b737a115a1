"""A tfds image classification dataset whose images vary in size (as tf_flowers' do), made offline.

Image ``i`` of a split is flat gray: 60 (class ``dark``) or 180 (``light``), of size
(10 + i % 7) x (12 + i % 5).
"""

from tfopt.core._keras import tf  # noqa: F401  (sets TensorFlow's flags before tfds imports it)

import numpy as np
import tensorflow_datasets as tfds


class VaryingSizes(tfds.core.GeneratorBasedBuilder):
    """40 train and 10 test images of two classes and seven heights."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Image(shape=(None, None, 3)),
                    "label": tfds.features.ClassLabel(names=["dark", "light"]),
                }
            ),
            supervised_keys=("image", "label"),
        )

    def _split_generators(self, dl_manager):
        return {
            "train": self._generate_examples(40, "train"),
            "test": self._generate_examples(10, "test"),
        }

    def _generate_examples(self, n, split):
        for i in range(n):
            image = np.full((10 + i % 7, 12 + i % 5, 3), 60 + 120 * (i % 2), np.uint8)
            yield f"{split}-{i}", {"image": image, "label": i % 2}
