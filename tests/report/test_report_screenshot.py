"""The page renders in headless Chromium (only where a Chromium is installed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "screenshot_report.py"
sys.path.insert(0, str(SCRIPT.parent))
from screenshot_report import find_browser  # noqa: E402

pytestmark = pytest.mark.skipif(find_browser() is None, reason="no chromium installed to render the page")


def _blocks_with_content(shot: Path, block: int = 500) -> int:
    """How many horizontal bands of the screenshot are not a single flat colour."""
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=float)
    return sum(pixels[i : i + block].std() > 5 for i in range(0, pixels.shape[0], block))


@pytest.mark.parametrize("page_fixture", ["tiny_page", "pair_page"])
def test_page_renders_top_to_bottom(
    page_fixture: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    page = request.getfixturevalue(page_fixture)
    shot = tmp_path / "shot.png"
    command = [sys.executable, str(SCRIPT), str(page), "--out", str(shot), "--height", "4000"]
    subprocess.run(command, check=True, timeout=180, capture_output=True)
    assert Image.open(shot).size == (1400, 4000)
    assert _blocks_with_content(shot) == 8  # every band of the first 4000 px shows text or figures
