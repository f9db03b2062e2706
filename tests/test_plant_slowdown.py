"""ci/plant_slowdown.py still finds what it edits (its anchors moved once, with the layout, and
it silently planted nothing), and a planted tree still imports."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("kernel, edited", [("verify", "kernels/verify/triton_verify.py"),
                                            ("topk", "kernels/tree/triton_topk.py")])
def test_each_plant_edits_its_kernel_once(tmp_path, kernel, edited):
    shutil.copytree(REPO / "kernels", tmp_path / "kernels",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    run = [sys.executable, str(REPO / "ci" / "plant_slowdown.py"), kernel, "--root", str(tmp_path)]
    first = subprocess.run(run, capture_output=True, text=True, timeout=60, check=False)
    assert first.returncode == 0 and first.stdout.startswith("planted:"), first.stderr
    text = (tmp_path / edited).read_text()
    ast.parse(text)
    assert text != (REPO / edited).read_text() and "PLANTED_SLOWDOWN" in text
    again = subprocess.run(run, capture_output=True, text=True, timeout=60, check=False)
    assert again.returncode == 1 and "already planted" in again.stderr
