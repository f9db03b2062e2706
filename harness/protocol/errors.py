"""Errors the controller reports to the user without a traceback.

Standard library only (harness.protocol.redact is too). The CLI catches `InputError`, prints
`str(err)` (one line, in the `file:line:column: message` form editors and CI logs turn into
links) to stderr and exits 2.
"""

from __future__ import annotations

from harness.protocol.redact import redact_uri


class InputError(Exception):
    """Bad user input: a scenario, hosts file, command-line value, tracking URI, ...

    `line` and `column` are 1-based; any of `path`, `line`, `column` may be None when unknown,
    and the parts that are None are left out of `str(err)`.
    """

    def __init__(self, path: str | None, line: int | None, column: int | None, message: str):
        self.path = None if path is None else str(path)
        self.line = line
        self.column = column
        # The CLI prints exactly one line, so fold any line breaks a message picked up; and
        # never a password: messages quote the tracking URI they were given.
        self.message = redact_uri(" ".join(str(message).split()))
        super().__init__(self._format())

    def _format(self) -> str:
        where = [str(part) for part in (self.path, self.line, self.column) if part is not None]
        return ":".join(where) + ": " + self.message if where else self.message

    def __str__(self) -> str:
        return self._format()

    def __reduce__(self):
        # Exception's default pickling replays `args` (the formatted line) into __init__,
        # which takes four arguments; rebuild from the fields instead.
        return (type(self), (self.path, self.line, self.column, self.message))


class CellRefused(ValueError):
    """A cell the worker will not run as given (e.g. a checkpoint whose config or tensors the
    model does not implement). The message is one line naming the file and field at fault; the
    cell's error is `<class name>: <message>`, with no traceback, because the fault is in the
    input, not in the code."""
