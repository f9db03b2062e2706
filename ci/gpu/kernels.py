"""Issue 4: the custom CUDA tree-verify kernels on the H200 — build, correctness, timing.

    OUT=/tmp/out PYTHONPATH=. python3 ci/gpu/kernels.py          # from the repo root

Needs torch (CUDA), nvcc + ninja (torch's extension builder), Triton, pytest and the repo; about
3-4 minutes on an H200 including the first compile. Steps:
  1. Build kernels/verify_attention.cu for this GPU (timed; cache in a fresh temp dir so the
     compile is really measured) and record the kernels' register / spill report (nvcc -Xptxas -v).
  2. Ceilings measured here: device copy bandwidth and bf16 matmul rate.
  3. Correctness: pytest tests/test_custom_verify_gpu.py (every variant vs float64: contiguous,
     paged 16 and 1, MLA; d 64/128; groups 1/4/8; T 1/16/64/65/128; batch 2 with different
     lengths; split and warp counts; CUDA-graph capture without host syncs).
  4. Timing through the kernel workload's own code (harness/workloads/kernel.py: a check against
     float64 before any timing, CUDA-graph replays over input sets > 3x L2, median of 20):
     GQA 32/8 d128, T 16 and 64, contexts 4096..131072: custom (mma.sync), custom-wg (S = QK^T
     on wgmma, Hopper only), triton, sdpa (flex at 65536 only: each shape is a fresh compile); MLA 8 heads T 16 at 65536 (all four);
     paged custom (page 16 and 1) at 65536; a num_splits and num_warps sweep of custom.
  5. One kernel cell end to end through `python -m harness.worker`.
Writes $OUT/kernels.json and prints the table last (µs, TB/s, % of roofline, custom's speedup).
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
DEADLINE_S = 170          # optional work (flex compiles, sweeps) is skipped after this
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
from harness.kernels import build, custom_verify as cv  # noqa: E402
from harness.workloads import kernel as kw  # noqa: E402

t = time.perf_counter()
build.load_library()
RESULTS["build_s"] = round(time.perf_counter() - t, 1)
log("built in", RESULTS["build_s"], "s")
try:
    major, minor = torch.cuda.get_device_capability()
    proc = subprocess.run(["nvcc", "-cubin", f"-arch=sm_{major}{minor}", *build.NVCC_FLAGS, "-Xptxas", "-v",
                           str(build.SOURCE), "-o", os.path.join(tempfile.gettempdir(), "tva.cubin")],
                          capture_output=True, text=True, timeout=120)
    RESULTS["ptxas"] = [ln.strip() for ln in proc.stderr.splitlines()
                        if "Compiling entry" in ln or "registers" in ln or "spill" in ln]
except Exception as exc:  # the report is a nicety; the build above is what counts
    RESULTS["ptxas"] = [f"unavailable: {exc}"]

# -- 2. ceilings -------------------------------------------------------------------------------
copy_bw, mm_rate = kw.ceilings(DEV, torch.bfloat16)
RESULTS["copy_tbps"], RESULTS["matmul_tflops"] = copy_bw / 1e12, mm_rate / 1e12
log(f"ceilings: copy {copy_bw / 1e12:.2f} TB/s, bf16 matmul {mm_rate / 1e12:.0f} TFLOP/s")

# -- 3. correctness ----------------------------------------------------------------------------
t = time.perf_counter()
proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                       "tests/test_custom_verify_gpu.py"], capture_output=True, text=True, timeout=150)
RESULTS["pytest"] = {"rc": proc.returncode, "s": round(time.perf_counter() - t, 1),
                     "tail": proc.stdout[-3000:] + proc.stderr[-2000:]}
log("pytest rc", proc.returncode, proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "")
save()


# -- 4. timing ---------------------------------------------------------------------------------
def gqa(ctx, T):
    return kw.Point("gqa", 1, ctx, T, 32, 8, 128, 128, "contiguous", 16)


def time_point(pt: kw.Point, modes, label: str, **custom_kwargs):
    """Check each mode against float64, then time it on shared input sets."""
    elem = 2
    roofline_us = max(pt.bytes(elem) / copy_bw, pt.flops() / mm_rate) * 1e6
    sets = kw.input_sets(pt, DEV, torch.bfloat16, seed=1000)
    row = {"label": label, "point": pt.__dict__, "roofline_us": roofline_us,
           "bytes": pt.bytes(elem), "flops": pt.flops(), "modes": {}}
    for mode in modes:
        # "custom-wg": the custom kernel with S = Q K^T on wgmma (HARNESS_TVA_IMPL, see custom_verify).
        run_mode = "custom" if mode == "custom-wg" else mode
        if mode == "custom-wg":
            os.environ["HARNESS_TVA_IMPL"] = "wgmma"
        try:
            err = kw.check(run_mode, pt, DEV, torch.bfloat16, seed=7919)
            if run_mode == "custom" and custom_kwargs:
                calls = [_custom_call(pt, s, **custom_kwargs) for s in sets]
                samples, graph = kw.time_calls(calls, REPEATS, WARMUP, DEV)
            else:
                samples, graph = kw.measure_mode(run_mode, pt, sets, {"repeats": REPEATS, "warmup_steps": WARMUP}, DEV)
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
        finally:
            os.environ.pop("HARNESS_TVA_IMPL", None)
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
    from harness.kernels import triton_verify  # noqa: F401
except Exception as exc:
    have_triton = False
    RESULTS["errors"]["triton_import"] = str(exc)
HOPPER = torch.cuda.get_device_capability() == (9, 0)
base = ["custom"] + (["custom-wg"] if HOPPER else []) + (["triton"] if have_triton else []) + ["sdpa"]

for T in (16, 64):
    for ctx in (4096, 8192, 16384, 32768, 65536, 131072):
        flex = ["flex"] if ctx == 65536 and time.perf_counter() - T0 < DEADLINE_S else []
        time_point(gqa(ctx, T), base + flex, f"gqa T={T} ctx={ctx}")

mla = kw.Point("mla", 1, 65536, 16, 8, 1, 576, 512, "contiguous", 16)
time_point(mla, base + (["flex"] if time.perf_counter() - T0 < DEADLINE_S else []), "mla H=8 T=16 ctx=65536")
for ps in (16, 1):
    time_point(kw.Point("gqa", 1, 65536, 16, 32, 8, 128, 128, "paged", ps), ["custom"] + (["custom-wg"] if HOPPER else []),
               f"paged ps={ps} T=16 ctx=65536")

for T in (16, 64):               # the plan's choices against neighbours
    pl = cv.plan(torch.empty(1, 32, T, 128, device=DEV, dtype=torch.bfloat16), 8, 65536 + T, False)
    for splits in sorted({max(1, pl["num_splits"] // 2), pl["num_splits"] * 2, 132 // (8 * pl["m_blocks"]) or 1}):
        if time.perf_counter() - T0 < DEADLINE_S:
            time_point(gqa(65536, T), ["custom"], f"sweep T={T} splits={splits}", num_splits=splits)
    for warps in (4, 8):
        if warps != pl["num_warps"] and time.perf_counter() - T0 < DEADLINE_S:
            time_point(gqa(65536, T), ["custom"], f"sweep T={T} warps={warps}", num_warps=warps)

# -- 5. one cell through the worker ----------------------------------------------------------------
cell = {"workload": "kernel", "device": "cuda", "dtype": "bfloat16", "verify_mode": "custom",
        "context_length": 16384, "tree_tokens": 16, "compare_modes": "sdpa", "repeats": 10}
try:
    proc = subprocess.run([sys.executable, "-m", "harness.worker"], input=json.dumps(cell),
                          capture_output=True, text=True, timeout=120)
    res = json.loads(proc.stdout)
    RESULTS["worker_cell"] = {"status": res["status"], "error": res["error"], "metrics": res["metrics"],
                              "kernel": res.get("kernel")}
except Exception as exc:
    RESULTS["worker_cell"] = {"status": "crashed", "error": f"{type(exc).__name__}: {exc}"}
log("worker cell:", RESULTS["worker_cell"].get("status"), (RESULTS["worker_cell"].get("error") or "")[:300])
RESULTS["wall_s"] = round(time.perf_counter() - T0, 1)
save()

# -- table -------------------------------------------------------------------------------------
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
print("worker cell:", RESULTS["worker_cell"].get("status"), json.dumps(
    {k: round(v, 3) for k, v in (RESULTS["worker_cell"].get("metrics") or {}).items()
     if k in ("kernel_us", "pct_roofline", "achieved_tbps", "speedup_vs_sdpa")}))
print(f"wall {RESULTS['wall_s']} s; JSON: {os.path.join(OUT, 'kernels.json')}")
