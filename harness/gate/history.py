"""`harness history SCENARIO --metric tokens_per_s`: each cell's series from MLflow, its steps.

A series is one cell (cell id) on one GPU class: the metric of every ok child run of the
scenario's experiment, oldest first (PR runs left out unless asked: they measure code that was
not merged). Steps are found by harness.gate.changepoint and named by the commit range they
happened in — `git log A..B` between the last run before and the first run after — ready for
`harness bisect --good A --bad B --cell ID`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from harness.protocol.errors import InputError
from harness.gate.baselines import (TAG_CELL_ID, TAG_RUN_ID, TAG_SUPERSEDED, gpu_class,
                                    mlflow_client, search_all)
from harness.gate.changepoint import (DEFAULT_ALPHA, DEFAULT_MIN_SIZE, Step, find_steps,
                                      is_regression)
from harness.gate.policy import Policy


@dataclass(frozen=True)
class Point:
    value: float
    sha: str
    started: int             # epoch ms
    run_id: str              # the harness run id (journal folder)
    mlflow_run_id: str
    branch: str = ""
    trigger: str = ""

    @property
    def date(self) -> str:
        return datetime.fromtimestamp(self.started / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M")


@dataclass
class Series:
    cell_id: str
    label: str
    gpu_class: str
    points: list[Point] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)

    def commit_range(self, step: Step) -> str:
        a, b = self.points[step.index - 1].sha, self.points[step.index].sha
        return f"{a[:10]}..{b[:10]}"

    def to_dict(self, policy: Policy) -> dict:
        return {"cell_id": self.cell_id, "label": self.label, "gpu_class": self.gpu_class,
                "points": [{"value": p.value, "sha": p.sha, "date": p.date, "run_id": p.run_id,
                            "branch": p.branch, "trigger": p.trigger} for p in self.points],
                "steps": [{"index": s.index, "before": s.before, "after": s.after,
                           "ratio": s.ratio, "p_value": s.p_value,
                           "regression": is_regression(s, policy),
                           "good": self.points[s.index - 1].sha, "bad": self.points[s.index].sha,
                           "first_run_after": self.points[s.index].run_id,
                           "date": self.points[s.index].date} for s in self.steps]}


def fetch_metrics(uri: str | None, scenario: str, metrics: list[str], *, gpu: str | None = None,
                  branch: str | None = None, include_pr: bool = False,
                  cell_ids: list[str] | None = None) -> dict[str, list[Series]]:
    """Every (cell, GPU class) series of each metric in experiment `scenario`, oldest point
    first, from one search of its runs (a nightly checks three metrics; the search of a long
    history is most of a call's time): metric -> series."""
    with mlflow_client(uri) as client:
        exp = client.get_experiment_by_name(scenario)
        if exp is None:
            raise InputError(None, None, None,
                             f"no MLflow experiment '{scenario}' in {client.tracking_uri}")
        flt = "tags.status = 'ok'" + (f" and tags.`git.branch` = '{branch}'" if branch else "")
        series: dict[str, dict[tuple[str, str], Series]] = {m: {} for m in metrics}
        for run in search_all(client, [exp.experiment_id], flt,
                              order_by=["attributes.start_time ASC"]):
            tags = run.data.tags
            cid = tags.get(TAG_CELL_ID)
            if not cid or TAG_SUPERSEDED in tags:
                continue
            if cell_ids and cid not in cell_ids:
                continue
            if tags.get("trigger") == "pr" and not include_pr:
                continue
            cls = gpu_class(tags.get("gpu"), tags.get("cpu_model"))
            if gpu and cls != gpu:
                continue
            for metric in metrics:
                value = run.data.metrics.get(metric)
                if value is None:
                    continue
                s = series[metric].setdefault((cid, cls), Series(cid, run.info.run_name or cid, cls))
                s.points.append(Point(float(value), tags.get("git.sha", "unknown"),
                                      int(run.info.start_time or 0), tags.get(TAG_RUN_ID, "?"),
                                      run.info.run_id, tags.get("git.branch", ""),
                                      tags.get("trigger", "")))
    out = {}
    for metric, by_key in series.items():
        for s in by_key.values():
            s.points.sort(key=lambda p: p.started)
        out[metric] = sorted(by_key.values(), key=lambda s: (s.gpu_class, s.label))
    return out


def analyse(series: list[Series], policy: Policy, *, min_size: int = DEFAULT_MIN_SIZE,
            alpha: float = DEFAULT_ALPHA, seed: int = 0) -> list[Series]:
    for s in series:
        s.steps = find_steps([p.value for p in s.points], policy, min_size=min_size,
                             alpha=alpha, seed=seed)
    return series


def recent_regressions(series: list[Series], policy: Policy, recent: int) -> list[tuple[Series, Step]]:
    """Regressing steps whose new level starts within the last `recent` points of its series."""
    return [(s, st) for s in series for st in s.steps
            if is_regression(st, policy) and st.index >= len(s.points) - recent]


def plot(series: list[Series], metric: str, out_dir: str | Path) -> list[Path]:
    """One PNG per series (dashboards.history), named by cell id and GPU class."""
    from harness.dashboards.history import history

    out = []
    for s in series:
        points = [(p.sha, p.date, p.value) for p in s.points]
        out.append(history(points, Path(out_dir) / f"{s.cell_id}-{s.gpu_class}-{metric}.png",
                           metric=metric, unit="", change_points=[st.index for st in s.steps],
                           cell=s.label, gpu=s.gpu_class))
    return out
