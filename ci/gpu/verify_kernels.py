"""Issue 3: the Triton tree-verify kernel and the flex reference on a GPU (bf16).

    OUT=/tmp/out PYTHONPATH=. python3 ci/gpu/verify_kernels.py       # from the repo root

Needs torch (CUDA), Triton and the repo; under 3 minutes on an H200. Shapes: qwen3-8b attention
(GQA 32/8, d=128), T = 1 + N tree tokens in {16, 65}, committed prefix 4096 / 16384 / 65536,
batch 1 and a batch of 2 with different lengths; KV read through a view of a bigger cache buffer
as the model does.
1. Correctness of triton, flex (and SDPA) against a float64 dense-softmax reference, rel err
   <= 1e-2. Tree keys are scaled up so the tree part carries real weight even next to 65k
   prefix keys (else a tree-mask bug would hide below the tolerance).
2. The triton kernel in a CUDA graph: no host sync (sync debug mode "error"), and replays with
   new q / lengths / tree bits equal eager calls.
3. Timing (CUDA events, median; input sets rotated so that more than 2x L2 is touched between
   two uses of one set; a GPU sleep ahead of the timed calls hides host launch time) of triton vs
   SDPA with a bool mask vs compiled flex, with % of roofline = max(KV bytes / 4.3e12,
   FLOPs / 790e12) (measured on the H200). Then a num_splits sweep and, time permitting, a small tile
   config sweep of the triton kernel (what plan() should pick).
Writes $OUT/verify_kernels.json and prints the table last. flex compile failures (measured on the H200;
saw one at 64 tree tokens) are recorded as errors in their cells, not crashes.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from harness.decode.attention import visibility_bits
from harness.kernels.verify import verify_reference
from harness.decode.flex_verify import flex_block_mask, flex_tree_verify
from harness.kernels.verify import triton_verify

OUT = os.environ.get("OUT", "gpu-out")
HQ, HKV, D = 32, 8, 128
DTYPE = torch.bfloat16
TREE_TOKENS = (16, 65)
CONTEXTS = (4096, 16384, 65536)
BW, FLOPS = 4.3e12, 790e12            # roofline constants measured on the H200
L2_BYTES = 60e6
TOL = 1e-2
DEADLINE_S = 165                       # stop optional work (flex compiles, sweeps) after this
T0 = time.perf_counter()
DEV = torch.device("cuda")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def elapsed() -> float:
    return time.perf_counter() - T0


TREE_GEN = torch.Generator().manual_seed(1)       # trees are drawn on the host


def random_tree(b: int, T: int, gen: torch.Generator = TREE_GEN) -> torch.Tensor:
    """[b, T, T] ancestors-and-self visibility of a random tree, parents before children."""
    return verify_reference.random_tree(b, T, gen)


def make_set(lengths: list[int], T: int, gen: torch.Generator) -> dict:
    """One input set: q [b, 32, T, 128] (a transposed view, as the model passes it); k, v views
    [:, :, :S] of a cache buffer with spare slots; tree keys scaled x6 so they matter."""
    b, S = len(lengths), max(lengths) + T
    q = torch.randn(b, T, HQ, D, generator=gen, device=DEV).to(DTYPE).transpose(1, 2)
    k_buf = torch.randn(b, HKV, S + 64, D, generator=gen, device=DEV).to(DTYPE)
    v_buf = torch.randn(b, HKV, S + 64, D, generator=gen, device=DEV).to(DTYPE)
    for i, L in enumerate(lengths):
        k_buf[i, :, L:L + T] *= 6
    return dict(q=q, k=k_buf[:, :, :S], v=v_buf[:, :, :S])


def reference(s: dict, lengths: list[int], vis: torch.Tensor) -> torch.Tensor:
    q, k, v = s["q"], s["k"], s["v"]
    b, _, T, _ = q.shape
    G = HQ // HKV
    out = torch.empty(b, HQ, T, D, dtype=torch.float64, device=DEV)
    for i, L in enumerate(lengths):
        qq = q[i].double().reshape(HKV, G * T, D)                  # rows g * T + t per KV head
        kk, vv = k[i, :, :L + T].double(), v[i, :, :L + T].double()
        visible = torch.cat([torch.ones(T, L, dtype=torch.bool, device=DEV), vis[i]], 1)
        sc = (qq @ kk.transpose(1, 2)) / math.sqrt(D)
        sc = sc.view(HKV, G, T, L + T).masked_fill(~visible, float("-inf"))
        out[i] = (sc.softmax(-1).view(HKV, G * T, L + T) @ vv).view(HQ, T, D)
    return out


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


def dense_mask(lengths_t: torch.Tensor, vis: torch.Tensor, S: int) -> torch.Tensor:
    b, T, _ = vis.shape
    j = torch.arange(S, device=DEV)
    rel = j[None, :] - lengths_t.long()[:, None]
    tree = torch.gather(vis, 2, rel.clamp(0, T - 1)[:, None, :].expand(b, T, -1))
    return ((rel < 0)[:, None, :] | (((rel >= 0) & (rel < T))[:, None, :] & tree))[:, None]


# -- timing ---------------------------------------------------------------------------------------
_CYCLES_PER_US = None


def cycles_per_us() -> float:
    global _CYCLES_PER_US
    if _CYCLES_PER_US is None:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)
        s.record()
        torch.cuda._sleep(10_000_000)
        e.record()
        torch.cuda.synchronize()
        _CYCLES_PER_US = 10_000_000 / (s.elapsed_time(e) * 1e3)
    return _CYCLES_PER_US


def time_us(fn, sets: list[dict], reps: int = 30) -> float:
    """Median GPU time of fn(set) over `reps` calls rotating through `sets`. A sleep kernel ahead
    of the timed calls keeps the GPU busy while the host enqueues them, so the events measure the
    kernels and not the host's launch time."""
    for i in range(3):
        fn(sets[i % len(sets)])
    torch.cuda.synchronize()
    t = time.perf_counter()
    for i in range(5):
        fn(sets[i % len(sets)])
    host_us = (time.perf_counter() - t) / 5 * 1e6
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    torch.cuda._sleep(int(cycles_per_us() * min(200_000, host_us * reps * 1.5 + 200)))
    for i in range(reps):
        starts[i].record()
        fn(sets[i % len(sets)])
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))


def roofline(lengths: list[int], T: int) -> dict:
    keys = sum(L + T for L in lengths)
    kv_bytes = keys * HKV * D * 2 * DTYPE.itemsize      # k and v
    flops = 4 * HQ * T * keys * D                       # QK^T and PV
    return dict(kv_bytes=kv_bytes, flops=flops, roofline_us=max(kv_bytes / BW, flops / FLOPS) * 1e6)


# -- one shape ------------------------------------------------------------------------------------
def run_shape(T: int, lengths: list[int], gen: torch.Generator, with_flex: bool) -> dict:
    b, S = len(lengths), max(lengths) + T
    row = dict(T=T, lengths=lengths, batch=b, **roofline(lengths, T))
    set_bytes = 2 * b * HKV * (S + 64) * D * 2
    n_sets = max(2, min(24, math.ceil(2 * L2_BYTES / set_bytes) + 1))
    sets = [make_set(lengths, T, gen) for _ in range(n_sets)]
    row["input_sets"] = n_sets
    lengths_t = torch.tensor(lengths, dtype=torch.int32, device=DEV)
    vis = random_tree(b, T).to(DEV)
    bits = visibility_bits(vis)
    ref = reference(sets[0], lengths, vis)

    # triton: workspace and output allocated once, as the decode loop does
    p = triton_verify.plan(sets[0]["q"], sets[0]["k"])
    row["triton_num_splits"] = p["num_splits"]
    row["triton_plan"] = {k: p[k] for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "m_tiles")}
    ws = triton_verify.alloc_workspace(sets[0]["q"], sets[0]["k"])
    out = torch.empty(b, HQ, T, D, dtype=DTYPE, device=DEV)

    def triton_fn(s, ws=ws, splits=None):
        return triton_verify.tree_verify_attention(s["q"], s["k"], s["v"], lengths_t, bits,
                                                   num_splits=splits, out=out, workspace=ws)

    mask = dense_mask(lengths_t, vis, S)

    def sdpa_fn(s):
        return F.scaled_dot_product_attention(s["q"], s["k"], s["v"], attn_mask=mask, enable_gqa=True)

    methods = {"triton": triton_fn, "sdpa": sdpa_fn}
    if with_flex:
        try:
            bm = flex_block_mask(lengths_t, bits, T, S)
            methods["flex"] = lambda s: flex_tree_verify(s["q"], s["k"], s["v"], lengths_t, bits,
                                                         block_mask=bm)
        except Exception as e:
            row["flex_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    else:
        row["flex_error"] = "skipped: time budget"

    for name, fn in methods.items():
        try:
            t = time.perf_counter()
            got = fn(sets[0])
            torch.cuda.synchronize()
            row[f"{name}_first_call_s"] = round(time.perf_counter() - t, 2)
            err = rel_err(got, ref)
            row[f"{name}_rel_err"] = err
            row[f"{name}_ok"] = bool(err <= TOL and torch.isfinite(got).all())
            us = time_us(fn, sets)
            row[f"{name}_us"] = us
            row[f"{name}_pct_roofline"] = 100 * row["roofline_us"] / us
            if name == "triton":
                row["triton_tbps"] = row["kv_bytes"] / us / 1e6
        except Exception as e:           # one failing method must not hide the others
            row[f"{name}_ok"] = False
            row[f"{name}_error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
            log(f"  {name} T={T} lengths={lengths}: {row[f'{name}_error']}")

    # num_splits sweep (runtime argument: no recompile)
    if elapsed() < DEADLINE_S and row.get("triton_ok"):
        sweep = {}
        for splits in (4, 8, 16, 32, 64, 128):
            w = triton_verify.alloc_workspace(sets[0]["q"], sets[0]["k"], splits)
            sweep[splits] = time_us(lambda s: triton_fn(s, ws=w, splits=splits), sets, reps=20)
        row["triton_split_sweep_us"] = sweep
    del sets
    torch.cuda.empty_cache()
    return row


# -- graph capture --------------------------------------------------------------------------------
def graph_check(gen: torch.Generator) -> dict:
    T, lengths = 16, [16384, 9000]
    b, S = len(lengths), max(lengths) + T
    s = make_set(lengths, T, gen)
    q_static = s["q"].contiguous()
    lengths_t = torch.tensor(lengths, dtype=torch.int32, device=DEV)
    bits = visibility_bits(random_tree(b, T).to(DEV))
    ws = triton_verify.alloc_workspace(q_static, s["k"])
    out = torch.empty(b, HQ, T, D, dtype=DTYPE, device=DEV)

    def call():
        return triton_verify.tree_verify_attention(q_static, s["k"], s["v"], lengths_t, bits,
                                                   out=out, workspace=ws)

    res = {}
    call()                                              # compile outside the capture
    torch.cuda.synchronize()
    try:
        torch.cuda.set_sync_debug_mode("error")
        call()
        res["no_host_sync"] = True
    except RuntimeError as e:
        res["no_host_sync"] = False
        res["sync_error"] = str(e).splitlines()[0]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        call()
    checks = []
    for step, new_lengths in enumerate(([16384, 9000], [12000, 16380], [0, 5])):
        q_static.copy_(torch.randn(q_static.shape, generator=gen, device=DEV).to(DTYPE))
        lengths_t.copy_(torch.tensor(new_lengths, dtype=torch.int32))
        bits.copy_(visibility_bits(random_tree(b, T).to(DEV)))
        g.replay()
        replayed = out.clone()
        eager = triton_verify.tree_verify_attention(q_static, s["k"], s["v"], lengths_t, bits)
        torch.cuda.synchronize()
        checks.append(bool(torch.equal(replayed, eager)))
    res["replays_equal_eager"] = checks
    res["ok"] = res["no_host_sync"] and all(checks)
    return res


# -- other dtypes ---------------------------------------------------------------------------------
def dtype_check() -> list[dict]:
    """fp16 and fp32 (the lossless checks decode in fp32) at one shape, untimed."""
    global DTYPE
    rows, saved = [], DTYPE
    gen = torch.Generator(device=DEV).manual_seed(2)
    try:
        for dtype, tol in ((torch.float16, 1e-2), (torch.float32, 1e-4)):
            DTYPE = dtype
            T, lengths = 65, [4096, 1234]
            s = make_set(lengths, T, gen)
            vis = random_tree(len(lengths), T).to(DEV)
            lengths_t = torch.tensor(lengths, dtype=torch.int32, device=DEV)
            try:
                got = triton_verify.tree_verify_attention(s["q"], s["k"], s["v"], lengths_t,
                                                          visibility_bits(vis))
                err = rel_err(got, reference(s, lengths, vis))
                rows.append(dict(dtype=str(dtype), T=T, lengths=lengths, rel_err=err, ok=err <= tol))
            except Exception as e:
                rows.append(dict(dtype=str(dtype), ok=False, error=f"{type(e).__name__}: {str(e)[:300]}"))
    finally:
        DTYPE = saved
    return rows


# -- tile config sweep ----------------------------------------------------------------------------
def config_sweep(gen: torch.Generator) -> list[dict]:
    rows = []
    for T in TREE_TOKENS:
        lengths = [65536]
        sets = [make_set(lengths, T, gen) for _ in range(2)]
        lengths_t = torch.tensor(lengths, dtype=torch.int32, device=DEV)
        bits = visibility_bits(random_tree(1, T).to(DEV))
        for block_m in (64, 128):
            for block_n, stages, warps in ((32, 3, 4), (64, 2, 4), (64, 3, 4), (64, 3, 8), (128, 2, 8)):
                if elapsed() > DEADLINE_S:
                    return rows
                cfg = dict(BLOCK_M=block_m, BLOCK_N=block_n, num_stages=stages, num_warps=warps)
                try:
                    ws = triton_verify.alloc_workspace(sets[0]["q"], sets[0]["k"], config=cfg)
                    us = time_us(lambda s: triton_verify.tree_verify_attention(
                        s["q"], s["k"], s["v"], lengths_t, bits, workspace=ws, config=cfg), sets, reps=20)
                    rows.append(dict(T=T, context=65536, **cfg, us=us))
                except Exception as e:
                    rows.append(dict(T=T, context=65536, **cfg, error=f"{type(e).__name__}: {str(e)[:200]}"))
        del sets
    return rows


def main() -> int:
    import triton
    for name in ("recompile_limit", "cache_size_limit"):    # flex compiles once per shape
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)
    os.makedirs(OUT, exist_ok=True)
    gen = torch.Generator(device=DEV).manual_seed(0)
    result = dict(env=dict(torch=torch.__version__, triton=triton.__version__,
                           gpu=torch.cuda.get_device_name(), sms=torch.cuda.get_device_properties(0).multi_processor_count),
                  shapes=[], graph=None, other_dtypes=[], config_sweep=[])

    def save():
        with open(os.path.join(OUT, "verify_kernels.json"), "w") as f:
            json.dump(result, f, indent=1)

    for T in TREE_TOKENS:
        for ctx in CONTEXTS:
            for lengths in ([ctx], [ctx, ctx // 2 + 123]):
                log(f"[{elapsed():5.0f}s] T={T} lengths={lengths}")
                result["shapes"].append(run_shape(T, lengths, gen, with_flex=elapsed() < 120))
                save()
    log(f"[{elapsed():5.0f}s] graph capture")
    try:
        result["graph"] = graph_check(gen)
    except Exception as e:
        result["graph"] = dict(ok=False, error=f"{type(e).__name__}: {str(e)[:300]}")
    result["other_dtypes"] = dtype_check()
    save()
    log(f"[{elapsed():5.0f}s] config sweep")
    result["config_sweep"] = config_sweep(gen)
    result["elapsed_s"] = elapsed()
    save()
    print_table(result)
    tri_ok = (all(r.get("triton_ok") for r in result["shapes"])
              and all(r["ok"] for r in result["other_dtypes"]))
    return 0 if tri_ok and result["graph"].get("ok") else 1


def print_table(result: dict) -> None:
    def cell(r, m):
        if f"{m}_us" in r:
            return f"{r[m + '_us']:8.1f} ({r[m + '_pct_roofline']:4.1f}%)"
        return f"{'err' if f'{m}_error' in r else 'skip':>16}"

    print(f"\n{'T':>3} {'lengths':>14} {'roof us':>8} | {'triton us (%roof)':>17} {'sdpa':>16} {'flex':>16}"
          f" | {'err tri':>8} {'err flex':>8} {'splits':>6} {'best split':>12}")
    for r in result["shapes"]:
        sweep = r.get("triton_split_sweep_us") or {}
        best = min(sweep.items(), key=lambda kv: kv[1]) if sweep else None
        print(f"{r['T']:>3} {'/'.join(map(str, r['lengths'])):>14} {r['roofline_us']:8.1f} | "
              f"{cell(r, 'triton'):>17} {cell(r, 'sdpa')} {cell(r, 'flex')} | "
              f"{r.get('triton_rel_err', float('nan')):8.1e} {r.get('flex_rel_err', float('nan')):8.1e} "
              f"{r.get('triton_num_splits', 0):>6} "
              f"{(f'{best[0]}:{best[1]:.1f}' if best else '-'):>12}")
    for r in result["shapes"]:
        for m in ("triton", "sdpa", "flex"):
            if f"{m}_error" in r:
                print(f"  {m} T={r['T']} {r['lengths']}: {r[m + '_error']}")
    if result["config_sweep"]:
        ok = [c for c in result["config_sweep"] if "us" in c]
        for T in TREE_TOKENS:
            best = sorted((c for c in ok if c["T"] == T), key=lambda c: c["us"])[:3]
            print(f"config sweep T={T} @65536, best: " + "; ".join(
                f"BM{c['BLOCK_M']} BN{c['BLOCK_N']} st{c['num_stages']} w{c['num_warps']}: {c['us']:.1f} us"
                for c in best))
    for r in result.get("other_dtypes", []):
        print(f"triton {r['dtype']}: {'ok' if r['ok'] else 'FAILED'} rel err {r.get('rel_err', r.get('error'))}")
    g = result["graph"]
    print(f"graph capture: {'ok' if g.get('ok') else 'FAILED'} {g}")
    tri_ok = all(r.get("triton_ok") for r in result["shapes"])
    print(f"triton correct on all shapes: {tri_ok}; flex correct: "
          f"{sum(bool(r.get('flex_ok')) for r in result['shapes'])}/{len(result['shapes'])}; "
          f"{elapsed():.0f} s")


if __name__ == "__main__":
    sys.exit(main())
