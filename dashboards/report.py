"""The run report: one self-contained HTML page per run, `results/runs/<id>/report/index.html`.

Self-contained means it opens from disk, from an MLflow artifact view or an e-mail attachment
with nothing else: figures are inlined as base64 PNG, CSS is inline, there is no script and
no network access (a Content-Security-Policy forbids any). The PNGs are also written beside
index.html, so MLflow's artifact browser shows them one by one.

Contents: a summary (host, GPU, driver, torch, commit, scenario, trigger, date), the figures
(a figure with nothing to draw is one line saying why, not a picture of an empty panel), the
cell table (with head/base ratios and verdicts when compared with another run, whose results
every figure draws faded behind this run's), the hardware counters of cells run with `ncu:
true` (one row a kernel: dashboards/counters.py), the failed cells with their errors. Built from
the journal alone (harness.sweep.journal), so it can be made again at any time with
`harness report RUN`; `only` narrows it to some cells (`harness report RUN -k EXPR`). The page
is the Jinja2 template report.html.j2 beside this module, autoescaped.
"""

from __future__ import annotations

import base64
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from harness.protocol.numbers import is_finite_number
from harness.protocol.params import times_a_kernel
from harness.protocol.redact import redact_uri
from harness.sweep.journal import RunJournal, atomic_write_text

from . import counters, figures, idle, kernels, style
from .history import history as history_figure

REPORT_DIR = "report"
INDEX = "index.html"
TEMPLATE = "report.html.j2"
MAX_TIMELINES = 12
# The PNGs a report writes beside index.html (and so the ones a new report may replace).
FIGURE_FILES = ("tokens_vs_context.png", "speedup_heatmap.png", "idle_by_phase.png",
                "kernel_roofline.png", "timeline-*.png", "history-*.png")


# -- figures ---------------------------------------------------------------------------------


@dataclass
class FigureFile:
    name: str        # file name of the PNG beside index.html
    caption: str
    png: bytes | None = None
    error: str | None = None
    note: str | None = None      # nothing to draw: the one line that says why (no PNG)
    title: str = ""              # what the figure would have shown, for that line


@dataclass
class Report:
    path: Path                   # index.html
    figures: list[FigureFile] = field(default_factory=list)
    verdicts: dict | None = None   # per cell id (harness.gate.runs.Verdict), when compared


def _render(out_dir: Path, name: str, title: str, caption: str, draw) -> FigureFile:
    """Draw one figure; a failure becomes a visible card in the report, not a lost report,
    and a figure with nothing on it one line."""
    path = out_dir / name
    try:
        draw(path)
        return FigureFile(name, caption, path.read_bytes(), title=title)
    except style.NothingToDraw as e:
        return FigureFile(name, caption, note=str(e), title=title)
    except Exception as e:  # noqa: BLE001 - one broken figure must not cost the whole report
        return FigureFile(name, caption, title=title,
                          error=f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}")


def _figures(results: list[dict], out_dir: Path, commit: str | None, reference: str | None,
             history: list[dict] | None, base: list[dict] | None,
             base_name: str) -> list[FigureFile]:
    # decode: cells with a tokens/s; decode-like: every non-kernel cell (idle, timelines).
    decode = [r for r in results if figures.is_decode(r)]
    kernel = [r for r in results if (r.get("cell") or {}).get("workload") == "kernel"]
    decode_like = [r for r in results if not times_a_kernel(r.get("cell") or {})]
    faded = dict(base=base, base_name=base_name, card=False) if base is not None else \
        dict(card=False)
    out = []
    if decode or not results:
        out.append(_render(out_dir, "tokens_vs_context.png", "Decode tokens/s vs context length",
                           "Decode tokens/s vs context length; bars span the repeats."
                           + (" Faded: the base run." if base is not None else ""),
                           lambda p: figures.tokens_vs_context(decode, p, commit=commit,
                                                               **faded)))
    if decode:
        ref = figures.pick_reference(decode, reference)
        out.append(_render(out_dir, "speedup_heatmap.png", "Speedup heatmap",
                           f"Speedup of each verify mode over verify={ref}, other parameters "
                           f"equal." + (" Small print: the base run's." if base is not None
                                        else ""),
                           lambda p: figures.speedup_heatmap(decode, p, reference,
                                                             commit=commit, **faded)))
    if decode_like:
        out.append(_render(out_dir, "idle_by_phase.png", "GPU idle and host time by phase",
                           "GPU idle fraction by phase (diamond: always-on estimate) and host "
                           "time per step by phase." + (" Thin, faded bars: the base run."
                                                        if base is not None else ""),
                           lambda p: idle.idle_by_phase(decode_like, p, commit=commit, **faded)))
    if kernel:
        out.append(_render(out_dir, "kernel_roofline.png", "Kernel roofline",
                           "Verify-attention kernel time as % of the measured roofline."
                           + (" Faded: the base run." if base is not None else ""),
                           lambda p: kernels.roofline_vs_context(kernel, p, commit=commit,
                                                                 **faded)))
    with_timeline = [r for r in decode_like if idle.timeline_intervals(r)]
    shown = (f" (timelines of the first {MAX_TIMELINES} of {len(with_timeline)} cells that "
             f"have one)" if len(with_timeline) > MAX_TIMELINES else "")
    names = style.short_names(decode_like)
    base_by_id = {r.get("cell_id"): r for r in base or []}
    for i, r in enumerate(with_timeline[:MAX_TIMELINES]):
        name = names.get(r.get("cell_id"), idle.cell_name(r))
        extra = (dict(base=base_by_id.get(r["cell_id"]), base_name=base_name)
                 if base is not None else {})
        where = idle.idle_boundaries(r)
        out.append(_render(out_dir, f"timeline-{r['cell_id']}.png", f"GPU timeline of {name}",
                           f"GPU timeline of a few steady steps: {name}"
                           + (shown if i == 0 else "") + (f". {where[0].upper()}{where[1:]}." if where else ""),
                           lambda p, r=r, name=name, extra=extra: idle.timeline(
                               r, p, commit=commit, card=False,
                               title=style.title(f"GPU timeline — {name}", [r], commit),
                               **extra)))
    for i, h in enumerate(history or []):
        what = (f"History of {h.get('metric', 'tokens_per_s')}"
                + (f" for {h['cell']}" if h.get("cell") else ""))
        out.append(_render(out_dir, f"history-{i}.png", what, what,
                           lambda p, h=h: history_figure(
                               h.get("points") or [], p, metric=h.get("metric", "tokens_per_s"),
                               unit=h.get("unit"),
                               change_points=h.get("change_points") or (),
                               baseline=h.get("baseline"), cell=h.get("cell"), gpu=h.get("gpu"))))
    return out


# -- the page ------------------------------------------------------------------------------

_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent),
                          autoescape=True, undefined=jinja2.StrictUndefined,
                          trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


def _fmt(value, spec: str) -> str:
    return format(value, spec) if is_finite_number(value) else "–"


def _summary_rows(journal: RunJournal, results: list[dict]) -> list[tuple[str, str]]:
    meta = journal.meta
    envs = [r.get("env") or {} for r in results]

    def values(key):
        seen = []
        for env in envs:
            v = env.get(key)
            if v not in (None, "") and str(v) not in seen:
                seen.append(str(v))
        return ", ".join(seen)

    hosts = sorted({str(r.get("host")) for r in results if r.get("host")}) or \
        [str(h) for h in meta.get("hosts") or []]
    gpu = values("gpu")
    count = max((e.get("gpu_count") or 0 for e in envs), default=0)
    sha = meta.get("git_sha") or (meta.get("git") or {}).get("sha")
    commit = sha or "unknown"
    if meta.get("git_branch"):
        commit += f" ({meta['git_branch']})"
    if meta.get("git_dirty"):
        commit += " — uncommitted changes: not a faithful measurement of this commit"
    rows = [
        ("Scenario", journal.scenario_name),
        ("Run", journal.run_id),
        ("Trigger", meta.get("trigger") or "manual"),
        ("Date", journal.run.get("created_at") or "unknown"),
        ("Commit", commit),
        ("Host", ", ".join(hosts) or "unknown"),
        ("GPU", f"{gpu} (× {count})" if gpu and count > 1 else (gpu or "none (CPU)")),
        ("Driver", values("driver") or "–"),
        ("CUDA", values("cuda") or "–"),
        ("torch", values("torch") or "–"),
        ("Python", values("python") or "–"),
    ]
    state = journal.tracking_state()
    if state.get("parent_run_id"):
        # The page is uploaded to MLflow and mailed around: never a password (the journal
        # keeps URIs redacted; a journal from before that did not).
        where = redact_uri(str(state.get("tracking_uri")))
        rows.append(("MLflow", f"parent run {state['parent_run_id']} in {where}"))
    return rows


def _idle_cell(result: dict) -> str:
    m = result.get("metrics") or {}
    value = m.get("idle_fraction")
    if is_finite_number(value):
        return f"{value:.1%}"
    if result.get("status") == "ok" and not (result.get("env") or {}).get("gpu"):
        return "n/a (no GPU)"
    return "–"


# Columns of the cell tables: (header, metric key or a function of the result, format).
DECODE_COLUMNS = [
    ("tok/s", "tokens_per_s", ".1f"), ("± (MAD)", "tokens_per_s_spread", ".1f"),
    ("accept len", "accept_len_mean", ".2f"), ("step p50 ms", "step_ms_p50", ".2f"),
    ("idle", lambda r: _idle_cell(r), None), ("idle est.", "idle_fraction_est", ".1%"),
    ("syncs/step", "syncs_per_step", ".1f"),
]
KERNEL_COLUMNS = [
    ("kernel µs", "kernel_us", ".1f"), ("TB/s", "achieved_tbps", ".2f"),
    ("% roofline", "pct_roofline", ".1f"),
]


def _td(text, *, num: bool = False, title: str | None = None, swatch: str | None = None,
        badge: str | None = None, cls: str | None = None, detail: str | None = None) -> dict:
    """One table cell for the template (every key present: it is strict about names)."""
    return {"text": "" if text is None else text, "num": num, "title": title, "swatch": swatch,
            "badge": badge, "cls": cls, "detail": detail}


def _cells_table(planned: list[dict], results: dict[str, dict], verdicts: dict | None,
                 kernel: bool) -> dict | None:
    """One table of the run's decode cells (kernel=False) or kernel cells, in matrix order;
    cells that never produced a result are listed as such. None when there are none."""
    by_id = {c["cell_id"]: c for c in planned}
    order = list(by_id) + [cid for cid in results if cid not in by_id]
    entries = []  # (cid, result or None, cell, label)
    for cid in order:
        r = results.get(cid)
        cell = (r or {}).get("cell") or by_id.get(cid, {}).get("cell") or {}
        if times_a_kernel(cell) == kernel:
            label = (r or {}).get("label") or by_id.get(cid, {}).get("label") or cid
            entries.append((cid, r, cell, label))
    if not entries:
        return None
    names = style.short_names([{"cell_id": cid, "cell": cell, "label": label}
                               for cid, _, cell, label in entries])
    hosts = {str(r.get("host")) for _, r, _, _ in entries if r}
    columns = KERNEL_COLUMNS if kernel else DECODE_COLUMNS
    head = [_td("cell")] + ([_td("host")] if len(hosts) > 1 else [])
    head += [_td(h, num=True) for h, _, _ in columns] + [_td("status")]
    if verdicts is not None:
        what = "kernel µs" if kernel else "tok/s"
        head += [_td(f"base {what}", num=True), _td("head/base", num=True), _td("verdict")]
    rows = []
    for cid, r, cell, label in entries:
        mode = cell.get("verify_mode")
        full = style.full_label({"label": label, "cell": cell, "cell_id": cid})
        row = [_td(names.get(cid, label), title=f"{full} ({cid})",
                   swatch=style.mode_color(mode) if mode else None)]
        if len(hosts) > 1:
            row.append(_td((r or {}).get("host")))
        ok = r is not None and r.get("status") == "ok"
        m = (r or {}).get("metrics") or {}
        for _, key, spec in columns:
            row.append(_td("–" if not ok else key(r) if callable(key) else _fmt(m.get(key), spec),
                           num=True))
        status = "missing" if r is None else ("ok" if ok else "failed")
        row.append(_td("no result" if r is None else status, badge=status))
        if verdicts is not None:
            v = verdicts.get(cid)
            if v is None:
                row += [_td("–", num=True), _td("–", num=True), _td("no result", cls="muted")]
            else:
                row += [_td(_fmt(v.base, ".1f"), num=True),
                        _td(f"{v.ratio:.3f}" if is_finite_number(v.ratio) else "–", num=True),
                        _td(v.verdict, cls=v.verdict.replace(" ", "-"), detail=v.detail or None)]
        rows.append(row)
    return {"caption": "Kernel cells" if kernel else "Decode cells", "head": head, "rows": rows}


VERDICT_CLASS = {"met": "ok", "not met": "failed", "absent": "inconclusive"}
TARGETS_CAPTION = "Targets (the scenario's bounds; absent: a number a target needs was not measured)"


def _targets_table(journal: RunJournal, results: list[dict], wanted: list[dict] | None,
                   base: RunJournal | None = None, base_results: list[dict] | None = None) -> dict | None:
    """The scenario's targets (or `wanted`) judged on the shown results (harness.sweep.targets),
    one row each; None where there are none. With a base run, the same targets on its results
    too: its numbers beside the head's and each verdict base → head where it moved. Targets
    whose stored text does not read are one row saying so, never a failed report."""
    from harness.protocol.errors import InputError
    from harness.sweep import targets
    from harness.sweep.summary import measured_text

    compared = base is not None
    head = ([_td("target")] + ([_td("base", num=True), _td("head", num=True)] if compared
                               else [_td("measured", num=True)]) + [_td("bound"), _td("verdict")])
    try:
        wanted = targets.of_run(journal) if wanted is None else wanted
        outcomes = targets.judge_run(journal, results, wanted)
        before = targets.judge_run(base, base_results, wanted) if compared else [None] * len(outcomes)
    except InputError as e:
        return {"caption": TARGETS_CAPTION, "head": head,
                "rows": [[_td("not judged", cls="failed", detail=str(e))] + [_td("")] * (len(head) - 1)]}
    if not outcomes:
        return None

    def numbers(o) -> dict:
        title = "; ".join(f"{label}: {'?' if v is None else f'{v:.6g}'}" for label, v in o.measured)
        return _td(measured_text(o), num=True, title=title or None)

    rows = []
    for b, o in zip(before, outcomes):
        verdict = o.verdict if b is None or b.verdict == o.verdict else f"{b.verdict} → {o.verdict}"
        rows.append([_td(o.name)] + ([numbers(b)] if compared else [])
                    + [numbers(o), _td(o.bound),
                       _td(verdict, cls=VERDICT_CLASS[o.verdict], detail=o.why or None)])
    return {"caption": TARGETS_CAPTION, "head": head, "rows": rows}


def _counters_table(planned: list[dict], results: dict[str, dict]) -> dict | None:
    """The Nsight Compute counters of the cells run with `ncu: true`, one row a kernel
    (dashboards/counters.py, as `harness counters`); a cell without them says why. None when no
    cell asked for them."""
    order = list(dict.fromkeys([c["cell_id"] for c in planned] + list(results)))
    head = [_td(h) for h in ("cell", "mode", "kernel")]
    head += [_td(name, num=True) for name, *_ in counters.COLUMNS] + [_td(h) for h in counters.TEXT_COLUMNS]
    rows = []
    for cid in order:
        r = results.get(cid)
        if r is None or r.get("status") != "ok":
            continue
        full = style.full_label({**r, "cell_id": cid})
        for i, row in enumerate(counters.rows(r)):
            cells = row.cells()
            values, text = cells[:len(counters.COLUMNS)], cells[len(counters.COLUMNS):]
            rows.append([_td(full if i == 0 else "", title=f"{full} ({cid})"), _td(row.mode),
                         _td(row.kernel)] + [_td(v, num=True) for v in values] + [_td(t) for t in text])
        for mode, why in counters.errors(r).items():
            rows.append([_td(full, title=cid), _td(mode), _td("no counters", cls="muted", detail=why)]
                        + [_td("–", num=True) for _ in counters.COLUMNS] + [_td("") for _ in counters.TEXT_COLUMNS])
    if not rows:
        return None
    return {"caption": "Hardware counters (Nsight Compute, ncu: true)", "head": head, "rows": rows}


STEP_ROWS = 5  # kernels and idle gaps a cell in the report; `harness compare --kernels` has all


def _step_table(planned: list[dict], results: dict[str, dict], base: dict[str, dict]) -> dict | None:
    """What moved inside the step, for each cell profiled in both runs: busy and idle a step,
    then the STEP_ROWS kernels and idle gaps that moved most (harness.sweep.profile_diff, as
    `harness compare --kernels`). None when no cell was profiled on both sides."""
    from harness.sweep import profile_diff as pd

    head = [_td("cell"), _td("what")] + [_td(h, num=True) for h in
                                         ("base µs a step", "head µs a step", "head-base", "a step (base, head)")]
    rows = []
    for cid in dict.fromkeys([c["cell_id"] for c in planned] + list(results)):
        h, b = results.get(cid), base.get(cid)
        if not (pd.has_profile(h) and pd.has_profile(b)):
            continue
        full = style.full_label({**h, "cell_id": cid})
        for i, (kind, r) in enumerate(pd.sections(b, h, STEP_ROWS)):
            rows.append([_td(full if i == 0 else "", title=f"{full} ({cid})"),
                         _td(r.title(kind))] + [_td(c, num=True) for c in r.cells()])
    if not rows:
        return None
    return {"caption": f"Inside the step, base against head (profiled cells; the {STEP_ROWS} kernels "
                       "and idle gaps that moved most, '–': not among that run's 12 largest)",
            "head": head, "rows": rows}


def _failed(results: dict[str, dict]) -> list[dict]:
    return [{"title": style.full_label({**r, "cell_id": cid}), "cell_id": cid,
             "host": r.get("host") or "?", "wall_s": r.get("wall_s"),
             "error": (r.get("error") or "no error recorded").strip()}
            for cid, r in results.items() if r.get("status") != "ok"]


def _figure_context(f: FigureFile) -> dict:
    return {"name": f.name, "caption": f.caption, "title": f.title, "note": f.note,
            "error": f.error, "png": base64.b64encode(f.png).decode("ascii") if f.png else None}


def _clear_old_figures(out_dir: Path, keep: set[str]) -> None:
    """PNGs an earlier report left beside index.html (a cell since filtered out, a figure
    that now has nothing to draw): gone, so the folder uploaded to MLflow is this report."""
    for pattern in FIGURE_FILES:
        for png in out_dir.glob(pattern):
            if png.name not in keep:
                png.unlink()


def build_report(journal: RunJournal, out_dir=None, *, base: RunJournal | None = None,
                 verdicts: dict | None = None, verdict_note: str = "",
                 reference: str | None = None, history: list[dict] | None = None,
                 only: set[str] | None = None, only_expr: str = "",
                 targets: list[dict] | None = None) -> Report:
    """Write the report of `journal` into `out_dir` (default `<run>/report/`): index.html
    plus one PNG per figure. `base`: the run it was compared with (drawn faded in every
    figure), and `verdicts` the gate's per-cell verdicts against it (harness.gate.runs.compare:
    the report draws them, it does not judge), explained by `verdict_note`; `reference`: the
    verify mode the speedup heatmap divides by; `history`: series for the history figure (dicts
    with the arguments of harness.dashboards.history.history); `only`: the cell ids to show
    (the run's and the base's), chosen by the cell filter `only_expr` (the page says so);
    `targets`: judged instead of the run's scenario's own (harness.sweep.targets)."""
    out_dir = Path(out_dir) if out_dir is not None else journal.path / REPORT_DIR
    out_dir.mkdir(parents=True, exist_ok=True)

    def shown(cid: str) -> bool:
        return only is None or cid in only

    results = {cid: r for cid, r in journal.results().items() if shown(cid)}
    planned = [c for c in journal.cells if shown(c["cell_id"])]
    base_by_id = ({cid: r for cid, r in base.results().items() if shown(cid)}
                  if base is not None else None)
    base_results = list(base_by_id.values()) if base_by_id is not None else None
    if verdicts is not None and only is not None:
        verdicts = {cid: v for cid, v in verdicts.items() if shown(cid)}
    result_list = list(results.values())
    missing = [c for c in planned if c["cell_id"] not in results]
    meta = journal.meta
    commit = style.short_commit(meta.get("git_sha"), meta.get("git_dirty"))

    base_name = f"base run {base.run_id}" if base is not None else ""
    figs = _figures(result_list, out_dir, commit, reference, history, base_results, base_name)
    _clear_old_figures(out_dir, {f.name for f in figs if f.png is not None})
    compare = None
    if base is not None:
        gpus_head = {str((r.get("env") or {}).get("gpu")) for r in result_list}
        gpus_base = {str((r.get("env") or {}).get("gpu")) for r in base_results}
        compare = {"run_id": base.run_id, "note": verdict_note,
                   "commit": style.short_commit(base.meta.get("git_sha")) or "unknown",
                   "gpus": None if gpus_head == gpus_base else {
                       "head": ", ".join(sorted(gpus_head)), "base": ", ".join(sorted(gpus_base))}}

    n_ok = sum(r.get("status") == "ok" for r in result_list)
    gpus = sorted({str((r.get("env") or {}).get("gpu")) for r in result_list
                   if (r.get("env") or {}).get("gpu")})
    subtitle = " · ".join(filter(None, [", ".join(gpus) or "CPU (no GPU)",
                                        f"commit {commit}" if commit else None,
                                        journal.run.get("created_at")]))
    every = {c["cell_id"] for c in journal.cells} | set(journal.results())
    page = _ENV.get_template(TEMPLATE).render(
        title=f"{journal.scenario_name} — run {journal.run_id}", subtitle=subtitle,
        counts={"ok": n_ok, "failed": len(result_list) - n_ok, "missing": len(missing),
                "planned": len(planned)},
        selection=({"expr": only_expr, "shown": len(every & only), "total": len(every)}
                   if only is not None else None),
        summary=_summary_rows(journal, result_list), compare=compare,
        figures=[_figure_context(f) for f in figs],
        tables=[t for t in (_targets_table(journal, result_list, targets, base, base_results),
                            _cells_table(planned, results, verdicts, kernel=False),
                            _cells_table(planned, results, verdicts, kernel=True),
                            _step_table(planned, results, base_by_id) if base_by_id is not None else None,
                            _counters_table(planned, results)) if t],
        failed=_failed(results),
        missing=[{"label": style.full_label(c), "cell_id": c["cell_id"]} for c in missing],
        run_id=journal.run_id, journal_path=str(journal.path))
    index = out_dir / INDEX
    atomic_write_text(index, page)
    index.chmod(0o644)  # a report is for reading (mkstemp made it owner-only)
    return Report(index, figs, verdicts)
