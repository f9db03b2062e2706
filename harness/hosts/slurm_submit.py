"""The submit host of a slurm host: where Slurm's commands run and where the shared workdir
is read and written. `LocalSubmit` is this machine (the controller runs on a login node, or
anywhere Slurm's commands work and the workdir is mounted).

A slurm host does everything through these few calls, so where it does them is one object;
commands are argv lists run without a shell, so nothing in hosts.yaml is ever parsed as one.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import os
import secrets
import shutil
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Done:
    returncode: int
    stdout: str
    stderr: str


class LocalSubmit:
    """Slurm's commands and the workdir, on this machine."""

    where = "this machine"

    async def run(self, argv: list[str], *, env: dict | None = None, timeout: float = 60) -> Done:
        """Run a command; a missing one is exit 127 (as a shell says it), a hung one 124."""
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=env)
        except FileNotFoundError:
            return Done(127, "", f"{argv[0]}: command not found")
        except OSError as exc:
            return Done(126, "", f"{argv[0]}: {exc.strerror or exc}")
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            return Done(124, "", f"{argv[0]}: no answer within {timeout:g} s")
        except BaseException:
            # Cancelled: do not leave the command behind, nor a child the loop never reaps.
            if proc.returncode is None:
                proc.kill()
                await asyncio.shield(proc.wait())
            raise
        return Done(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))

    def expand(self, path: str) -> str:
        return os.path.abspath(os.path.expanduser(path))

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def write(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Write a whole file, atomically (a task that starts early sees all of it or none)."""
        tmp = f"{path}.{secrets.token_hex(4)}.tmp"
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb") as f:
            f.write(data)
        os.replace(tmp, path)

    def read(self, path: str, limit: int) -> bytes | None:
        """The file's bytes, None if it does not exist; OverflowError past `limit` bytes."""
        try:
            with open(path, "rb") as f:
                data = f.read(limit + 1)
        except FileNotFoundError:
            return None
        if len(data) > limit:
            raise OverflowError(f"{path} is larger than {limit} bytes")
        return data

    def read_from(self, path: str, offset: int, limit: int) -> bytes:
        """Up to `limit` bytes of the file from `offset` (b"" if it is not there yet)."""
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                return f.read(limit)
        except FileNotFoundError:
            return b""

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def remove_tree(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def remove_older_than(self, folder: str, age_s: float) -> None:
        """Remove the entries of `folder` last modified more than `age_s` ago."""
        cutoff = time.time() - age_s
        for name in self.listdir(folder):
            path = os.path.join(folder, name)
            try:
                if os.lstat(path).st_mtime < cutoff:
                    shutil.rmtree(path, ignore_errors=True)
            except OSError:
                pass

    def unpack(self, tarball: bytes, final: str) -> None:
        """Unpack a worker bundle to `final`, complete or not at all: beside it, then renamed
        (another controller may have won the race: its copy is as good as ours)."""
        if os.path.exists(os.path.join(final, ".complete")):
            return
        incoming = Path(f"{final}.incoming-{secrets.token_hex(4)}")
        try:
            incoming.mkdir(parents=True)
            with tarfile.open(fileobj=io.BytesIO(gzip.decompress(tarball)), mode="r:") as tar:
                tar.extractall(incoming, filter="data")
            (incoming / ".complete").touch()
            try:
                os.rename(incoming, final)
            except OSError:
                if not os.path.exists(os.path.join(final, ".complete")):
                    raise
        finally:
            shutil.rmtree(incoming, ignore_errors=True)
