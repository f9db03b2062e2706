"""Files written so that a reader sees either the old one or the whole new one: the journal's
records on the controller, a batch's results on a worker host (standard library only).

The temp file lives in the same directory so os.replace is a rename on one filesystem; fsync
before the rename so a power loss cannot leave an empty file under the final name; and the temp
file is removed on any failure, Ctrl-C included, so none is left lying around.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` so readers see either the old file or the whole new one.

    The temp file lives in the same directory so os.replace is a rename on one filesystem;
    fsync before the rename so a power loss cannot leave an empty file under the final name.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        # Includes KeyboardInterrupt: never leave temp files lying around in the journal.
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")
