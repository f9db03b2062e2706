#!/usr/bin/env bash
# Screenshot of a run's HTML report, for the README (results/h200/report-h200.png) or a PR comment.
#
#   ci/screenshot_report.sh RUN_ID [OUT.png] [--compare BASE_RUN_ID]
#
# Run on the controller that holds the run's journal ($RESULTS/runs/RUN_ID, RESULTS defaults to
# results/ of this checkout), with the harness installed (.venv, or set HARNESS and PYTHON) and
# Chromium on PATH (Debian: apt-get install chromium). A batch run on a GPU host (python -m
# harness.worker --cells ... --out DIR) becomes a run first: harness import DIR.
# Rebuilds the report from the journal (without touching MLflow), checks it in headless
# Chromium (no console errors, every image loaded) and writes the top of the page, 1400 px
# wide and at most $HEIGHT px tall (default 2600: summary and the first figures), to OUT.png.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 1 ]; then
    sed -n '2,13p' "$0"; exit 2
fi
run=$1; shift
out=results/h200/report-h200.png
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then out=$1; shift; fi

harness=${HARNESS:-.venv/bin/harness}
python=${PYTHON:-.venv/bin/python}
results=${RESULTS:-results}
"$harness" report "$run" --no-mlflow --results "$results" "$@" >/dev/null
mkdir -p "$(dirname "$out")"
"$python" -m harness.dashboards.headless "$results/runs/$run/report/index.html" "$out" "${HEIGHT:-2600}"
echo "screenshot: $out"
