"""YAML documents with positions, read under a budget: scenarios and hosts files.

`read_yaml_file` / `read_yaml` turn one YAML document into plain data plus the 1-based
(line, column) where each of its nodes starts, keyed by data path (e.g. ('matrix', 'tau', 2)),
so a schema check can point at the node it rejects. Every failure is an `InputError` in the
`file:line:column: message` form, never a traceback.

Reading costs at most what `Budget` allows, because a YAML file can cost far more than its
size: an alias bomb (`b: [*a, *a, ...]` nine levels deep) is a few hundred bytes that expand to
hundreds of millions of nodes, merge keys (`<<: [*a, *a]`) copy mappings the same way, and
5000 nested brackets exhaust Python's recursion in PyYAML's composer. The budget is checked
while reading, so every such input stops with one line in well under a second.

Standard library and PyYAML only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.protocol.errors import InputError

# A position in the parsed data: mapping keys and list indices from the document root.
DataPath = tuple


@dataclass(frozen=True)
class Budget:
    """The most one document may cost. Hand-written sweeps and inventories are a few kB, a few
    hundred nodes and a few levels deep; each limit leaves them room by orders of magnitude."""

    max_bytes: int = 512 * 1024         # pure-Python PyYAML reads about 1 MB/s
    max_depth: int = 64                 # nested mappings and lists
    max_nodes: int = 50_000             # values read, counting every alias expansion
    max_scalar_chars: int = 10_000      # one value: a path, a description, ...


DEFAULT_BUDGET = Budget()


@dataclass
class Source:
    """A parsed YAML document and the 1-based (line, column) where each of its nodes starts."""

    path: str | None
    data: Any
    value_marks: dict[DataPath, tuple[int, int]] = field(default_factory=dict)
    key_marks: dict[DataPath, tuple[int, int]] = field(default_factory=dict)

    def error(self, at: DataPath, message: str, *, key: bool = False) -> InputError:
        """An InputError at the value node `at` (or at its key node when `key`).

        Falls back to the nearest enclosing node when `at` has no node of its own, e.g. a
        pydantic location that names a key the document does not have.
        """
        marks = self.key_marks if key else self.value_marks
        at = tuple(at)
        while at and at not in marks:
            marks = self.value_marks
            at = at[:-1]
        line, column = marks.get(at, (None, None))
        return InputError(self.path, line, column, message)


class EmptyDocument(InputError):
    """The file holds no YAML document at all (whether that is an error is the caller's call)."""


def read_text(path: str | Path, what: str, budget: Budget = DEFAULT_BUDGET) -> str:
    """The UTF-8 text of file `path` (`what` names it in errors: "scenario", "hosts").

    A byte that is not UTF-8 is reported at its line and column; a file over the budget is
    refused before it is read.
    """
    shown = str(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(budget.max_bytes + 1)
    except FileNotFoundError:
        raise InputError(shown, None, None, f"no such {what} file") from None
    except IsADirectoryError:
        raise InputError(shown, None, None, f"is a directory, not a {what} file") from None
    except OSError as err:
        raise InputError(shown, None, None, err.strerror or str(err)) from None
    if len(raw) > budget.max_bytes:
        raise InputError(shown, None, None, f"larger than {budget.max_bytes // 1024} KiB: "
                                            f"not a {what} file written by hand")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line_start = raw.rfind(b"\n", 0, err.start) + 1
        line = raw.count(b"\n", 0, err.start) + 1
        # Columns count characters, as editors do, not bytes.
        column = len(raw[line_start:err.start].decode("utf-8", errors="replace")) + 1
        raise InputError(shown, line, column,
                         f"not UTF-8 text: byte 0x{raw[err.start]:02x} ({err.reason})") from None


def read_yaml_file(path: str | Path, what: str, budget: Budget = DEFAULT_BUDGET) -> Source:
    """Read and parse the YAML file at `path` (see `read_text` and `read_yaml`)."""
    return read_yaml(read_text(path, what, budget), str(path), budget)


def position(mark) -> tuple[int, int]:
    # PyYAML marks are 0-based; editors and compilers count from 1.
    return mark.line + 1, mark.column + 1


def _position_in_text(text: str, index: int) -> tuple[int, int]:
    line = text.count("\n", 0, index) + 1
    column = index - (text.rfind("\n", 0, index) + 1) + 1
    return line, column


def read_yaml(text: str, path: str | None, budget: Budget = DEFAULT_BUDGET) -> Source:
    """Parse one YAML document into plain data plus the positions of its nodes."""
    if len(text.encode("utf-8", errors="surrogatepass")) > budget.max_bytes:
        raise InputError(path, None, None, f"larger than {budget.max_bytes // 1024} KiB: "
                                           f"not a file written by hand")
    try:
        loader = _BudgetLoader(text, path, budget)
    except yaml.reader.ReaderError as err:  # a character YAML does not allow, found up front
        raise InputError(path, *_position_in_text(text, err.position),
                         f"YAML syntax error: {err.reason}") from None
    try:
        root = loader.get_single_node()
        if root is None:
            raise EmptyDocument(path, None, None, "empty file: no YAML document in it")
        return _TreeReader(loader, path, budget).read(root)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        # PyYAML's context and problem read as one sentence: "while parsing X, expected Y".
        what = ", ".join(part for part in (err.context, err.problem) if part) or "invalid YAML"
        line, column = position(mark) if mark else (None, None)
        raise InputError(path, line, column, f"YAML syntax error: {what}") from None
    except yaml.reader.ReaderError as err:
        raise InputError(path, *_position_in_text(text, err.position),
                         f"YAML syntax error: {err.reason}") from None
    except yaml.YAMLError as err:  # any other PyYAML error: still one line, no traceback
        raise InputError(path, None, None, f"YAML error: {err}") from None
    finally:
        loader.dispose()


class _BudgetLoader(yaml.SafeLoader):
    """PyYAML's safe loader with a nesting limit and a bound on what merge keys may copy.

    The composer recurses once per nesting level, so the depth is checked before each node is
    composed; the scanner's work per token grows with the number of open brackets, so flow
    nesting is also checked as each bracket opens; `flatten_mapping` copies the pairs of every merged mapping into the merging one,
    so its result is measured after each (inner mappings are flattened first, which stops a
    merge bomb at the first level over the budget).
    """

    def __init__(self, text: str, path: str | None, budget: Budget):
        super().__init__(text)
        self._path = path
        self._budget = budget
        self._depth = 0

    def _too_deep(self, mark) -> InputError:
        return InputError(self._path, *position(mark),
                          f"nested more than {self._budget.max_depth} levels deep")

    def fetch_flow_collection_start(self, TokenClass):
        if self.flow_level >= self._budget.max_depth:
            raise self._too_deep(self.get_mark())
        super().fetch_flow_collection_start(TokenClass)

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > self._budget.max_depth:
                raise self._too_deep(self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def flatten_mapping(self, node):
        super().flatten_mapping(node)
        if len(node.value) > self._budget.max_nodes:
            line, column = position(node.start_mark)
            raise InputError(self._path, line, column,
                             f"merge keys expand this mapping past {self._budget.max_nodes} "
                             f"entries")


class _TreeReader:
    """Turns a composed YAML node tree into data, recording where each node starts."""

    _MERGE_TAG = "tag:yaml.org,2002:merge"

    def __init__(self, loader: _BudgetLoader, path: str | None, budget: Budget):
        self.loader = loader
        self.budget = budget
        self.source = Source(path, None)
        self._open: set[int] = set()  # nodes being read: an alias back to one is a cycle
        self._nodes = 0

    def read(self, root: yaml.Node) -> Source:
        self.source.data = self._read(root, ())
        return self.source

    def _fail(self, node: yaml.Node, message: str) -> InputError:
        return InputError(self.source.path, *position(node.start_mark), message)

    def _read(self, node: yaml.Node, at: DataPath) -> Any:
        # Aliases share nodes, so the same node may be read many times: each read counts.
        self._nodes += 1
        if self._nodes > self.budget.max_nodes:
            raise self._fail(node, f"more than {self.budget.max_nodes} values once aliases are "
                                   f"expanded (an alias bomb?)")
        self.source.value_marks[at] = position(node.start_mark)
        if isinstance(node, yaml.ScalarNode):
            if len(node.value) > self.budget.max_scalar_chars:
                raise self._fail(node, f"a value of {len(node.value)} characters: at most "
                                       f"{self.budget.max_scalar_chars} are allowed")
            # The safe constructor resolves `1`, `1.5`, `true`, `null`, quoted strings, ...
            return self.loader.construct_object(node, deep=True)
        if id(node) in self._open:
            raise self._fail(node, "recursive YAML alias")
        self._open.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                return [self._read(item, at + (i,)) for i, item in enumerate(node.value)]
            return self._read_mapping(node, at)
        finally:
            self._open.discard(id(node))

    def _read_mapping(self, node: yaml.MappingNode, at: DataPath) -> dict:
        # Duplicates are checked among the keys written here, before merge keys (`<<: *x`)
        # bring in keys that these are allowed to override.
        self._reject_duplicate_keys(node)
        self.loader.flatten_mapping(node)
        out: dict = {}
        for key_node, value_node in node.value:
            key = self._key(key_node)
            self.source.key_marks[at + (key,)] = position(key_node.start_mark)
            out[key] = self._read(value_node, at + (key,))
        return out

    def _reject_duplicate_keys(self, node: yaml.MappingNode) -> None:
        seen: dict[str, yaml.Node] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == self._MERGE_TAG:
                continue
            first = seen.setdefault(key_node.value, key_node)
            if first is not key_node:
                line, _col = position(first.start_mark)
                raise self._fail(key_node, f"duplicate key '{key_node.value}' "
                                           f"(first given on line {line})")

    def _key(self, key_node: yaml.Node) -> str:
        if not isinstance(key_node, yaml.ScalarNode):
            raise self._fail(key_node, "mapping keys must be plain names")
        if len(key_node.value) > self.budget.max_scalar_chars:
            raise self._fail(key_node, f"a key of {len(key_node.value)} characters")
        key = self.loader.construct_object(key_node)
        if not isinstance(key, str):
            # e.g. `yes:` or `1:`, which YAML reads as a bool or a number
            raise self._fail(key_node, f"mapping key {show(key)} must be a string (quote it)")
        return key


def show(value: Any) -> str:
    """A value as the user wrote it in YAML, kept short."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "[]" if not value else "a list"
    if isinstance(value, int) and abs(value) >= 10**20:
        return f"an integer of {len(str(abs(value)))} digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
