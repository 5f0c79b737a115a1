"""MediaPipe Tasks' ImageClassifier, the runtime apps use, run on exported .tflite files.

    python mediapipe_client.py FOLDER MODEL.tflite [MODEL.tflite ...]

Classifies every image of the class folders under FOLDER with each model, loaded with no option
but its path (labels and normalization come from the file's metadata), and prints one JSON object:
file -> {accuracy, examples, labels (the category names it gave), scores (per image, in the
order of the sorted class folders and file names, by category index), metadata (the file's
TFLite Metadata as MediaPipe's generated schema reads it)}.
"""

import json
import os
import sys

import mediapipe as mp
from mediapipe.tasks.metadata import metadata_schema_py_generated as md
from mediapipe.tasks.metadata import schema_py_generated as tflite
from mediapipe.tasks.python import vision
from mediapipe.tasks.python.core import base_options


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


def read_metadata(path: str) -> dict:
    """The TFLITE_METADATA buffer of a .tflite, as MediaPipe's generated readers see it."""
    data = bytearray(open(path, "rb").read())
    model = tflite.ModelT.InitFromObj(tflite.Model.GetRootAsModel(data, 0))
    (entry,) = [m for m in model.metadata if _text(m.name) == "TFLITE_METADATA"]
    buf = bytes(bytearray(model.buffers[entry.buffer].data))
    assert md.ModelMetadata.ModelMetadataBufferHasIdentifier(buf, 0)
    meta = md.ModelMetadataT.InitFromObj(md.ModelMetadata.GetRootAsModelMetadata(buf, 0))
    graph = meta.subgraphMetadata[0]
    image, scores = graph.inputTensorMetadata[0], graph.outputTensorMetadata[0]
    norm = image.processUnits[0].options
    return {
        "name": _text(meta.name),
        "version": _text(meta.version),
        "author": _text(meta.author),
        "min_parser_version": _text(meta.minParserVersion),
        "files": [_text(f.name) for f in meta.associatedFiles or []],
        "input": _text(image.name),
        "color_space": image.content.contentProperties.colorSpace,
        "mean": [float(v) for v in norm.mean],
        "std": [float(v) for v in norm.std],
        "output": _text(scores.name),
        "label_files": [(_text(f.name), f.type) for f in scores.associatedFiles or []],
        "output_stats": None
        if scores.stats is None
        else [list(map(float, scores.stats.min)), list(map(float, scores.stats.max))],
    }


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
            "metadata": read_metadata(path),
        }
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2:])))
