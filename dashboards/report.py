"""The run report: one self-contained HTML page per run, `results/runs/<id>/report/index.html`.

Self-contained means it opens from disk, from an MLflow artifact view or an e-mail attachment
with nothing else: figures are inlined as base64 PNG, CSS is inline, there is no script and
no network access (a Content-Security-Policy forbids any). The PNGs are also written beside
index.html, so MLflow's artifact browser shows them one by one.

Contents: a summary (host, GPU, driver, torch, commit, scenario, trigger, date), the figures,
the cell table (with head/base ratios and verdicts when compared with another run), the failed
cells with their errors. Built from the journal alone (harness.sweep.journal), so it can be made
again at any time with `harness report RUN`.
"""

from __future__ import annotations

import base64
import html
import math
import string
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from harness.protocol.params import times_a_kernel
from harness.protocol.redact import redact_uri
from harness.sweep.journal import RunJournal, atomic_write_text

from . import figures, idle, kernels, style
from .history import history as history_figure

REPORT_DIR = "report"
INDEX = "index.html"
MAX_TIMELINES = 12
def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# -- figures ---------------------------------------------------------------------------------


@dataclass
class FigureFile:
    name: str        # file name of the PNG beside index.html
    caption: str
    png: bytes | None = None
    error: str | None = None


@dataclass
class Report:
    path: Path                   # index.html
    figures: list[FigureFile] = field(default_factory=list)
    verdicts: dict | None = None   # per cell id (harness.gate.runs.Verdict), when compared


def _render(out_dir: Path, name: str, caption: str, draw) -> FigureFile:
    """Draw one figure; a failure becomes a visible card in the report, not a lost report."""
    path = out_dir / name
    try:
        draw(path)
        return FigureFile(name, caption, path.read_bytes())
    except Exception as e:  # noqa: BLE001 - one broken figure must not cost the whole report
        return FigureFile(name, caption, error=f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}")


def _figures(results: list[dict], out_dir: Path, commit: str | None, reference: str | None,
             history: list[dict] | None) -> list[FigureFile]:
    # decode: cells with a tokens/s; decode-like: every non-kernel cell (idle, timelines).
    decode = [r for r in results if figures.is_decode(r)]
    kernel = [r for r in results if (r.get("cell") or {}).get("workload") == "kernel"]
    decode_like = [r for r in results if not times_a_kernel(r.get("cell") or {})]
    out = []
    if decode or not results:
        out.append(_render(out_dir, "tokens_vs_context.png",
                           "Decode tokens/s vs context length; bars span the repeats.",
                           lambda p: figures.tokens_vs_context(decode, p, commit=commit)))
    modes = {(r.get("cell") or {}).get("verify_mode") for r in decode}
    if len(modes) > 1:
        ref = figures.pick_reference(decode, reference)
        out.append(_render(out_dir, "speedup_heatmap.png",
                           f"Speedup of each verify mode over verify={ref}, other parameters equal.",
                           lambda p: figures.speedup_heatmap(decode, p, reference, commit=commit)))
    if decode_like:
        out.append(_render(out_dir, "idle_by_phase.png",
                           "GPU idle fraction by phase (diamond: always-on estimate) and host "
                           "time per step by phase.",
                           lambda p: idle.idle_by_phase(decode_like, p, commit=commit)))
    if kernel:
        out.append(_render(out_dir, "kernel_roofline.png",
                           "Verify-attention kernel time as % of the measured roofline.",
                           lambda p: kernels.roofline_vs_context(kernel, p, commit=commit)))
    with_timeline = [r for r in decode_like if idle.timeline_intervals(r)]
    shown = (f" (timelines of the first {MAX_TIMELINES} of {len(with_timeline)} cells that "
             f"have one)" if len(with_timeline) > MAX_TIMELINES else "")
    names = style.short_names(decode_like)
    for i, r in enumerate(with_timeline[:MAX_TIMELINES]):
        name = names.get(r.get("cell_id"), idle.cell_name(r))
        out.append(_render(out_dir, f"timeline-{r['cell_id']}.png",
                           f"GPU timeline of a few steady steps: {name}" + (shown if i == 0 else ""),
                           lambda p, r=r, name=name: idle.timeline(
                               r, p, commit=commit,
                               title=style.title(f"GPU timeline — {name}", [r], commit))))
    for i, h in enumerate(history or []):
        out.append(_render(out_dir, f"history-{i}.png",
                           f"History of {h.get('metric', 'tokens_per_s')}"
                           + (f" for {h['cell']}" if h.get("cell") else ""),
                           lambda p, h=h: history_figure(
                               h.get("points") or [], p, metric=h.get("metric", "tokens_per_s"),
                               unit=h.get("unit"),
                               change_points=h.get("change_points") or (),
                               baseline=h.get("baseline"), cell=h.get("cell"), gpu=h.get("gpu"))))
    return out


# -- HTML ------------------------------------------------------------------------------------

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1b1b1b;
       margin: 0 auto; padding: 1.5em 2em 3em; max-width: 1400px; background: #fff; }
h1 { font-size: 1.5em; margin: 0 0 .2em; } h3 { font-size: 1.05em; margin: 1.2em 0 .4em; } h2 { font-size: 1.2em; margin: 1.8em 0 .6em;
     border-bottom: 1px solid #ddd; padding-bottom: .2em; }
.sub { color: #555; margin: 0 0 1em; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { padding: .25em .7em; border-bottom: 1px solid #eee; text-align: left; vertical-align: top; }
th { background: #f6f6f6; font-weight: 600; position: sticky; top: 0; }
td.num, th.num { text-align: right; }
table.summary th { background: none; width: 9em; color: #555; font-weight: 500; }
.ok { color: #1a7f37; } .failed, .slower, .regressed { color: #b00020; font-weight: 600; }
.inconclusive, .head-failed, .base-failed { color: #9a6700; } .missing, .muted { color: #777; } .faster, .improved { color: #0b5cad; font-weight: 600; }
.badge { display: inline-block; white-space: nowrap; padding: 0 .5em; border-radius: .8em; font-size: .85em;
         background: #eee; }
.badge.ok { background: #dff3e4; } .badge.failed { background: #fde2e4; }
.badge.missing { background: #eee; }
figure { margin: 1em 0 2em; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #555; font-size: .9em; margin-top: .3em; }
pre { background: #f7f7f7; border: 1px solid #e5e5e5; padding: .6em .8em; overflow-x: auto;
      font-size: 12px; white-space: pre-wrap; word-break: break-word; }
.swatch { display: inline-block; width: .8em; height: .8em; border-radius: 2px;
          margin-right: .3em; vertical-align: baseline; }
.counts span { margin-right: 1.2em; }
footer { margin-top: 3em; color: #888; font-size: .85em; }
"""

PAGE = string.Template("""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src data:; style-src 'unsafe-inline'">
<title>$title</title>
<style>$css</style>
</head>
<body>
<h1>$title</h1>
<p class="sub">$subtitle</p>
<p class="counts">$counts</p>
<h2>Summary</h2>
<table class="summary">
$summary
</table>
$compare_note
<h2>Figures</h2>
$figures
<h2>Cells</h2>
$cells
<h2>Failed cells</h2>
$failed
<footer>Made by <code>harness report $run_id</code> from the journal $journal_path.</footer>
</body>
</html>
""")


def _e(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _fmt(value, spec: str) -> str:
    return format(value, spec) if _finite(value) else "–"


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
    if _finite(value):
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


def _cells_table(journal: RunJournal, results: dict[str, dict],
                 verdicts: dict | None, kernel: bool) -> str:
    """One table of the run's decode cells (kernel=False) or kernel cells, in matrix order;
    cells that never produced a result are listed as such."""
    planned = {c["cell_id"]: c for c in journal.cells}
    order = list(planned) + [cid for cid in results if cid not in planned]
    entries = []  # (cid, result or None, cell, label)
    for cid in order:
        r = results.get(cid)
        cell = (r or {}).get("cell") or planned.get(cid, {}).get("cell") or {}
        if times_a_kernel(cell) == kernel:
            entries.append((cid, r, cell, (r or {}).get("label") or planned.get(cid, {}).get("label") or cid))
    if not entries:
        return ""
    names = style.short_names([{"cell_id": cid, "cell": cell, "label": label}
                               for cid, _, cell, label in entries])
    hosts = {str(r.get("host")) for _, r, _, _ in entries if r}
    columns = KERNEL_COLUMNS if kernel else DECODE_COLUMNS
    head = ["<th>cell</th>"] + (["<th>host</th>"] if len(hosts) > 1 else [])
    head += [f'<th class="num">{_e(h)}</th>' for h, _, _ in columns] + ["<th>status</th>"]
    if verdicts is not None:
        what = "kernel µs" if kernel else "tok/s"
        head += [f'<th class="num">base {what}</th>', '<th class="num">head/base</th>',
                 "<th>verdict</th>"]
    rows = []
    for cid, r, cell, label in entries:
        mode = cell.get("verify_mode")
        swatch = (f'<span class="swatch" style="background:{style.mode_color(mode)}"></span>'
                  if mode else "")
        tds = [f'<td title="{_e(label)} ({_e(cid)})">{swatch}{_e(names.get(cid, label))}</td>']
        if len(hosts) > 1:
            tds.append(f"<td>{_e((r or {}).get('host'))}</td>")
        ok = r is not None and r.get("status") == "ok"
        m = (r or {}).get("metrics") or {}
        for _, key, spec in columns:
            text = "–" if not ok else key(r) if callable(key) else _fmt(m.get(key), spec)
            tds.append(f'<td class="num">{_e(text)}</td>')
        status = "missing" if r is None else ("ok" if ok else "failed")
        tds.append(f'<td><span class="badge {status}">{_e("no result" if r is None else status)}'
                   f"</span></td>")
        if verdicts is not None:
            v = verdicts.get(cid)
            if v is None:
                tds += ['<td class="num">–</td>', '<td class="num">–</td>',
                        '<td class="muted">no result</td>']
            else:
                ratio = f"{v.ratio:.3f}" if _finite(v.ratio) else "–"
                detail = f' <span class="muted">({_e(v.detail)})</span>' if v.detail else ""
                tds += [f'<td class="num">{_e(_fmt(v.base, ".1f"))}</td>',
                        f'<td class="num">{_e(ratio)}</td>',
                        f'<td><span class="{_e(v.verdict.replace(" ", "-"))}">{_e(v.verdict)}'
                        f"</span>{detail}</td>"]
        rows.append("<tr>" + "".join(tds) + "</tr>")
    caption = "Kernel cells" if kernel else "Decode cells"
    return (f"<h3>{caption}</h3>\n<table class=\"cells\">\n<thead><tr>{''.join(head)}</tr></thead>"
            f"\n<tbody>\n" + "\n".join(rows) + "\n</tbody>\n</table>")


def _failed_section(results: dict[str, dict], missing: list[dict]) -> str:
    parts = []
    for cid, r in results.items():
        if r.get("status") == "ok":
            continue
        parts.append(f"<h3>{_e(r.get('label') or cid)}</h3>\n"
                     f"<p class=\"muted\">cell {_e(cid)} on {_e(r.get('host') or '?')}"
                     f"{', after ' + _e(r.get('wall_s')) + ' s' if r.get('wall_s') is not None else ''}"
                     f"</p>\n<pre>{_e((r.get('error') or 'no error recorded').strip())}</pre>")
    if missing:
        items = "".join(f"<li>{_e(c['label'])} <span class=\"muted\">({_e(c['cell_id'])})</span></li>"
                        for c in missing)
        parts.append(f"<p>{len(missing)} cell(s) never produced a result (interrupted or not "
                     f"yet run; finish with <code>harness run SCENARIO --resume RUN</code>):</p>"
                     f"<ul>{items}</ul>")
    return "\n".join(parts) or '<p class="ok">None: every cell ran and succeeded.</p>'


def _figures_html(figs: list[FigureFile]) -> str:
    parts = []
    for f in figs:
        if f.png is not None:
            data = base64.b64encode(f.png).decode("ascii")
            parts.append(f'<figure><img src="data:image/png;base64,{data}" alt="{_e(f.caption)}">'
                         f"<figcaption>{_e(f.caption)}</figcaption></figure>")
        else:
            parts.append(f'<figure><p class="failed">Figure {_e(f.name)} could not be drawn:</p>'
                         f"<pre>{_e(f.error)}</pre></figure>")
    return "\n".join(parts) or '<p class="muted">No figures: the run has no results.</p>'


def build_report(journal: RunJournal, out_dir=None, *, base: RunJournal | None = None,
                 verdicts: dict | None = None, verdict_note: str = "",
                 reference: str | None = None, history: list[dict] | None = None) -> Report:
    """Write the report of `journal` into `out_dir` (default `<run>/report/`): index.html
    plus one PNG per figure. `base`: the run it was compared with, and `verdicts` the gate's
    per-cell verdicts against it (harness.gate.runs.compare: the report draws them, it does not
    judge), explained by `verdict_note`; `reference`: the verify mode the speedup heatmap
    divides by; `history`: series for the history figure (dicts with the arguments of
    harness.dashboards.history.history)."""
    out_dir = Path(out_dir) if out_dir is not None else journal.path / REPORT_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    results = journal.results()
    result_list = list(results.values())
    missing = [c for c in journal.cells if c["cell_id"] not in results]
    meta = journal.meta
    commit = style.short_commit(meta.get("git_sha"), meta.get("git_dirty"))

    figs = _figures(result_list, out_dir, commit, reference, history)
    compare_note = ""
    if base is not None:
        gpus_head = {str((r.get("env") or {}).get("gpu")) for r in result_list}
        gpus_base = {str((r.get("env") or {}).get("gpu")) for r in base.results().values()}
        warn = ""
        if gpus_head != gpus_base:
            warn = (f' <strong class="failed">Different GPUs ({_e(", ".join(sorted(gpus_head)))}'
                    f' vs {_e(", ".join(sorted(gpus_base)))}): ratios are not comparable.</strong>')
        compare_note = (f"<p>Compared with run <strong>{_e(base.run_id)}</strong> (commit "
                        f"{_e(style.short_commit(base.meta.get('git_sha')) or 'unknown')}): "
                        f"head/base = this run's value ÷ the base run's, per cell (decode: tokens/s, "
                        f"higher is better; kernel: µs, lower is better). {_e(verdict_note)}"
                        f"{warn}</p>")

    n_ok = sum(r.get("status") == "ok" for r in result_list)
    n_failed = len(result_list) - n_ok
    counts = (f'<span class="ok">{n_ok} ok</span><span class="{"failed" if n_failed else "muted"}">'
              f'{n_failed} failed</span><span class="muted">{len(missing)} missing</span>'
              f'<span class="muted">{len(journal.cells)} planned</span>')
    gpus = sorted({str((r.get("env") or {}).get("gpu")) for r in result_list
                   if (r.get("env") or {}).get("gpu")})
    subtitle = " · ".join(filter(None, [", ".join(gpus) or "CPU (no GPU)",
                                        f"commit {commit}" if commit else None,
                                        journal.run.get("created_at")]))
    summary = "\n".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>"
                        for k, v in _summary_rows(journal, result_list))
    page = PAGE.substitute(
        title=_e(f"{journal.scenario_name} — run {journal.run_id}"), css=CSS,
        subtitle=_e(subtitle), counts=counts, summary=summary, compare_note=compare_note,
        figures=_figures_html(figs),
        cells=(_cells_table(journal, results, verdicts, kernel=False)
               + _cells_table(journal, results, verdicts, kernel=True)) or "<p>No cells.</p>",
        failed=_failed_section(results, missing), run_id=_e(journal.run_id),
        journal_path=_e(journal.path))
    index = out_dir / INDEX
    atomic_write_text(index, page)
    index.chmod(0o644)  # a report is for reading (mkstemp made it owner-only)
    return Report(index, figs, verdicts)
