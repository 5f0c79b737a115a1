"""Image folders for the tests, written from real data (scikit-learn's 8x8 digits) or from known values."""

import os

from tfopt.core._keras import tf

import numpy as np

ENCODERS = {
    "png": lambda x: tf.io.encode_png(x).numpy(),
    "jpg": lambda x: tf.io.encode_jpeg(x, quality=100).numpy(),
    "bmp": lambda x: _bmp(x),
    "gif": lambda x: _gif(x),
}


def _bmp(x: np.ndarray) -> bytes:
    """An uncompressed 24-bit BMP (TensorFlow decodes BMP but has no encoder)."""
    rgb = np.repeat(x, 3, axis=2) if x.shape[2] == 1 else x[..., :3]
    h, w, _ = rgb.shape
    row = (w * 3 + 3) & ~3
    pixels = bytearray()
    for r in rgb[::-1]:  # bottom-up rows, BGR
        line = r[:, ::-1].astype(np.uint8).tobytes()
        pixels += line + b"\0" * (row - len(line))
    header = (
        b"BM" + (54 + len(pixels)).to_bytes(4, "little") + b"\0\0\0\0" + (54).to_bytes(4, "little")
    )
    info = (
        (40).to_bytes(4, "little")
        + w.to_bytes(4, "little")
        + h.to_bytes(4, "little")
        + (1).to_bytes(2, "little")
        + (24).to_bytes(2, "little")
        + b"\0" * 4
        + len(pixels).to_bytes(4, "little")
        + b"\0" * 16
    )
    return header + info + bytes(pixels)


def _gif(x: np.ndarray) -> bytes:
    """A one-frame GIF of a gray image (an uncompressed LZW stream, a 256-entry gray palette)."""
    gray = x[..., 0] if x.shape[2] == 1 else x.mean(axis=2).astype(np.uint8)
    h, w = gray.shape
    out = bytearray(
        b"GIF89a" + w.to_bytes(2, "little") + h.to_bytes(2, "little") + bytes([0xF7, 0, 0])
    )
    out += bytes(v for g in range(256) for v in (g, g, g))
    out += b"," + b"\0\0\0\0" + w.to_bytes(2, "little") + h.to_bytes(2, "little") + b"\0"
    # LZW with 8-bit codes: emit a clear code before the table would grow past 9-bit codes.
    codes, clear, end = [], 256, 257
    for i, v in enumerate(gray.reshape(-1)):
        if i % 250 == 0:
            codes.append(clear)
        codes.append(int(v))
    codes.append(end)
    bits, nbits, data = 0, 0, bytearray()
    for c in codes:
        bits |= c << nbits
        nbits += 9
        while nbits >= 8:
            data.append(bits & 0xFF)
            bits >>= 8
            nbits -= 8
    if nbits:
        data.append(bits & 0xFF)
    out.append(8)
    for i in range(0, len(data), 255):
        chunk = data[i : i + 255]
        out += bytes([len(chunk)]) + chunk
    return bytes(out + b"\0;")


def write_image(path: str, image: np.ndarray) -> None:
    """Writes a uint8 ``[H, W, C]`` image in the format its suffix names."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(ENCODERS[path.rsplit(".", 1)[1]](image))


def digits_folder(
    root: str,
    per_class: int = 40,
    classes: int = 10,
    scale: int = 4,
    rgb: bool = True,
    start: int = 0,
) -> str:
    """Real handwritten digits as class folders ``root/digit_K/``: each 8x8 digit enlarged ``scale`` times
    (32x32 by default), as PNG, RGB when ``rgb``; images ``start`` to ``start + per_class - 1``
    of each class."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    seen = np.zeros(10, int)
    for image, label in zip(digits.images, digits.target):
        if label >= classes or seen[label] >= start + per_class:
            continue
        if seen[label] < start:
            seen[label] += 1
            continue
        x = np.rint(np.kron(image, np.ones((scale, scale))) * (255 / 16)).astype(np.uint8)[
            ..., None
        ]
        write_image(
            os.path.join(root, f"digit_{label}", f"{seen[label]:04d}.png"),
            np.repeat(x, 3, axis=2) if rgb else x,
        )
        seen[label] += 1
    return root


def split_digits_folder(root: str, counts=(24, 6, 10), classes: int = 3, **kw) -> str:
    """Digits as ``root/train``, ``root/val`` and ``root/test`` class folders (no image in two
    splits): ``counts`` images per class in each; ``kw`` as :func:`digits_folder` takes them."""
    start = 0
    for split, n in zip(("train", "val", "test"), counts):
        digits_folder(os.path.join(root, split), n, classes, start=start, **kw)
        start += n
    return root


def constant_folder(
    root: str, counts: dict, sizes=((12, 16), (20, 10)), formats=("png", "jpg", "bmp", "gif")
):
    """Class folders of flat images whose value encodes the class: ``value(label, i) = 40 * label + 2 * (i % 8)``.

    Image ``i`` of a class has size ``sizes[i % len(sizes)]`` and format ``formats[i % len(formats)]``;
    class ``K`` of ``counts`` (``{split_or_None: {class name: n}}``) gets label = its sorted index.
    Returns ``{path: value}``.
    """
    values = {}
    for split, classes in counts.items():
        names = sorted(classes)
        for label, name in enumerate(names):
            for i in range(classes[name]):
                h, w = sizes[i % len(sizes)]
                fmt = formats[i % len(formats)]
                value = 40 * label + 2 * (i % 8)
                path = os.path.join(root, *([split] if split else []), name, f"{i:03d}.{fmt}")
                write_image(
                    path, np.full((h, w, 3 if fmt in ("jpg", "bmp") else 1), value, np.uint8)
                )
                values[path] = value
    return values
