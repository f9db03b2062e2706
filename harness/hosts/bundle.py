"""The worker bundle: the code a GPU host needs to run cells, as one tarball named by its hash.

A bundle holds the worker side of the `harness` package (protocol, remote, worker, decode) with
the top-level `kernels/` folder inside it as `harness/kernels` — the layout an installed wheel
has, so `import harness.kernels.x` works on the host with nothing but `PYTHONPATH=<bundle>`.
The controller's folders (commands, sweep, hosts, gate) and `dashboards/` stay behind.

The tarball is deterministic (sorted names, zero mtimes, fixed owner and mode), so its hash
changes exactly when a shipped file does; an SSH host keeps one folder per hash under
`<workdir>/bundles/<hash>/` and receives a bundle only once.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path

import harness

# Files that are build or cache output, never source.
_SKIP_DIRS = {"__pycache__", ".pytest_cache", "build"}
_SKIP_SUFFIXES = (".pyc", ".pyo", ".so", ".o", ".tmp")


@dataclass(frozen=True)
class Bundle:
    hash: str          # 16 hex digits of the sha256 over every shipped (path, bytes)
    tarball: bytes     # gzip'd tar, members under harness/
    files: tuple[str, ...]


def _package_dirs() -> tuple[Path, Path | None]:
    """(harness package folder, kernels folder or None) of the running controller."""
    package = Path(harness.__file__).resolve().parent
    inside = package / "kernels"
    if inside.is_dir():                      # an installed wheel: already harness/kernels
        return package, None
    beside = package.parent / "kernels"      # a source checkout (editable install)
    return package, beside if (beside / "__init__.py").is_file() else None


def _walk(root: Path, prefix: str, skip_top: set[str]) -> list[tuple[str, Path]]:
    found = []
    for folder, dirs, files in os.walk(root):
        top = Path(folder) == root
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not d.startswith(".")
                   and not (top and d in skip_top)]
        for name in files:
            if name.startswith(".") or name.endswith(_SKIP_SUFFIXES):
                continue
            path = Path(folder) / name
            found.append((f"{prefix}/{path.relative_to(root).as_posix()}", path))
    return found


# What a remote host runs: the launcher and probe, the worker, the decode loop and what they
# share with the controller. The controller's own folders (commands, sweep, hosts, gate,
# dashboards) stay behind; tests/test_layers.py checks that the shipped side never imports them.
SHIPPED_PACKAGES = ("protocol", "remote", "worker", "decode", "kernels")


def shipped_files() -> list[tuple[str, Path]]:
    """(name inside the bundle, source path) of every shipped file, sorted by name."""
    package, kernels = _package_dirs()
    files = [("harness/__init__.py", package / "__init__.py")]
    for sub in SHIPPED_PACKAGES:
        if (package / sub).is_dir():         # kernels: inside an installed wheel only
            files += _walk(package / sub, f"harness/{sub}", skip_top=set())
    if kernels is not None:
        files += _walk(kernels, "harness/kernels", skip_top=set())
    return sorted(files)


def build_bundle() -> Bundle:
    """Pack the worker code of this controller into a deterministic tarball."""
    files = shipped_files()
    digest = hashlib.sha256()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, path in files:
            data = path.read_bytes()
            digest.update(name.encode() + b"\0" + len(data).to_bytes(8, "big") + data)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    zipped = io.BytesIO()
    with gzip.GzipFile(fileobj=zipped, mode="wb", mtime=0) as gz:
        gz.write(raw.getvalue())
    return Bundle(hash=digest.hexdigest()[:16], tarball=zipped.getvalue(),
                  files=tuple(name for name, _ in files))


_cached: Bundle | None = None


def current_bundle() -> Bundle:
    """The bundle of this controller process, built once (the code does not change mid-sweep)."""
    global _cached
    if _cached is None:
        _cached = build_bundle()
    return _cached
