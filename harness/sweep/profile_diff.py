"""What moved inside a step between two results of one cell: each kernel's time a step and each
idle gap's, from the cells' profiles.

A profiled cell (`profile: true`) records the kernels with the most time a step and the kernel
pairs with the most idle between them (`top_kernels`, `idle_gaps`: harness.worker.measure, twelve
of each), plus the whole window's busy and idle time. Two results of one cell, base and head,
give one row per name in either list: its time a step on both sides and the difference. A name
in one list only is either below that side's twelfth or did not run there (a GEMM whose tile
changed leaves under one name and arrives under another), so that side reads None and the row
has no difference; the totals (busy and idle a step) cover every kernel either way.

Pure functions over result dicts: `harness compare --kernels` and a compared report show them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    """One kernel, idle gap or total: µs a step and how often a step, on each side (None: not
    in that side's list)."""

    name: str
    base_us: float | None
    head_us: float | None
    base_count: float | None = None
    head_count: float | None = None

    @property
    def delta_us(self) -> float | None:
        if self.base_us is None or self.head_us is None:
            return None
        return self.head_us - self.base_us

    def title(self, kind: str) -> str:
        """The row's first column: its kind ("kernel", "idle gap"; "" for the totals) and name."""
        return f"{kind} {self.name}".strip()

    def cells(self) -> tuple[str, str, str, str]:
        """base, head, head - base (µs a step) and the counts a step, as a table shows them;
        '–' where a side has no value."""
        def us(v):
            return "–" if v is None else f"{v:.1f}"

        def count(v):
            return "–" if v is None else f"{v:g}"

        counts = "" if self.base_count is None and self.head_count is None else \
            f"{count(self.base_count)}, {count(self.head_count)}"
        delta = "–" if self.delta_us is None else f"{self.delta_us:+.1f}"
        return us(self.base_us), us(self.head_us), delta, counts

    @property
    def weight(self) -> float:
        """How much the row may matter, for ordering: the difference, or the one side's time."""
        if self.delta_us is not None:
            return abs(self.delta_us)
        return max(self.base_us or 0.0, self.head_us or 0.0)


def has_profile(result: dict | None) -> bool:
    profile = (result or {}).get("profile")
    return isinstance(profile, dict) and isinstance(profile.get("top_kernels"), list)


def short_name(name: str | None) -> str:
    """A kernel's name without what repeats on every row: `void ` and the parameter list (the
    template arguments stay: they tell two instantiations apart)."""
    if name is None:
        return "(window edge)"
    name = name.removeprefix("void ")
    cut = name.find("(")
    return (name[:cut] if cut > 0 else name).rstrip()


def kernel_rows(base: dict, head: dict) -> list[Row]:
    """Each kernel in either side's `top_kernels`, largest first."""
    def by_name(result):
        return {short_name(k["name"]): k for k in result["profile"].get("top_kernels") or []}

    return _rows(by_name(base), by_name(head), "us_per_step", "calls_per_step")


def gap_rows(base: dict, head: dict) -> list[Row]:
    """Each (kernel before -> kernel after) pair in either side's `idle_gaps`, largest first."""
    def by_edge(result):
        return {f"{short_name(g.get('before'))} -> {short_name(g.get('after'))}": g
                for g in result["profile"].get("idle_gaps") or []}

    return _rows(by_edge(base), by_edge(head), "us_per_step", "gaps_per_step")


def totals(base: dict, head: dict) -> list[Row]:
    """The step's busy and idle time on each side, µs a step, every kernel counted."""
    def busy(p):
        steps = p.get("steps")
        return p["busy_ms"] * 1e3 / steps if p.get("busy_ms") is not None and steps else None

    def idle(p):
        return p["idle_ms"] * 1e3 if p.get("idle_ms") is not None else None

    b, h = base["profile"], head["profile"]
    return [Row("busy (all kernels)", busy(b), busy(h)), Row("idle", idle(b), idle(h))]


def sections(base: dict, head: dict, limit: int | None = None) -> list[tuple[str, Row]]:
    """Every row of a cell's comparison as (kind, row): the totals (kind ""), then the kernels,
    then the idle gaps, each largest first and at most `limit` of each."""
    parts = (("", totals(base, head)), ("kernel", kernel_rows(base, head)[:limit]),
             ("idle gap", gap_rows(base, head)[:limit]))
    return [(kind, row) for kind, rows in parts for row in rows]


def _rows(base: dict[str, dict], head: dict[str, dict], us_key: str, count_key: str) -> list[Row]:
    def get(side, name, key):
        entry = side.get(name)
        return None if entry is None else entry.get(key)

    names = list(dict.fromkeys([*base, *head]))
    rows = [Row(n, get(base, n, us_key), get(head, n, us_key),
                get(base, n, count_key), get(head, n, count_key)) for n in names]
    return sorted(rows, key=lambda r: -r.weight)
