"""What every figure test asserts of a written PNG: the file is a PNG, of a readable size,
and not a blank canvas. Imported as ``from figcheck import assert_png`` (``tests/`` is on
the path through ``tests/conftest.py``)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image as mpimg
import numpy as np

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(path: Path) -> None:
    """Assert ``path`` is a PNG at least 400 x 200 pixels whose pixels vary."""
    assert path.read_bytes()[:8] == PNG_MAGIC
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 400
    assert float(np.asarray(img).std()) > 0.01  # not a blank canvas
