"""The commit a run measured: recorded on every run so numbers can be traced to code."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _git(*args: str, cwd: Path) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def head_sha(cwd: str | Path = ".") -> str:
    """The commit checked out at `cwd`, or "unknown" outside a git checkout."""
    return _git("rev-parse", "HEAD", cwd=Path(cwd)) or "unknown"


def git_info(cwd: str | Path = ".") -> dict:
    """sha, branch and whether the tree had uncommitted changes (a dirty run is not a
    faithful measurement of its sha, so it says so)."""
    cwd = Path(cwd)
    sha = head_sha(cwd)
    status = _git("status", "--porcelain", "--untracked-files=no", cwd=cwd)
    return {"sha": sha,
            "branch": _git("rev-parse", "--abbrev-ref", "HEAD", cwd=cwd) or "unknown",
            "dirty": bool(status) if status is not None else None}
