"""`-k EXPR`: pick some of a scenario's cells, as pytest's -k picks tests.

    -k 4096                      cells whose label contains "4096" (case-insensitive)
    -k "triton and not ctx=65536"
    -k "verify_mode=custom or (workload=kernel and tree_tokens=65)"

A word `key=value` whose key is a cell parameter is true when the cell's canonical `key` is
`value` (as a scenario writes it: `fused_ops=true`, `context_length=4096`); any other word
(`ctx=4096`, `triton`) is true when the cell's label contains it, case-insensitively. `and`,
`or`, `not` and parentheses combine words, with the usual precedence (not, then and, then or).
A malformed expression, or one that selects no cell (a misspelt key does that), is an InputError
naming the expression: a run of nothing is never started.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from harness.protocol import params
from harness.protocol.errors import InputError
from harness.protocol.workloads import yaml_word

_TOKEN = re.compile(r"\s*(\(|\)|[^\s()]+)")
Matcher = Callable[[dict, str], bool]          # (canonical cell, label) -> selected


@dataclass
class _Parser:
    expr: str
    tokens: list[tuple[str, int]]
    at: int = 0
    name: str = "-k"           # how errors name the expression (a scenario's target: its key)

    def fail(self, why: str) -> InputError:
        return InputError(None, None, None, f"{self.name} {self.expr!r}: {why}")

    def peek(self) -> str | None:
        return self.tokens[self.at][0] if self.at < len(self.tokens) else None

    def take(self) -> tuple[str, int]:
        token = self.tokens[self.at]
        self.at += 1
        return token

    def parse_or(self) -> Matcher:
        return self.binary("or", self.parse_and, lambda a, b: lambda c, lab: a(c, lab) or b(c, lab))

    def parse_and(self) -> Matcher:
        return self.binary("and", self.parse_not,
                           lambda a, b: lambda c, lab: a(c, lab) and b(c, lab))

    def binary(self, op: str, operand: Callable[[], Matcher],
               join: Callable[[Matcher, Matcher], Matcher]) -> Matcher:
        """operand (op operand)*, joined left to right."""
        left = operand()
        while self.peek() == op:
            self.take()
            left = join(left, operand())
        return left

    def parse_not(self) -> Matcher:
        token = self.peek()
        if token is None:
            raise self.fail("ends where a word, 'not' or '(' was expected")
        if token == "not":
            self.take()
            inner = self.parse_not()
            return lambda c, lab: not inner(c, lab)
        if token == "(":
            _, column = self.take()
            inner = self.parse_or()
            if self.peek() != ")":
                raise self.fail(f"the '(' at column {column + 1} is never closed")
            self.take()
            return inner
        if token in ("and", "or", ")"):
            raise self.fail(f"'{token}' at column {self.tokens[self.at][1] + 1} where a word "
                            f"was expected")
        word, _ = self.take()
        return self.word(word)

    def word(self, word: str) -> Matcher:
        key, sep, value = word.partition("=")
        if sep and key in params.PARAMS:
            return lambda c, lab: key in c and _equals(c[key], value)
        needle = word.lower()
        return lambda c, lab: needle in lab.lower()


def _equals(have, text: str) -> bool:
    """A parameter's value against the text of `key=value`: numbers as numbers (sleep_s=0 is
    0.0), booleans and words as a scenario writes them (true, triton)."""
    if isinstance(have, (int, float)) and not isinstance(have, bool):
        try:
            return float(text) == float(have)
        except ValueError:
            return False
    return yaml_word(have) == text


def compile_filter(expr: str, name: str = "-k") -> Matcher:
    """A matcher of (canonical cell, label); `name` says what the expression is in errors."""
    tokens = [(m.group(1), m.start(1)) for m in _TOKEN.finditer(expr)]
    parser = _Parser(expr, tokens, name=name)
    if not tokens:
        raise parser.fail("is empty")
    matcher = parser.parse_or()
    if parser.peek() is not None:
        token, column = parser.tokens[parser.at]
        raise parser.fail(f"unexpected '{token}' at column {column + 1}")
    return matcher


def cell_matcher(expr: str, name: str = "-k") -> Callable[[dict], bool]:
    """Whether a cell (any spelling: canonicalised here) is one `expr` selects."""
    matcher = compile_filter(expr, name)
    return lambda cell: matcher(params.canonical(cell), params.cell_label(cell))


def select(cells: list[dict], expr: str | None) -> list[dict]:
    """The cells `expr` selects (all of them without one), in their order."""
    if expr is None:
        return cells
    selects = cell_matcher(expr)
    chosen = [c for c in cells if selects(c)]
    if not chosen:
        keys = [m.group(1).partition("=")[0] for m in _TOKEN.finditer(expr) if "=" in m.group(1)]
        unknown = [k for k in keys if k not in params.PARAMS]
        hint = f" ({', '.join(unknown)}: not a cell parameter, read as label text)" if unknown else ""
        raise InputError(None, None, None,
                         f"-k {expr!r} selects none of the {len(cells)} cell(s){hint}")
    return chosen
