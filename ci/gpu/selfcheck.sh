#!/usr/bin/env bash
# The GPU self-check, on a GPU host: every GPU correctness test, then the CUDA C++ kernels under
# compute-sanitizer memcheck. Exit status 0 only if both pass.
#
#   bash ci/gpu/selfcheck.sh [pytest args...]         # from anywhere; runs from the repo root
#
# 1. `python -m pytest -m gpu -q` (the tests marked gpu: tests/kernels/*_gpu.py,
#    tests/decode/*_gpu.py, tests/worker/*_gpu.py, tests/remote/*_gpu.py and the graph tests of
#    tests/decode/test_decoder_reuse.py; about 3 minutes on an H200). Extra arguments go to
#    pytest, e.g. `-x` or `-k topk`.
# 2. compute-sanitizer memcheck, so a misaligned or out-of-bounds access is reported with its
#    kernel and file:line: a debug build (HARNESS_KERNEL_DEBUG=1: -lineinfo as always, and
#    launchers that wait for each kernel so a fault is pinned to its launch; its own cache
#    entry), then one process each: the verify kernel at GQA 32/8 d128 T16 ctx 4096 contiguous,
#    MLA 8 heads T16 ctx 4096, GQA paged (page 16), and the CUDA tree build (N 256, D 15). Inputs
#    are made on the CPU and copied over, so memcheck instruments little besides our kernels;
#    each result is also checked (verify: against the float64 reference; tree: against the
#    torch build). Each case gets what is left of SANITIZE_S seconds, and is skipped (a failure)
#    below 10. Without compute-sanitizer (PATH or /usr/local/cuda/bin) the cases run bare.
#
# Timing is not checked here: the kernel families are timed by the harness's workloads
# (scenarios/ops.yaml, scenarios/kernels.yaml, scenarios/decode-modes.yaml).
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
status=0

echo "== pytest -m gpu"
"$PY" -m pytest -m gpu -q "$@" || status=1

# -- compute-sanitizer ----------------------------------------------------------------------------
SANITIZE_S=${SANITIZE_S:-100}
export HARNESS_KERNEL_DEBUG=1
export HARNESS_CACHE_DIR="${HARNESS_CACHE_DIR:-$(mktemp -d -t tva-san-XXXXXX)}"
SAN="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
START=$SECONDS

CASE_PY='
import math, sys, time, torch
from harness.kernels import build
from harness.kernels.verify import custom_verify as cv, verify_reference as ref
from harness.worker.workloads import kernel as kw

which = sys.argv[1]
if which == "build":
    t = time.perf_counter()
    build.load_library()
    build.load_library(source=build.TREE_BUILD_SOURCE)
    print(f"debug builds ({build.nvcc_flags()}) in {time.perf_counter() - t:.1f} s", flush=True)
    sys.exit(0)
if which == "tree":
    from harness.decode.tree_gpu import GpuTree, build_tree_gpu, topk_logprobs_batched
    N, D = 256, 15
    logits = torch.randn(2, D, 151936, generator=torch.Generator().manual_seed(0))
    lp, ids = (t.to("cuda") for t in topk_logprobs_batched(logits, N))
    got = build_tree_gpu(lp, ids, N, impl="cuda")
    torch.cuda.synchronize()
    want = build_tree_gpu(lp.cpu(), ids.cpu(), N, impl="torch")
    bad = [f for f in ("tokens", "depths", "parents", "first_child", "next_sibling", "visibility",
                       "bits", "scores") if not torch.equal(getattr(got, f).cpu(), getattr(want, f))]
    verdict = "WRONG" if bad else "ok"
    print(f"tree: ran, fields differing from the torch build: {bad or None} ({verdict})", flush=True)
    sys.exit(3 if bad else 0)
pt = {"gqa": kw.Point("gqa", 1, 4096, 16, 32, 8, 128, 128, "contiguous", 16),
      "mla": kw.Point("mla", 1, 4096, 16, 8, 1, 576, 512, "contiguous", 16),
      "paged": kw.Point("gqa", 1, 4096, 16, 32, 8, 128, 128, "paged", 16)}[which]
cpu = kw.make_inputs(pt, [pt.context], 0, torch.device("cpu"), torch.bfloat16,
                     tree_boost=kw.check_boost(pt.context))
dev = {k: v.to("cuda") if torch.is_tensor(v) else v for k, v in cpu.items()}
plan = cv.plan(dev["q"], pt.kv_heads,
               dev["page_table"].shape[1] * pt.page_size if pt.layout == "paged" else dev["k"].shape[2],
               pt.layout == "paged", mla=pt.mla)
print(f"{which}: plan {plan}", flush=True)
out = kw.prepare("custom", pt, dev)()
torch.cuda.synchronize()
err = ref.relative_error(out.cpu(), kw.reference(pt, cpu))
verdict = "ok" if err <= kw.TOLERANCE else "WRONG"
print(f"{which}: ran, relative error vs float64 {err:.2e} ({verdict})", flush=True)
sys.exit(0 if err <= kw.TOLERANCE else 3)
'

echo "== compute-sanitizer: debug builds (HARNESS_KERNEL_DEBUG=1, cache $HARNESS_CACHE_DIR)"
if ! "$PY" -c "$CASE_PY" build; then
    echo "debug build failed"
    exit 1
fi
if [ ! -x "$SAN" ]; then
    echo "compute-sanitizer not found (PATH or /usr/local/cuda/bin): running the cases without it"
    SAN=""
fi
for case in gqa mla paged tree; do
    left=$((SANITIZE_S - 3 - (SECONDS - START)))
    if [ "$left" -lt 10 ]; then
        echo "== $case: skipped (time)"
        status=1
        continue
    fi
    echo "== $case under ${SAN:+compute-sanitizer memcheck}"
    if [ -n "$SAN" ]; then
        timeout "$left" "$SAN" --tool memcheck --print-limit 5 --error-exitcode 9 --show-backtrace device \
            "$PY" -c "$CASE_PY" "$case" > "$HARNESS_CACHE_DIR/$case.log" 2>&1
        rc=$?
    else
        timeout "$left" "$PY" -c "$CASE_PY" "$case" > "$HARNESS_CACHE_DIR/$case.log" 2>&1
        rc=$?
    fi
    grep -v "^========= *$" "$HARNESS_CACHE_DIR/$case.log" | head -60
    echo "== $case: rc $rc"
    [ "$rc" -eq 0 ] || status=1
done
echo "== sanitizer total $((SECONDS - START)) s; selfcheck status $status"
exit $status
