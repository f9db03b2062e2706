"""pyproject.toml ships every package and every kernel source: a wheel installed on a GPU host
imports what the source tree does (the packages are listed by hand, because kernels/ and
dashboards/ map to harness.kernels and harness.dashboards, and a folder left out of the list
or a .cu file left out of package-data installs silently and fails only on that host)."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
FOLDERS = {v: k for k, v in SETUPTOOLS["package-dir"].items()}    # folder -> package


def package_of(folder: Path) -> str:
    top, *rest = folder.relative_to(ROOT).parts
    return ".".join([FOLDERS[top], *rest])


def test_every_package_folder_is_listed():
    folders = [p.parent for top in FOLDERS for p in (ROOT / top).rglob("__init__.py")]
    missing = sorted({package_of(f) for f in folders} - set(SETUPTOOLS["packages"]))
    assert not missing, f"pyproject.toml [tool.setuptools] packages lacks {missing}"


def test_every_kernel_source_and_template_is_package_data():
    data = SETUPTOOLS["package-data"]
    unshipped = []
    for top in FOLDERS:
        for path in (ROOT / top).rglob("*"):
            if path.suffix not in (".cu", ".cuh", ".h", ".j2"):
                continue
            patterns = data.get(package_of(path.parent), [])
            if not any(fnmatch.fnmatch(path.name, p) for p in patterns):
                unshipped.append(str(path.relative_to(ROOT)))
    assert not unshipped, f"pyproject.toml package-data does not ship {sorted(unshipped)}"
