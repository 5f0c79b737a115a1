"""A Python with MediaPipe, beside the suite's own: mediapipe pins absl-py~=2.3, tfmot absl-py~=1.2,
so pip cannot install both in one environment. The venv is made once (from the package registry)
under ``~/.cache/tfopt`` and reused; ``TFOPT_MEDIAPIPE_PYTHON`` names another interpreter."""

import os
import shutil
import subprocess
import sys
import tempfile

MEDIAPIPE = "mediapipe==1.2.2"


def mediapipe_python() -> str:
    """The interpreter of a virtual environment that has ``MEDIAPIPE`` installed."""
    given = os.environ.get("TFOPT_MEDIAPIPE_PYTHON")
    if given:
        return given
    cache = os.path.join(os.path.expanduser("~"), ".cache", "tfopt")
    home = os.path.join(cache, MEDIAPIPE.replace("==", "-"))
    python = os.path.join(home, "bin", "python")
    if os.path.exists(python):
        return python
    os.makedirs(cache, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".mediapipe-", dir=cache)
    try:
        subprocess.run([sys.executable, "-m", "venv", work], check=True)
        subprocess.run(
            [os.path.join(work, "bin", "python"), "-m", "pip", "install", "-q", MEDIAPIPE],
            check=True,
            timeout=900,
        )
        os.rename(work, home)  # whole or not at all
    except (subprocess.SubprocessError, OSError):
        shutil.rmtree(work, ignore_errors=True)
        if not os.path.exists(python):  # another process may have won the race
            raise
    return python
