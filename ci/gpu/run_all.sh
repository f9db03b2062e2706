#!/usr/bin/env bash
# One device call's worth of GPU checks (each script prints its table last and writes JSON to $OUT).
#   OUT=/tmp/out bash ci/gpu/run_all.sh "tree_build verify_kernels idle_meter decode_modes" [decode args...]
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
git rev-parse HEAD 2>/dev/null | tee -a "$OUT/gpu.txt"
scripts=$1; shift
for s in $scripts; do
    echo "=================== $s"
    start=$(date +%s)
    if [ "$s" = decode_modes ]; then
        timeout 420 python3 "ci/gpu/$s.py" "$@"
    else
        timeout 200 python3 "ci/gpu/$s.py"
    fi
    echo "=================== $s rc=$? in $(( $(date +%s) - start )) s"
done
