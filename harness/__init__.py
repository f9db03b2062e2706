"""specdec-harness: benchmark and regression harness for speculative decoding with draft trees.

The top-level folders `kernels/` and `dashboards/` are the subpackages `harness.kernels` and
`harness.dashboards` (docs/ARCHITECTURE.md: a top-level `kernels` import would collide with a widely
installed library). An installed wheel maps them with setuptools' package-dir; a plain source
checkout on PYTHONPATH (a GPU host running the repo or a shipped bundle) gets the same mapping
from the small finder below, so `import harness.kernels.x` works in both.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

__version__ = "0.1.0"

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
_ROOT_REAL = os.path.realpath(_ROOT)
_SUBPACKAGES = {"harness.kernels": "kernels", "harness.dashboards": "dashboards"}


class _SourceTreeFinder(importlib.abc.MetaPathFinder):
    """Resolve harness.kernels / harness.dashboards to the top-level folders of a checkout, and
    keep those folders from shadowing installed top-level packages of the same names.

    A process started in the checkout (`python -m harness.worker`, pytest) has the checkout on
    sys.path, where a bare `import kernels` would find our folder. Hugging Face transformers
    imports the `kernels` library whenever it is installed (5.25 does so on importing a model),
    and then failed on our folder. So a bare name first looks everywhere but the checkout; only
    when nothing else is installed does the normal search find the folder."""

    def find_spec(self, fullname, path=None, target=None):
        folder = _SUBPACKAGES.get(fullname)
        if folder is not None:
            # PathFinder looks for the last component ("kernels") in the given folder.
            return importlib.machinery.PathFinder.find_spec(fullname, [_ROOT])
        if path is None and fullname in _SUBPACKAGES.values():
            elsewhere = [p for p in sys.path if os.path.realpath(p or os.curdir) != _ROOT_REAL]
            return importlib.machinery.PathFinder.find_spec(fullname, elsewhere)
        return None


def _needs_finder() -> bool:
    # Only in a source tree: there the subpackages are not inside harness/ itself.
    return any(not os.path.isdir(os.path.join(_HERE, f.split(".")[1])) and
               os.path.isfile(os.path.join(_ROOT, folder, "__init__.py"))
               for f, folder in _SUBPACKAGES.items())


if _needs_finder() and not any(isinstance(f, _SourceTreeFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _SourceTreeFinder())
