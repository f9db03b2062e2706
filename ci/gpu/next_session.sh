#!/usr/bin/env bash
# The first GPU call of the next session with device time: measure what was built without a GPU
# (fused forward, Triton top-k, CUDA tree build, decode-cell profiling overhead) and re-run the
# issue-3 slice with it. About 9 minutes on an H200 (estimate); each step capped; one tarball back.
#   OUT=/tmp/out bash ci/gpu/next_session.sh
TARBALL=next.tgz
source "$(dirname "$0")/steps.sh"
step fused_ops 90 python3 ci/gpu/fused_ops.py
step topk 90 python3 ci/gpu/topk.py
step tree_build_cuda 120 python3 ci/gpu/tree_build_cuda.py
# The issue-3 slice with every kernel that was off by default (fused forward, Triton top-k,
# CUDA tree build), lossless check included; then the defaults at 4096 for the A/B.
NEW=fused_ops=true,topk_impl=triton,tree_build_impl=cuda
step decode_new 240 env OUT="$OUT/new" python3 ci/gpu/decode_modes.py --impl $NEW --contexts 4096,16384,65536 --verify triton --modes gpu/full,cpu/verify-graph
step decode_default 60 env OUT="$OUT/default" python3 ci/gpu/decode_modes.py --contexts 4096 --verify triton --modes gpu/full --no-lossless
step idle 150 python3 ci/gpu/idle_meter.py
