"""MediaPipe Tasks' ImageClassifier, the runtime apps use, run on exported .tflite files.

    python mediapipe_client.py FOLDER MODEL.tflite [MODEL.tflite ...]

Classifies every image of the class folders under FOLDER with each model, loaded with no option
but its path (labels and normalization come from the file's metadata), and prints one JSON object:
file -> {accuracy, examples, labels (the category names it gave), scores (per image, in the
order of the sorted class folders and file names, by category index)}.
"""

import json
import os
import sys

import mediapipe as mp
from mediapipe.tasks.python import vision
from mediapipe.tasks.python.core import base_options


def main(folder: str, models: list[str]) -> dict:
    images = [
        (name, os.path.join(folder, name, f))
        for name in sorted(os.listdir(folder))
        for f in sorted(os.listdir(os.path.join(folder, name)))
    ]
    out = {}
    for path in models:
        options = vision.ImageClassifierOptions(
            base_options=base_options.BaseOptions(model_asset_path=path)
        )
        right, names, scores = 0, set(), []
        with vision.ImageClassifier.create_from_options(options) as classifier:
            for label, image in images:
                categories = (
                    classifier.classify(mp.Image.create_from_file(image))
                    .classifications[0]
                    .categories
                )
                top = max(categories, key=lambda c: c.score)
                right += top.category_name == label
                names.update(c.category_name for c in categories)
                row = [0.0] * len(categories)
                for c in categories:
                    row[c.index] = c.score
                scores.append(row)
        out[os.path.basename(path)] = {
            "accuracy": right / len(images),
            "examples": len(images),
            "labels": sorted(names),
            "scores": scores,
        }
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2:])))
