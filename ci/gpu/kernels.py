"""Issue 4: the custom CUDA tree-verify kernels on the H200 — build, correctness, timing.

    OUT=/tmp/out PYTHONPATH=. python3 ci/gpu/kernels.py          # from the repo root

Needs torch (CUDA), nvcc + ninja (torch's extension builder), Triton, pytest and the repo; fits
`timeout 150` on an H200 including the first compile (~18 s; OPTIONAL_S / HARD_S below). Steps:
  1. Build kernels/verify/verify_attention.cu for this GPU (timed; cache in a fresh temp dir so the
     compile is really measured). Register / spill report: tests/kernels/test_kernels_compile.py.
  2. Ceilings measured here: device copy bandwidth and bf16 matmul rate.
  3. Correctness: pytest tests/kernels/test_custom_verify_gpu.py (every variant vs float64: contiguous,
     paged 16 and 1, MLA; d 64/128; groups 1/4/8; T 1/16/64/65/128; batch 2 with different
     lengths; split and warp counts; CUDA-graph capture without host syncs).
  4. Timing through the kernel workload's own code (harness/worker/workloads/kernel.py: a check against
     float64 before any timing, CUDA-graph replays over input sets > 3x L2, median of 20):
     GQA 32/8 d128, T 16 and 64, contexts 16384, 65536, 131072: custom (mma.sync), triton, sdpa
     (KERNELS_FLEX=1 adds flex at 65536 T 16: a 17 s compile); MLA 8 heads T 16 at 65536 (custom,
     sdpa: the Triton baseline does not fit MLA in shared memory); paged custom (page 16) at 65536.
     The table is printed.
  5. Hopper: custom-wg (S = QK^T on wgmma) at 65536 (GQA T 16/64, MLA), after the table, so that
     a fault there cannot spoil the rows above.
  6. If time is left: page size 1, a num_splits sweep, one kernel cell end to end through
     `python -m harness.worker`; the table is printed again.
For a fault, ci/gpu/kernels_sanitize.sh runs one call each under compute-sanitizer memcheck.
Writes $OUT/kernels.json (after every point) and the table (µs, TB/s, % of roofline, custom's speedup).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

OUT = os.environ.get("OUT", "gpu-out")
os.makedirs(OUT, exist_ok=True)
os.environ.setdefault("HARNESS_CACHE_DIR", tempfile.mkdtemp(prefix="tva-cache-"))
T0 = time.perf_counter()
# The whole run must fit `timeout 150`: optional work (page size 1, the split sweep, the worker
# cell) starts only before OPTIONAL_S, and nothing new starts after HARD_S.
DEADLINE_S = OPTIONAL_S = 105
SWEEP_S = 100             # the split sweep matters least: it starts only before this
HARD_S = 132
PYTEST_S = 40
FLEX = os.environ.get("KERNELS_FLEX") == "1"
DEV = torch.device("cuda")
REPEATS, WARMUP = 20, 3
RESULTS: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                 "cuda": torch.version.cuda, "timings": [], "errors": {}}


def log(*a):
    print(f"[{time.perf_counter() - T0:6.1f}s]", *a, file=sys.stderr, flush=True)


def save():
    with open(os.path.join(OUT, "kernels.json"), "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)


# -- 1. build ----------------------------------------------------------------------------------
from harness.kernels import build  # noqa: E402
from harness.kernels.verify import custom_verify as cv
from harness.worker.workloads import kernel as kw  # noqa: E402

t = time.perf_counter()
build.load_library()
RESULTS["build_s"] = round(time.perf_counter() - t, 1)
log("built in", RESULTS["build_s"], "s")
# (register / spill report: tests/kernels/test_kernels_compile.py, on the CPU host, with nvcc -Xptxas -v)

# -- 2. ceilings -------------------------------------------------------------------------------
copy_bw, mm_rate = kw.ceilings(DEV, torch.bfloat16)
RESULTS["copy_tbps"], RESULTS["matmul_tflops"] = copy_bw / 1e12, mm_rate / 1e12
log(f"ceilings: copy {copy_bw / 1e12:.2f} TB/s, bf16 matmul {mm_rate / 1e12:.0f} TFLOP/s")

# -- 3. correctness ----------------------------------------------------------------------------
t = time.perf_counter()
try:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                           "tests/kernels/test_custom_verify_gpu.py"], capture_output=True, text=True, timeout=PYTEST_S)
    RESULTS["pytest"] = {"rc": proc.returncode, "s": round(time.perf_counter() - t, 1),
                         "tail": proc.stdout[-3000:] + proc.stderr[-2000:]}
except subprocess.TimeoutExpired as exc:
    RESULTS["pytest"] = {"rc": "timeout", "s": round(time.perf_counter() - t, 1),
                         "tail": (exc.stdout or b"")[-3000:].decode(errors="replace") + f"\ntimed out after {PYTEST_S} s"}
log("pytest rc", RESULTS["pytest"]["rc"], RESULTS["pytest"]["tail"].strip().splitlines()[-1] if RESULTS["pytest"]["tail"].strip() else "")
save()


# -- 4. timing ---------------------------------------------------------------------------------
def gqa(ctx, T):
    return kw.Point("gqa", 1, ctx, T, 32, 8, 128, 128, "contiguous", 16)


def time_point(pt: kw.Point, modes, label: str, **custom_kwargs):
    """Check each mode against float64, then time it on shared input sets."""
    if time.perf_counter() - T0 > HARD_S:
        log(f"{label}: skipped (past {HARD_S} s)")
        return None
    elem = 2
    roofline_us = max(pt.bytes(elem) / copy_bw, pt.flops() / mm_rate) * 1e6
    sets = kw.input_sets(pt, DEV, torch.bfloat16, seed=1000)
    row = {"label": label, "point": pt.__dict__, "roofline_us": roofline_us,
           "bytes": pt.bytes(elem), "flops": pt.flops(), "modes": {}}
    for mode in modes:
        # "custom-wg": the custom kernel with S = Q K^T on wgmma (custom_verify's impl argument).
        run_mode = "custom" if mode == "custom-wg" else mode
        impl = "wgmma" if mode == "custom-wg" else "mma"
        try:
            err = kw.check(run_mode, pt, DEV, torch.bfloat16, seed=7919, custom_impl=impl)
            if run_mode == "custom" and custom_kwargs:
                calls = [_custom_call(pt, s, impl=impl, **custom_kwargs) for s in sets]
                samples, graph = kw.time_calls(calls, REPEATS, WARMUP, DEV)
            else:
                samples, graph = kw.measure_mode(run_mode, pt, sets, {"repeats": REPEATS, "warmup_steps": WARMUP}, DEV,
                                                 custom_impl=impl)
            us = statistics.median(samples)
            row["modes"][mode] = {"us": us, "spread_us": statistics.median(abs(x - us) for x in samples),
                                  "tbps": pt.bytes(elem) / us / 1e6, "pct_roofline": 100 * roofline_us / us,
                                  "rel_error": err, "graph": graph}
            log(f"{label:28s} {mode:7s} {us:9.1f} us  {100 * roofline_us / us:5.1f} % roofline  err {err:.1e}")
        except Exception as exc:
            row["modes"][mode] = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
            log(f"{label:28s} {mode:7s} ERROR {type(exc).__name__}: {str(exc)[:200]}")
            if DEV.type == "cuda":
                try:
                    torch.cuda.synchronize()
                except Exception:        # a sticky CUDA error: the next calls will say so
                    pass
    if pt.attention == "gqa" and "custom" in modes:
        row["custom_plan"] = cv.plan(sets[0]["q"], pt.kv_heads, sets[0]["k"].shape[2], pt.layout == "paged")
    RESULTS["timings"].append(row)
    del sets
    torch.cuda.empty_cache()
    save()
    return row


def _custom_call(pt, s, **kwargs):
    if pt.layout == "paged":
        return lambda: cv.tree_verify_attention_paged(s["q"], s["k"], s["v"], s["page_table"], s["lengths"],
                                                      s["bits"], **kwargs)
    return lambda: cv.tree_verify_attention(s["q"], s["k"], s["v"], s["lengths"], s["bits"], **kwargs)


have_triton = True
try:
    from harness.kernels.verify import triton_verify  # noqa: F401
except Exception as exc:
    have_triton = False
    RESULTS["errors"]["triton_import"] = str(exc)
HOPPER = torch.cuda.get_device_capability() == (9, 0)
# custom-wg (wgmma, never run on hardware yet) is timed last, after the table has been printed
# once: a fault there makes the CUDA context unusable for everything after it.
base = ["custom"] + (["triton"] if have_triton else []) + ["sdpa"]


def optional() -> bool:
    return time.perf_counter() - T0 < OPTIONAL_S


for T in (16, 64):
    for ctx in (16384, 65536, 131072):
        flex = ["flex"] if FLEX and ctx == 65536 and T == 16 else []
        time_point(gqa(ctx, T), base + flex, f"gqa T={T} ctx={ctx}")

mla = kw.Point("mla", 1, 65536, 16, 8, 1, 576, 512, "contiguous", 16)
time_point(mla, ["custom", "sdpa"], "mla H=8 T=16 ctx=65536")
time_point(kw.Point("gqa", 1, 65536, 16, 32, 8, 128, 128, "paged", 16), ["custom"], "paged ps=16 T=16 ctx=65536")
RESULTS["wall_s"] = round(time.perf_counter() - T0, 1)
save()

# -- table -------------------------------------------------------------------------------------
def print_table():
    print(f"\n{RESULTS['gpu']}  torch {RESULTS['torch']}  build {RESULTS['build_s']} s  "
          f"copy {RESULTS['copy_tbps']:.2f} TB/s  matmul {RESULTS['matmul_tflops']:.0f} TFLOP/s  "
          f"pytest rc={RESULTS['pytest']['rc']} ({RESULTS['pytest']['tail'].strip().splitlines()[-1][:80] if RESULTS['pytest']['tail'].strip() else ''})")
    COLUMNS = ("custom", "custom-wg", "triton", "sdpa", "flex")
    print(f"{'point':30s} {'roof µs':>8s} | " + " | ".join(f"{m:>22s}" for m in COLUMNS))
    for row in RESULTS["timings"]:
        cells = []
        cu = row["modes"].get("custom", {}).get("us")
        for m in COLUMNS:
            r = row["modes"].get(m)
            if r is None:
                cells.append(f"{'':>22s}")
            elif "error" in r:
                cells.append(f"{'ERR ' + r['error'][:17]:>22s}")
            else:
                extra = f" x{r['us'] / cu:4.1f}" if cu and m != "custom" else f" {r['tbps']:4.2f}TB"
                cells.append(f"{r['us']:8.1f}us {r['pct_roofline']:4.0f}%{extra:>7s}")
        print(f"{row['label']:30s} {row['roofline_us']:8.1f} | " + " | ".join(cells))
    print("(per mode: µs, % of roofline, then TB/s for custom or custom's speedup over that mode; "
          "custom-wg = custom with S = QK^T on wgmma)")
    worker = RESULTS.get("worker_cell", {"status": "not run yet"})
    print("worker cell:", worker.get("status"), json.dumps(
        {k: round(v, 3) for k, v in (worker.get("metrics") or {}).items()
         if k in ("kernel_us", "pct_roofline", "achieved_tbps", "speedup_vs_sdpa")}))
    print(f"wall {RESULTS['wall_s']} s; JSON: {os.path.join(OUT, 'kernels.json')}")


print_table()

# -- 5. the wgmma variant (Hopper), after the table: see `base` -------------------------------------
if HOPPER:
    for label, pt in (("wg gqa T=16 ctx=65536", gqa(65536, 16)), ("wg gqa T=64 ctx=65536", gqa(65536, 64)),
                      ("wg mla H=8 T=16 ctx=65536", mla)):
        if time.perf_counter() - T0 < HARD_S - 12:
            time_point(pt, ["custom-wg"], label)

# -- 6. if time is left: page size 1, the split sweep, one cell through the worker -------------------
if optional():
    time_point(kw.Point("gqa", 1, 65536, 16, 32, 8, 128, 128, "paged", 1), ["custom"], "paged ps=1 T=16 ctx=65536")
for T in (16, 64):               # the plan's choices against neighbours
    if time.perf_counter() - T0 >= SWEEP_S:
        break
    pl = cv.plan(torch.empty(1, 32, T, 128, device=DEV, dtype=torch.bfloat16), 8, 65536 + T, False)
    for splits in sorted({max(1, pl["num_splits"] // 2), pl["num_splits"] * 2}):
        if time.perf_counter() - T0 < SWEEP_S:
            time_point(gqa(65536, T), ["custom"], f"sweep T={T} splits={splits}", num_splits=splits)

# one kernel cell end to end (a fresh process: unaffected by a fault above)
cell = {"workload": "kernel", "device": "cuda", "dtype": "bfloat16", "verify_mode": "custom",
        "context_length": 16384, "tree_tokens": 16, "compare_modes": "sdpa", "repeats": 10}
try:
    left = HARD_S + 10 - (time.perf_counter() - T0)
    if left < 15:
        raise TimeoutError(f"skipped: {left:.0f} s left")
    proc = subprocess.run([sys.executable, "-m", "harness.worker"], input=json.dumps(cell),
                          capture_output=True, text=True, timeout=left)
    res = json.loads(proc.stdout)
    RESULTS["worker_cell"] = {"status": res["status"], "error": res["error"], "metrics": res["metrics"],
                              "kernel": res.get("kernel")}
except Exception as exc:
    RESULTS["worker_cell"] = {"status": "crashed", "error": f"{type(exc).__name__}: {exc}"}
log("worker cell:", RESULTS["worker_cell"].get("status"), (RESULTS["worker_cell"].get("error") or "")[:300])
RESULTS["wall_s"] = round(time.perf_counter() - T0, 1)
save()

print_table()
