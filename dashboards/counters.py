"""The hardware counters of kernel and op cells (`ncu: true`, harness/worker/ncu.py) as rows, one
a kernel: what `harness counters RUN` prints and the HTML report's counters table shows.

A cell carries `ncu.<kernel>.<counter>` for its own call (a kernel cell's verify mode, an op
cell's op) and `<mode>.ncu.<kernel>.<counter>` for each mode a kernel cell compares; a kernel
may carry its launch number (`gqa_kernel.2`), a counter may be `stall.<reason>` (cycles a warp
waits for it per issued instruction) or `time.<OPCODE>` (% of the warps' samples at that kind of
instruction).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# (column, counter, format, scale)
COLUMNS = (
    ("µs", "duration_us", "{:.1f}", 1),
    ("M instr", "instructions", "{:.2f}", 1e-6),     # warp instructions executed
    ("SM %", "sm_pct", "{:.0f}", 1),
    ("DRAM %", "dram_pct", "{:.0f}", 1),
    ("L2 %", "l2_pct", "{:.0f}", 1),
    ("regs", "registers", "{:.0f}", 1),
    ("occ %", "occupancy_pct", "{:.1f}", 1),
    ("warps/sch", "warps_per_scheduler", "{:.2f}", 1),
    ("eligible", "eligible_per_scheduler", "{:.2f}", 1),
    ("cyc/issue", "cycles_per_issue", "{:.2f}", 1),
    ("GHz", "sm_ghz", "{:.2f}", 1),
)
STALLS_COLUMN = "top stalls (cycles/issue)"
TIME_COLUMN = "warp time by instruction (%)"
TEXT_COLUMNS = (STALLS_COLUMN, TIME_COLUMN)     # after COLUMNS, left-aligned
TOP_STALLS = 3
TOP_TIME = 3

_NAME = re.compile(r"^(?:(?P<mode>\w+)\.)?ncu\.(?P<kernel>\w+(?:\.\d+)?)\.(?P<counter>[a-z0-9_.]+|time\.\w+)$")


@dataclass
class Row:
    mode: str
    kernel: str
    values: dict[str, float]

    def cells(self) -> list[str]:
        """The COLUMNS formatted ('–' where absent), then the TEXT_COLUMNS."""
        return [_fmt(self.values.get(key), spec, scale) for _, key, spec, scale in COLUMNS] + \
            [top_stalls(self.values), top_time(self.values)]


def rows(result: dict) -> list[Row]:
    """A result's kernels, mode by mode, in the order their metrics came."""
    cell = result.get("cell") or {}
    own = cell.get("op", "") if cell.get("workload") == "op" else cell.get("verify_mode", "")
    found: dict[tuple[str, str], dict[str, float]] = {}
    for name, value in (result.get("metrics") or {}).items():
        m = _NAME.match(name)
        if m:
            found.setdefault((m["mode"] or own, m["kernel"]), {})[m["counter"]] = value
    return [Row(mode, kernel, values) for (mode, kernel), values in found.items()]


def errors(result: dict) -> dict[str, str]:
    """mode -> why its call has no counters."""
    return dict((result.get("kernel") or {}).get("ncu_errors") or {})


def top_stalls(values: dict[str, float]) -> str:
    stalls = sorted(((v, k.removeprefix("stall.")) for k, v in values.items() if k.startswith("stall.")),
                    reverse=True)[:TOP_STALLS]
    return ", ".join(f"{name} {v:.2f}" for v, name in stalls) or "–"


def top_time(values: dict[str, float]) -> str:
    """The opcodes the warps spent most of their samples at: `MUFU 22, IMAD 12, FADD 7`."""
    shares = sorted(((v, k.removeprefix("time.")) for k, v in values.items()
                     if k.startswith("time.") and k != "time.other"), reverse=True)[:TOP_TIME]
    return ", ".join(f"{op} {v:.0f}" for v, op in shares) or "–"


def _fmt(value, spec: str, scale: float) -> str:
    return "–" if value is None else spec.format(value * scale)
