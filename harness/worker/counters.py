"""Nsight Compute's exported pages as per-kernel hardware counters: CSV text in, numbers out.

`ncu --import REPORT --csv --page details` prints one row per (kernel launch, section, metric),
with the columns `ID`, `Kernel Name`, `Section Name`, `Metric Name`, `Metric Unit` and `Metric
Value` among others; `--page raw` one row per launch with every collected metric as a column,
their units in a second row. The harness keeps a fixed set of them under short names (SUMMARY,
and STALL from the raw page), each in one unit whatever unit ncu printed (its console units
depend on the version and on `--print-units`), so two runs' numbers mean the same thing.
`--page source --print-source sass` prints each kernel's SASS, an instruction a row with the warp
state samples taken at it: summed by opcode (`time.<OPCODE>`), they say which kind of
instruction a latency-bound kernel's warps spend their time at (parse_source).

No I/O and no torch here: harness/worker/ncu.py runs the profiler and hands its text to `parse`.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field

# (section, metric name on the details page) -> (our key, the unit it is kept in). Units: "us"
# and "GHz" are converted from whatever ncu printed; "%" and the counts are kept as printed,
# provided ncu printed the unit listed here (anything else is a version this table does not
# know, and the value is left out rather than misread).
SUMMARY: dict[tuple[str, str], tuple[str, str]] = {
    ("GPU Speed Of Light Throughput", "Duration"): ("duration_us", "us"),
    ("GPU Speed Of Light Throughput", "SM Frequency"): ("sm_ghz", "GHz"),
    ("GPU Speed Of Light Throughput", "Compute (SM) Throughput"): ("sm_pct", "%"),
    ("GPU Speed Of Light Throughput", "Memory Throughput"): ("memory_pct", "%"),
    ("GPU Speed Of Light Throughput", "DRAM Throughput"): ("dram_pct", "%"),
    ("GPU Speed Of Light Throughput", "L2 Cache Throughput"): ("l2_pct", "%"),
    ("Launch Statistics", "Grid Size"): ("grid_size", ""),
    ("Launch Statistics", "Block Size"): ("block_size", ""),
    ("Launch Statistics", "Registers Per Thread"): ("registers", "register/thread"),
    ("Launch Statistics", "Dynamic Shared Memory Per Block"): ("dynamic_smem_kb", "KB"),
    ("Occupancy", "Theoretical Occupancy"): ("theoretical_occupancy_pct", "%"),
    ("Occupancy", "Achieved Occupancy"): ("occupancy_pct", "%"),
    ("Scheduler Statistics", "Active Warps Per Scheduler"): ("warps_per_scheduler", "warp"),
    ("Scheduler Statistics", "Eligible Warps Per Scheduler"): ("eligible_per_scheduler", "warp"),
    ("Scheduler Statistics", "Issued Warp Per Scheduler"): ("issued_per_scheduler", ""),
    ("Warp State Statistics", "Warp Cycles Per Issued Instruction"): ("cycles_per_issue", "cycle"),
}

# The sections that collect them (`ncu --section NAME`); SourceCounters: the per-instruction
# samples of the source page.
SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy", "SchedulerStats", "WarpStateStats", "SourceCounters")

# Raw-page columns of the warp state section: the cycles a warp spends stalled for each reason,
# per issued instruction (they sum to cycles_per_issue). Kept as `stall.<reason>`.
STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active(?:\.ratio)?$")

# Metrics collected beside the sections (`ncu --metrics`), read from the raw page: the warp
# instructions the kernel executed, which with cycles_per_issue and warps_per_scheduler say
# where a latency-bound kernel's time goes.
RAW = {"smsp__inst_executed.sum": "instructions"}

# The source page's column of warp state samples at an instruction (issued or stalled there).
SAMPLES = "Warp Stall Sampling (All Samples)"
# An opcode whose instructions hold less than this share of a kernel's samples is summed into
# `time.other`.
TIME_MIN_PCT = 1.0

_TIME_S = {"s": 1.0, "second": 1.0, "ms": 1e-3, "msecond": 1e-3, "us": 1e-6, "usecond": 1e-6,
           "ns": 1e-9, "nsecond": 1e-9}
_FREQ_HZ = {"hz": 1.0, "khz": 1e3, "mhz": 1e6, "ghz": 1e9, "cycle/second": 1.0,
            "cycle/msecond": 1e3, "cycle/usecond": 1e6, "cycle/nsecond": 1e9}
_BYTES = {"byte": 1.0, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "kibyte": 1024.0,
          "mibyte": 1024.0 ** 2}


@dataclass
class Kernel:
    """One profiled launch: its short name (`gqa_tail_kernel`) and its counters by key."""

    name: str
    values: dict[str, float] = field(default_factory=dict)


@dataclass
class Pages:
    """What `parse` found: the launches in launch order, and what it could not read."""

    kernels: list[Kernel]
    skipped: list[str]          # "Duration: unit 'fortnight'" and the like


def short_name(name: str) -> str:
    """`void gqa_tail_kernel<128, 4>(AttnParams)` -> `gqa_tail_kernel`; a Triton name
    (`_fwd_kernel`) stays as it is; a namespace is dropped (`at::native::f` -> `f`)."""
    depth, out = 0, []
    for ch in name:
        if ch in "<(":
            if depth == 0 and ch == "(" and out:
                break               # the parameter list of the function itself
            depth += 1
        elif ch in ">)":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(ch)
    words = "".join(out).split()
    return words[-1].rsplit("::", 1)[-1] if words else name.strip()


def number(text: str) -> float | None:
    """A value as ncu prints it: `235.42`, `312,621` (thousands grouped), `n/a` (None)."""
    text = text.strip()
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", text):
        text = text.replace(",", "")
    try:
        return float(text)
    except ValueError:
        return None


def convert(value: float, unit: str, want: str) -> float | None:
    """`value` in ncu's `unit` as `want`; None when the unit is not the kind asked for."""
    u = unit.strip().lower()
    if want == "us":
        return value * _TIME_S[u] / 1e-6 if u in _TIME_S else None
    if want == "GHz":
        return value * _FREQ_HZ[u] / 1e9 if u in _FREQ_HZ else None
    if want == "KB":
        u = u.removesuffix("/block")
        return value * _BYTES[u] / 1e3 if u in _BYTES else None
    return value if u == want.lower() else None


def parse(details: str, raw: str = "") -> Pages:
    """The details page (required) and the raw page (optional: the stall reasons and RAW) of one
    report."""
    kernels: dict[str, Kernel] = {}
    skipped: list[str] = []
    rows = list(csv.DictReader(io.StringIO(_csv_part(details))))
    need = {"ID", "Kernel Name", "Section Name", "Metric Name", "Metric Unit", "Metric Value"}
    if rows and not need <= set(rows[0]):
        raise ValueError("ncu's details page has no column " + ", ".join(sorted(need - set(rows[0]))))
    for row in rows:
        launch = row["ID"]
        kernel = kernels.setdefault(launch, Kernel(short_name(row["Kernel Name"])))
        spec = SUMMARY.get((row["Section Name"], row["Metric Name"]))
        if spec is None:
            continue
        key, want = spec
        value = number(row["Metric Value"])
        kept = None if value is None else convert(value, row["Metric Unit"], want)
        if kept is None:
            note = f"{row['Metric Name']}: {row['Metric Value']!r} {row['Metric Unit']!r}"
            if note not in skipped:
                skipped.append(note)
            continue
        kernel.values[key] = kept
    for launch, extra in _raw_values(raw).items():
        if launch in kernels:
            kernels[launch].values.update(extra)
    return Pages(list(kernels.values()), skipped)      # ncu prints the launches in order


def _raw_values(raw: str) -> dict[str, dict[str, float]]:
    """Launch ID -> {`stall.<reason>`: cycles a warp waits for it per issued instruction, and
    the RAW metrics}."""
    table = list(csv.reader(io.StringIO(_csv_part(raw))))
    if not table or "ID" not in table[0]:
        return {}
    header = table[0]
    id_col = header.index("ID")
    columns = [(i, m.group(1)) for i, name in enumerate(header) if (m := STALL.match(name))]
    out: dict[str, dict[str, float]] = {}
    for row in table[1:]:
        if len(row) != len(header) or not row[id_col].strip():
            continue                      # the units row (no ID), or a line that is not a launch
        values = {f"stall.{reason}": v for i, reason in columns if (v := number(row[i])) is not None}
        values.update({key: v for i, name in enumerate(header)
                       if (key := RAW.get(name)) and (v := number(row[i])) is not None})
        out[row[id_col].strip()] = values
    return out


def parse_source(text: str) -> dict[str, dict[str, float]]:
    """The source page: kernel short name -> {`time.<OPCODE>`: % of the kernel's warp state
    samples taken at instructions of that opcode (`MUFU` for `MUFU.EX2`, predicates dropped)},
    opcodes under TIME_MIN_PCT summed as `time.other`. A kernel the page prints again (ncu
    repeats a function's listing) counts once; one without samples is left out."""
    found: dict[str, dict[str, float]] = {}
    name, header, counts = None, None, None

    def finish() -> None:
        total = sum(counts.values()) if counts else 0.0
        if name is None or not total:
            return
        shares: dict[str, float] = {}
        for op, n in counts.items():
            pct = 100.0 * n / total
            key = f"time.{op}" if pct >= TIME_MIN_PCT else "time.other"
            shares[key] = shares.get(key, 0.0) + pct
        found[name] = shares

    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        if row[0] == "Kernel Name" and len(row) > 1:
            finish()
            name, header = short_name(row[1]), None
            counts = None if name in found else {}
            continue
        if row[0] == "Address":
            header = row
            continue
        if counts is None or header is None or len(row) != len(header) or SAMPLES not in header:
            continue
        samples = number(row[header.index(SAMPLES)])
        op = opcode(row[header.index("Source")]) if "Source" in header else ""
        if samples and op:
            counts[op] = counts.get(op, 0.0) + samples
    finish()
    return found


def opcode(sass: str) -> str:
    """`@!P0 MUFU.EX2 R1, R2` -> `MUFU`."""
    words = sass.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def add_source(pages: Pages, source: dict[str, dict[str, float]]) -> None:
    """parse_source's shares onto the first launch of each kernel (the page sums a kernel's
    launches)."""
    named: set[str] = set()
    for k in pages.kernels:
        if k.name in source and k.name not in named:
            k.values.update(source[k.name])
            named.add(k.name)


def _csv_part(text: str) -> str:
    """The CSV of a page without ncu's own lines before it (`==PROF==`, `==WARNING==`)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith('"ID"'):
            return "\n".join(lines[i:])
    return ""


def flatten(pages: Pages) -> dict[str, float]:
    """`ncu.<kernel>.<key>` for every launch; a kernel launched again in the same call is
    `<kernel>.2`, `<kernel>.3` in launch order."""
    seen: dict[str, int] = {}
    out: dict[str, float] = {}
    for k in pages.kernels:
        seen[k.name] = seen.get(k.name, 0) + 1
        name = k.name if seen[k.name] == 1 else f"{k.name}.{seen[k.name]}"
        out.update({f"ncu.{name}.{key}": v for key, v in k.values.items()})
    return out
