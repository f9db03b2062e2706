#!/usr/bin/env bash
# The session's last GPU call: everything still unmeasured, each step capped, ~9.5 minutes.
#   OUT=/tmp/out bash ci/gpu/final.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
FINAL_OUT=${OUT:-gpu-out}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OUT=/tmp/final-out   # staged, then one tarball back
mkdir -p "$OUT" "$FINAL_OUT"
trap 'tar czf "$FINAL_OUT/final.tgz" -C "$OUT" .' EXIT
step() {  # step NAME TIMEOUT CMD...
    local name=$1 limit=$2; shift 2
    echo "=================== $name (limit ${limit}s)"
    local start=$(date +%s)
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    echo "=================== $name rc=$? in $(( $(date +%s) - start )) s"
    tail -c 2500 "$OUT/$name.log"
}
[ -f ci/gpu/kernels_sanitize.sh ] && step sanitize 60 bash ci/gpu/kernels_sanitize.sh
step kernels 190 python3 ci/gpu/kernels.py
step idle 120 python3 ci/gpu/idle_meter.py
step gate_aa 100 python3 ci/gpu/gate_aa.py --budget-s 70 --rounds 3
step host_gpus 30 python3 ci/gpu/host_gpus.py
step decode 80 python3 ci/gpu/decode_modes.py --contexts 4096,65536 --verify triton --modes gpu/full,cpu/verify-graph --no-lossless
