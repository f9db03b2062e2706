# Sourced by the one-call GPU scripts (final.sh, next_session.sh): stage every output under one
# folder and bring it back as a single tarball (the device returns at most 8 files), and run
# each step capped in time with its log kept and its tail shown.
#   TARBALL=name.tgz; source ci/gpu/steps.sh; step NAME TIMEOUT CMD...
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
FINAL_OUT=${OUT:-gpu-out}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OUT=/tmp/${TARBALL%.tgz}-out
mkdir -p "$OUT" "$FINAL_OUT"
trap 'tar czf "$FINAL_OUT/$TARBALL" -C "$OUT" .' EXIT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
git rev-parse HEAD >> "$OUT/gpu.txt" 2>/dev/null

step() {  # step NAME TIMEOUT CMD...
    local name=$1 limit=$2; shift 2
    echo "=================== $name (limit ${limit}s)"
    local start=$(date +%s)
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    echo "=================== $name rc=$? in $(( $(date +%s) - start )) s"
    tail -c 2500 "$OUT/$name.log"
}
