"""One look for every figure: the palettes, line styles, titles and the empty-figure card.

Every figure module draws its colours from here, so a verify mode has the same colour in the
throughput lines, the heatmap labels, the kernel roofline plot and the report's table.

Palettes are colour-blind safe: verify modes use Okabe–Ito, phases use Paul Tol's "muted"
set (a different family, so a phase is never mistaken for a mode).
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

# Verify mode -> colour (Okabe–Ito). Unknown modes (a new kernel) take the spare colours in
# order of first appearance, so a figure never fails on a mode it has not heard of.
MODE_COLORS = {
    "custom": "#0072B2",   # blue
    "triton": "#D55E00",   # vermillion
    "sdpa": "#009E73",     # bluish green
    "flex": "#CC79A7",     # reddish purple
}
_SPARE_COLORS = ["#E69F00", "#56B4E9", "#F0E442", "#000000"]

# Graph capture -> line style: the more is captured, the more solid the line.
GRAPH_LINESTYLES = {"none": ":", "verify": "--", "full": "-"}
# Tree build placement -> marker.
TREE_MARKERS = {"cpu": "o", "gpu": "s"}

# Decode-loop phases in step order (docs/ARCHITECTURE.md), and their colours (Paul Tol muted).
PHASES = ("draft", "tree", "verify", "accept", "commit")
PHASE_COLORS = {
    "draft": "#88CCEE",
    "tree": "#DDCC77",
    "verify": "#117733",
    "accept": "#CC6677",
    "commit": "#AA4499",
}
# Phases the list above does not name (a range a workload adds: graph, record ...) take these,
# in order of first appearance: the rest of Tol's muted set, so two of them never share a grey.
_SPARE_PHASE_COLORS = ["#44AA99", "#999933", "#882255", "#332288", "#661100", "#6699CC"]
OTHER_COLOR = "#777777"    # GPU work launched outside every phase range (measure: "other")
GAP_COLOR = "#BBBBBB"      # GPU idle that no phase claims (between phases)
UNATTRIBUTED_COLOR = "#DDDDDD"  # GPU idle measured without a per-phase split
FAILED_COLOR = "#B00020"
MUTED = "0.45"             # annotations: "3 failed cells not shown", "n/a (no GPU)"

DPI = 110


# Short parameter names in labels and legends, matching harness.protocol.params.cell_label.
SHORT_NAMES = {"context_length": "ctx", "verify_mode": "verify", "graph_capture": "graph",
               "tree_build": "tree", "speculation": "spec", "batch_size": "bs",
               "tree_budget": "N", "block_size": "B"}
# The compared-with run, in every figure: drawn like the head, faded behind it.
BASE_ALPHA = 0.32


# Units of the metrics docs/ARCHITECTURE.md names, for axis labels when a caller gives none.
METRIC_UNITS = {"tokens_per_s": "tokens/s", "idle_fraction": "fraction of the step, 0–1",
                "idle_fraction_est": "fraction of the step, 0–1",
                "accept_len_mean": "tokens per step", "step_ms_p50": "ms", "step_ms_p90": "ms",
                "syncs_per_step": "syncs per step", "kernel_us": "µs", "achieved_tbps": "TB/s",
                "pct_roofline": "% of roofline", "bw_pct_roofline": "fraction of roofline"}


def metric_unit(metric: str) -> str:
    if metric in METRIC_UNITS:
        return METRIC_UNITS[metric]
    if metric.endswith("_ms"):
        return "ms"
    return "value"


def acceptance_word(cell: dict) -> str | None:
    """`greedy` or `synthetic τ=4` for a speculative decode cell, None for any other: the
    cell label's own word (harness.protocol.workloads.decode.acceptance_word), with τ drawn."""
    from harness.protocol.workloads.decode import acceptance_word as word

    if not cell or cell.get("workload", "decode") != "decode":
        return None
    return word(cell, tau="τ")


def names_of(cells: list[dict], exclude: tuple[str, ...] = ()) -> list[str]:
    """A name per cell made of only what tells these cells apart (`ctx=4096 verify=custom
    graph=full`): parameters that differ between them, less `exclude` and the measurement
    knobs. A parameter a cell does not have (another workload's) and a kernel knob left at
    `auto` are left out of that cell's name; acceptance and tau are one word (greedy,
    synthetic τ=4). Empty where nothing differs."""
    from harness.protocol.params import DEFAULTS, IMPL_DEFAULTS, MEASUREMENT_KNOBS
    from harness.protocol.workloads import yaml_word

    keys = list(DEFAULTS) + sorted({k for c in cells for k in c} - set(DEFAULTS))
    keys = [k for k in keys if k not in MEASUREMENT_KNOBS and k not in exclude
            and len({repr(c.get(k, DEFAULTS.get(k))) for c in cells}) > 1]
    names = []
    for c in cells:
        parts = []
        for k in keys:
            if k in ("acceptance", "tau"):
                word = acceptance_word(c)
                if word and word not in parts:
                    parts.append(word)
                continue
            value = c.get(k, DEFAULTS.get(k))
            if value is None or (k in IMPL_DEFAULTS and value == IMPL_DEFAULTS[k]):
                continue
            if k == "workload":     # `peer`, not `workload=peer`; the usual decode unsaid
                if value != DEFAULTS["workload"]:
                    parts.append(str(value))
                continue
            parts.append(f"{SHORT_NAMES.get(k, k)}={yaml_word(value)}")
        names.append(" ".join(parts))
    return names


def short_names(results: list[dict]) -> dict[str, str]:
    """cell_id -> its name among these results (names_of); the label where nothing differs."""
    cells = [r.get("cell") or {} for r in results]
    names = {}
    for r, c, name in zip(results, cells, names_of(cells)):
        names[r.get("cell_id") or repr(c)] = name or r.get("label") or r.get("cell_id") or "?"
    return names


def full_label(result: dict) -> str:
    """The cell's label (harness.protocol.params.cell_label) saying greedy or synthetic: it
    says so itself since labels carry the acceptance word; a result journaled before then
    gets the word added here."""
    label = result.get("label") or result.get("cell_id") or "?"
    word = acceptance_word(result.get("cell") or {})
    if word is None or word.split()[0] in label.split():
        return label
    if word.startswith("synthetic") and " tau=" in label:
        return label.replace(" tau=", " synthetic tau=", 1)
    return f"{label} {word.split()[0]}"


def shade(color, k: int, n: int) -> tuple[float, float, float]:
    """The k-th of n shades of `color`, dark to light, for lines that share a verify mode and
    a line style: told apart by lightness, which colour-blind readers see too."""
    from matplotlib.colors import to_rgb

    rgb = to_rgb(color)
    if n <= 1:
        return rgb
    f = -0.45 + 0.9 * k / (n - 1)          # -0.45 (towards black) .. +0.45 (towards white)
    target = 1.0 if f > 0 else 0.0
    return tuple(c + (target - c) * abs(f) for c in rgb)


def mode_color(mode) -> str:
    mode = str(mode)
    if mode not in MODE_COLORS:
        used = set(MODE_COLORS.values())
        spare = [c for c in _SPARE_COLORS if c not in used]
        MODE_COLORS[mode] = spare[0] if spare else "#7F7F7F"
    return MODE_COLORS[mode]


def phase_color(phase: str) -> str:
    if phase == "other":
        return OTHER_COLOR
    if phase not in PHASE_COLORS:
        used = set(PHASE_COLORS.values())
        spare = [c for c in _SPARE_PHASE_COLORS if c not in used]
        PHASE_COLORS[phase] = spare[0] if spare else GAP_COLOR
    return PHASE_COLORS[phase]


def fmt_tokens(n) -> str:
    """4096 -> '4k', 65536 -> '64k', 1000 -> '1000'."""
    n = int(n)
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def where(results: list[dict], commit: str | None = None) -> str:
    """`NVIDIA H200 · gpu-a · commit 3b9887d` — the hardware and code the numbers came from."""
    gpus, hosts = set(), set()
    for r in results:
        env = r.get("env") or {}
        gpus.add(str(env.get("gpu") or "CPU (no GPU)"))
        hosts.add(str(r.get("host") or env.get("hostname") or "?"))
    parts = []
    if gpus:
        parts.append(", ".join(sorted(gpus)))
    if hosts:
        parts.append(", ".join(sorted(hosts)))
    if commit:
        parts.append(f"commit {commit}")
    return " · ".join(parts)


def title(what: str, results: list[dict], commit: str | None = None) -> str:
    suffix = where(results, commit)
    return f"{what}\n{suffix}" if suffix else what


def new_figure(width: float, height: float) -> Figure:
    # Figure() directly rather than pyplot: no global figure registry, no GUI backend chosen or
    # switched behind the caller's back; savefig renders through Agg.
    return Figure(figsize=(width, height), layout="constrained")


def empty_figure(message: str, heading: str, width: float = 8, height: float = 3) -> Figure:
    """A card that says why there is nothing to plot, instead of an empty axes."""
    fig = new_figure(width, height)
    ax = fig.add_subplot()
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes,
            fontsize=13, color=MUTED, wrap=True)
    ax.set_axis_off()
    ax.set_title(heading, fontsize=11)
    return fig


class NothingToDraw(Exception):
    """A figure that would be an empty card; its message is the one line that says why."""


def nothing(message: str, heading: str, out_path, *, card: bool = True, **size) -> Path:
    """The empty-figure card, or (card=False: the report) NothingToDraw, so that a page shows
    one line instead of a picture of nothing."""
    if not card:
        raise NothingToDraw(message)
    return save(empty_figure(message, heading, **size), out_path)


def save(fig: Figure, out_path) -> Path:
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=DPI)
    return out_path


def note(ax, text: str) -> None:
    """A small grey remark in the lower right corner of an axes (skipped cells and the like)."""
    ax.annotate(text, (1, 0), xycoords="axes fraction", xytext=(-4, 4),
                textcoords="offset points", ha="right", va="bottom", fontsize=8, color=MUTED)


def short_commit(sha: str | None, dirty: bool | None = None) -> str | None:
    if not sha or sha == "unknown":
        return None
    return sha[:10] + (" (dirty)" if dirty else "")
