#!/usr/bin/env bash
# The session's last GPU call: everything still unmeasured, each step capped, ~9.5 minutes.
#   OUT=/tmp/out bash ci/gpu/final.sh
TARBALL=final.tgz
source "$(dirname "$0")/steps.sh"
[ -f ci/gpu/kernels_sanitize.sh ] && step sanitize 60 bash ci/gpu/kernels_sanitize.sh
step kernels 190 python3 ci/gpu/kernels.py
step idle 120 python3 ci/gpu/idle_meter.py
step gate_aa 100 python3 ci/gpu/gate_aa.py --budget-s 70 --rounds 3
step host_gpus 30 python3 ci/gpu/host_gpus.py
step decode 80 python3 ci/gpu/decode_modes.py --contexts 4096,65536 --verify triton --modes gpu/full,cpu/verify-graph --no-lossless
