"""folder_edge: your photos and a keras.applications network, to an edge model.

A folder with one subfolder of images per class (or train/ val/ test/ subfolders of those) and
any model source. By default an ImageNet MobileNetV2 teacher is fine-tuned on the photos at
96x96 RGB, a MobileNetV2 of width 0.35 is distilled from it, pruned with QAT, and every model is
exported and measured:

    python -m tfopt.pipeline pipelines/folder_edge.py --set data.dataset=folder:/path/to/photos
    python -m tfopt.pipeline pipelines/folder_edge.py --set data.dataset=folder:photos \\
        --set teacher.model=keras.applications:EfficientNetB0 --set data.image_size=128x128
    python -m tfopt.pipeline pipelines/folder_edge.py --variant smoke --set data.dataset=folder:photos

``weights=imagenet`` downloads the ImageNet weights once (Keras caches them in ``~/.keras``);
without internet give ``teacher.args=weights=/path/to/weights.h5`` or ``weights=None``. The smoke
variant trains from random weights at 32x32 for a minute: it checks the chain, not the accuracy.
"""

from tfopt.pipeline import from_dict

VARIANTS = ("default", "smoke")

DEFAULT = {
    "name": "folder_edge",
    "data": {
        "dataset": "folder:photos",
        "image_size": "96x96",
        "channels": 3,
        "global_batch_size": 32,
        "augment": "crop_flip",
        "crop_padding": 8,
    },
    "runtime": {"strategy": "mirrored"},
    "teacher": {
        "model": "keras.applications:MobileNetV2",
        "args": "alpha=1.0,weights=imagenet",
        "epochs": 5,
        "learning_rate": 1e-4,
    },
    "student": {
        "model": "keras.applications:MobileNetV2",
        "args": "alpha=0.35",
        "epochs": 20,
        "learning_rate": 1e-3,
        "temperature": 4.0,
        "alpha": 0.9,
    },
    "compress": {"techniques": ["pqat"], "sparsity": 0.5, "epochs": 2, "learning_rate": 2e-4},
    "export": {
        "modes": ["float32", "dynamic_auto", "float16", "int8", "int8_auto"],
        "runs": 100,
        "threads": [1, 2],
    },
    "select": "acc_drop<=2,min:p50_us",
}

SMOKE = {
    "data": {
        "image_size": "32x32",
        "limit": 256,
        "global_batch_size": 32,
        "augment": "none",
        "crop_padding": 0,
    },
    "runtime": {"strategy": "one_device"},
    "teacher": {"args": "alpha=0.35,weights=None", "epochs": 1, "learning_rate": 1e-3},
    "student": {"model": "small_cnn", "args": "", "epochs": 1},
    "compress": {"epochs": 1},
    "export": {
        "modes": ["float32", "int8"],
        "eval_limit": 128,
        "runs": 10,
        "warmup": 2,
        "threads": [1],
        "calibration_steps": 2,
    },
    "probe": {"steps": 4},
    "select": "acc_drop<=100,min:p50_us",
}


def get_config(variant: str = "default"):
    """The pipeline's config for ``variant`` (``default`` or ``smoke``)."""
    cfg = from_dict(DEFAULT)
    return from_dict(SMOKE, cfg) if variant == "smoke" else cfg
