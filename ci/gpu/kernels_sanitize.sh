#!/usr/bin/env bash
# Issue 4: run the custom verify kernels once each under compute-sanitizer memcheck, so a
# misaligned or out-of-bounds access is reported with its kernel and file:line.
#
#   PYTHONPATH=. bash ci/gpu/kernels_sanitize.sh        # from the repo root, on the GPU host
#
# Builds a debug variant (HARNESS_KERNEL_DEBUG=1: -lineinfo as always, and launchers that wait
# for each kernel so a fault is pinned to its launch; its own cache entry), then, one process
# each: GQA 32/8 d128 T16 ctx 4096 contiguous; MLA 8 heads T16 ctx 4096; GQA paged page 16.
# Inputs are made on the CPU and copied over, so memcheck instruments little besides our
# kernels. Each call is also checked against the float64 reference. Under 60 s in all (each
# case gets what is left of 57 s, and is skipped below 10); exit status 1 if any case failed.
set -u
export PYTHONPATH="${PYTHONPATH:-.}"
export HARNESS_KERNEL_DEBUG=1
export HARNESS_CACHE_DIR="${HARNESS_CACHE_DIR:-$(mktemp -d -t tva-san-XXXXXX)}"
SAN="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
START=$SECONDS

CASE_PY='
import math, sys, time, torch
from harness.kernels import build, custom_verify as cv, verify_reference as ref
from harness.worker.workloads import kernel as kw

which = sys.argv[1]
if which == "build":
    t = time.perf_counter(); build.load_library()
    print(f"debug build ({build.nvcc_flags()}) in {time.perf_counter() - t:.1f} s", flush=True)
    sys.exit(0)
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

echo "== build (HARNESS_KERNEL_DEBUG=1, cache $HARNESS_CACHE_DIR)"
python3 -c "$CASE_PY" build || { echo "build failed"; exit 1; }

if [ ! -x "$SAN" ]; then
    echo "compute-sanitizer not found (PATH or /usr/local/cuda/bin): running the cases without it"
    SAN=""
fi
status=0
for case in gqa mla paged; do
    left=$((57 - (SECONDS - START)))
    if [ "$left" -lt 10 ]; then
        echo "== $case: skipped (time)"
        status=1
        continue
    fi
    echo "== $case under ${SAN:+compute-sanitizer memcheck}"
    if [ -n "$SAN" ]; then
        timeout "$left" "$SAN" --tool memcheck --print-limit 5 --error-exitcode 9 --show-backtrace device \
            python3 -c "$CASE_PY" "$case" > "$HARNESS_CACHE_DIR/$case.log" 2>&1
        rc=$?
    else
        timeout "$left" python3 -c "$CASE_PY" "$case" > "$HARNESS_CACHE_DIR/$case.log" 2>&1
        rc=$?
    fi
    grep -v "^========= *$" "$HARNESS_CACHE_DIR/$case.log" | head -60
    echo "== $case: rc $rc"
    [ "$rc" -eq 0 ] || status=1
done
echo "== total $((SECONDS - START)) s"
exit $status
