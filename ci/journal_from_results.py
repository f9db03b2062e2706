"""Make a run journal from worker result files, so `harness report` can draw them.

For results produced without the controller — `ci/gpu_cells.sh` on a GPU host that has only
torch installed writes one worker result JSON per cell — copied back to this machine:

    python ci/journal_from_results.py --scenario nightly gpu-out/[0-9]*.json
    ci/screenshot_report.sh RUN_ID results/h200/report-h200.png

Prints the new run id. The journal records the commit of this checkout (the code the results
were measured with should be the same: say so with --sha if not) and trigger `manual`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.sweep.gitinfo import git_info
from harness.sweep.journal import RunJournal, new_run_id


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", type=Path, help="worker result JSON files")
    ap.add_argument("--scenario", default="imported", help="scenario (MLflow experiment) name")
    ap.add_argument("--root", type=Path, default=Path("results/runs"), help="journal root")
    ap.add_argument("--run-id", default=None, help="default: a new time-stamped id")
    ap.add_argument("--sha", default=None, help="commit the results were measured at")
    ap.add_argument("--trigger", default="manual", choices=("manual", "nightly", "pr"))
    args = ap.parse_args(argv)

    results = []
    for path in args.results:
        try:
            result = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            print(f"{path}: skipped ({e})", file=sys.stderr)
            continue
        if not isinstance(result, dict) or "cell" not in result or "cell_id" not in result:
            print(f"{path}: skipped (not a worker result)", file=sys.stderr)
            continue
        results.append(result)
    if not results:
        print("no worker results given", file=sys.stderr)
        return 2

    git = git_info()
    meta = {"git_sha": args.sha or git["sha"], "git_branch": git["branch"],
            "git_dirty": None if args.sha else git["dirty"], "trigger": args.trigger,
            "hosts": sorted({str(r.get("host") or (r.get("env") or {}).get("hostname"))
                             for r in results}),
            "imported_from": [str(p) for p in args.results]}
    cells, seen = [], set()
    for r in results:  # one cell per id: a repeated file must not fail the journal
        if r["cell_id"] not in seen:
            seen.add(r["cell_id"])
            cells.append(r["cell"])
    run_id = args.run_id or new_run_id()
    journal = RunJournal.create(args.root, run_id, args.scenario, None,
                                f"# imported from {len(results)} worker result file(s)\n",
                                cells, meta)
    for r in results:
        r.setdefault("host", (r.get("env") or {}).get("hostname"))
        journal.write_cell(r)
    print(run_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
