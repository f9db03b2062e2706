#!/usr/bin/env bash
# Run worker cells directly on a GPU host (no controller, no install): one JSON cell per line
# of the file given as $1; results go to $OUT (default ./gpu-out) as <n>.json, logs as <n>.log.
#   OUT=/tmp/out bash ci/gpu_cells.sh cells.jsonl
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 - <<'PY' > "$OUT/env.json"
import json; from harness.worker.main import environment; print(json.dumps(environment()))
PY
n=0
while IFS= read -r cell; do
    [[ -z "$cell" || "$cell" == \#* ]] && continue
    n=$((n+1))
    echo "== cell $n: $cell"
    start=$(date +%s)
    echo "$cell" | python3 -m harness.worker > "$OUT/$n.json" 2> "$OUT/$n.log"
    python3 - "$OUT/$n.json" "$(( $(date +%s) - start ))" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); m = r["metrics"]
keys = ("tokens_per_s", "tokens_per_s_spread", "accept_len_mean", "step_ms_p50", "idle_fraction")
print(f"   {r['status']} in {sys.argv[2]} s:", {k: round(m[k], 4) if isinstance(m.get(k), float) else m.get(k) for k in keys},
      (r["error"] or "")[:2000])
PY
done < "$1"
