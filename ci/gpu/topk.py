"""GPU check of the Triton top-k log-probs (kernels/tree/triton_topk.py): exactness, no sync, capture,
timing against torch.topk + torch.logsumexp.

    OUT=/tmp/out PYTHONPATH=. python ci/gpu/topk.py          # from the repo root

Needs only torch (CUDA), triton and the repo; ~1 minute on an H200. Writes $OUT/topk.json and
prints a table last. For b in 1, 2, 4, D = 15, V = 151936, k in 16, 64, 128, 256:

1. Exactness on three inputs: float32 randn x 8; standardised float32 logits x 32 (the random
   drafter's: a random lm_head product, standardised per row); bf16 randn x 8 (ties). ids must equal the
   reference order (value desc, id asc: a stable descending sort), and for float32 also
   torch.topk's ids; log-probs vs float64 topk - logsumexp and vs torch's float32 path (max
   |delta| reported). Also reported: candidates per row (how tight the threshold is) and rows
   that took the exact fallback.
2. No host sync: a call under torch.cuda.set_sync_debug_mode("error").
3. CUDA graph: the call captured (static input, outputs, workspace); three replays on new
   logits each equal an eager call (the counters reset between calls).
4. Timing: median of graph replays (CUDA events), each graph holding REPS copies of the call, so
   launch cost is amortised as in a whole-step graph: `triton` vs `torch` (topk + logsumexp,
   float32). Plus the all-equal row (every row takes the fallback), and at b=2, k=64 a small
   sweep of BLOCK x num_warps.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

from ci.gpu.gputime import graph_of, replay_us, versions
from harness.kernels.tree import triton_topk

OUT = os.environ.get("OUT", "gpu-out")
VOCAB = 151936
D = 15
BATCHES = (1, 2, 4)
KS = (16, 64, 128, 256)
REPS = 10          # copies of the call inside one timed graph
REPLAYS = 25       # timed replays (median)
DEV = torch.device("cuda")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def logits_for(kind: str, b: int, seed: int) -> torch.Tensor:
    g = torch.Generator(device=DEV).manual_seed(seed)
    if kind == "f32":
        return torch.randn(b, D, VOCAB, generator=g, device=DEV) * 8
    if kind == "bf16":
        return (torch.randn(b, D, VOCAB, generator=g, device=DEV) * 8).to(torch.bfloat16)
    if kind == "drafter":   # an lm_head over random hidden states, standardised x 32
        h = torch.randn(b, D, 256, generator=g, device=DEV)
        w = torch.randn(256, VOCAB, generator=g, device=DEV)
        x = h @ w               # float32 out: a bf16 product would tie (the bf16 case does)
        std, mean = torch.std_mean(x, dim=-1, keepdim=True)
        return (x - mean) / std * 32
    if kind == "equal":
        return torch.full((b, D, VOCAB), 1.5, device=DEV)
    raise ValueError(kind)


def torch_path(x: torch.Tensor, k: int):
    x = x.float()
    top, ids = torch.topk(x, k, dim=-1)
    return top - torch.logsumexp(x, dim=-1, keepdim=True), ids


def exactness(x: torch.Tensor, k: int) -> dict:
    ws = triton_topk.alloc_workspace(x, k)
    lp, ids = triton_topk.topk_logprobs(x, k, workspace=ws)
    p = triton_topk.plan(VOCAB, k)
    x64 = x.double()
    vals, order = torch.sort(x64, dim=-1, descending=True, stable=True)
    ref_lp = vals[..., :k] - torch.logsumexp(x64, -1, keepdim=True)
    t_lp, t_ids = torch_path(x, k)
    count = ws.count[: x.numel() // VOCAB]
    row = {"ids_equal_ref": torch.equal(ids, order[..., :k]),
           "sorted": bool((lp[..., 1:] <= lp[..., :-1]).all()),
           "max_dlp_f64": (lp.double() - ref_lp).abs().max().item(),
           "max_dlp_torch": (lp - t_lp).abs().max().item(),
           "cand_mean": round(count.float().mean().item(), 1), "cand_max": int(count.max()),
           "fallback_rows": int(((count > p["CAP"]) | (count < k)).sum())}
    if x.dtype == torch.float32:
        row["ids_equal_torch"] = torch.equal(ids, t_ids)
    else:   # ties: same values as torch, and our ids are a valid choice (checked above)
        row["values_equal_torch"] = torch.equal(x.float().gather(-1, ids), x.float().gather(-1, t_ids))
    return row


def no_sync(x: torch.Tensor, k: int) -> dict:
    ws = triton_topk.alloc_workspace(x, k)
    triton_topk.topk_logprobs(x, k, workspace=ws)
    triton_topk.topk_logprobs(x, k)
    torch.cuda.synchronize()
    try:
        torch.cuda.set_sync_debug_mode("error")
        triton_topk.topk_logprobs(x, k, workspace=ws)
        triton_topk.topk_logprobs(x, k)            # allocating its own outputs and workspace
        return {"no_sync": True}
    except Exception as exc:
        return {"no_sync": f"sync: {exc!r}"[:300]}
    finally:
        torch.cuda.set_sync_debug_mode("default")


def static_call(x: torch.Tensor, k: int, config: dict | None = None):
    """fn() running the kernel on x into fixed outputs and workspace, and those outputs."""
    ws = triton_topk.alloc_workspace(x, k, config)
    out = (torch.empty(*x.shape[:-1], k, device=DEV), torch.empty(*x.shape[:-1], k, dtype=torch.long, device=DEV))
    return (lambda: triton_topk.topk_logprobs(x, k, out=out, workspace=ws, config=config)), out


def capture(b: int, k: int) -> dict:
    x = logits_for("f32", b, seed=100)
    fn, out = static_call(x, k)
    g = graph_of(fn)
    ok = True
    for seed, kind in ((101, "f32"), (102, "bf16"), (103, "drafter")):
        x.copy_(logits_for(kind, b, seed).float())
        g.replay()
        want = triton_topk.topk_logprobs(x, k)
        ok &= torch.equal(out[0], want[0]) and torch.equal(out[1], want[1])
    return {"graph_replay_equals_eager": ok}


def timing(b: int, k: int) -> dict:
    x = logits_for("f32", b, seed=7)
    fn, _ = static_call(x, k)
    row = {"triton_us": round(replay_us(graph_of(fn, REPS), REPS, REPLAYS), 2),
           "torch_us": round(replay_us(graph_of(lambda: torch_path(x, k), REPS), REPS, REPLAYS), 2)}
    xb = x.to(torch.bfloat16)
    fnb, _ = static_call(xb, k)
    row["triton_bf16_us"] = round(replay_us(graph_of(fnb, REPS), REPS, REPLAYS), 2)
    return row


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    t_start = time.time()
    rows = []
    for b in BATCHES:
        for k in KS:
            t0 = time.time()
            row = {"b": b, "k": k, "plan": {key: triton_topk.plan(VOCAB, k)[key] for key in ("BLOCK", "SUB", "P", "C", "CAP")}}
            for kind in ("f32", "drafter", "bf16"):
                try:
                    row[kind] = exactness(logits_for(kind, b, seed=b * 1000 + k), k)
                except Exception as exc:   # report, keep going
                    row[kind] = {"error": repr(exc)[:300]}
            for part in (lambda: no_sync(logits_for("bf16", b, 5), k), lambda: capture(b, k), lambda: timing(b, k)):
                try:
                    row.update(part())
                except Exception as exc:
                    row.setdefault("errors", []).append(repr(exc)[:300])
            rows.append(row)
            log(f"b={b} k={k} in {time.time() - t0:.1f} s: {row}")

    extra = {}
    try:   # every row takes the exact fallback
        x = logits_for("equal", 2, 0)
        lp, ids = triton_topk.topk_logprobs(x, 64)
        extra["equal_exact"] = bool(torch.equal(ids, torch.arange(64, device=DEV).expand_as(ids))
                                    and (lp + torch.log(torch.tensor(float(VOCAB)))).abs().max().item() < 1e-5)
        fn, _ = static_call(x, 64)
        extra["equal_triton_us"] = round(replay_us(graph_of(fn, 2), 2, REPLAYS), 1)
        extra["equal_torch_us"] = round(replay_us(graph_of(lambda: torch_path(x, 64), 2), 2, REPLAYS), 1)
    except Exception as exc:
        extra["equal_error"] = repr(exc)[:300]
    sweep = {}
    x = logits_for("f32", 2, 9)
    for block in (1024, 2048, 4096):
        for nw in (4, 8):
            try:
                fn, _ = static_call(x, 64, {"BLOCK": block, "num_warps": nw})
                sweep[f"BLOCK={block},warps={nw}"] = round(replay_us(graph_of(fn, REPS), REPS, REPLAYS), 2)
            except Exception as exc:
                sweep[f"BLOCK={block},warps={nw}"] = repr(exc)[:200]
    extra["sweep_b2_k64_us"] = sweep

    result = {**versions(), "vocab": VOCAB, "D": D, "reps_per_graph": REPS,
              "replays": REPLAYS, "seconds": round(time.time() - t_start, 1), "rows": rows, **extra}
    with open(os.path.join(OUT, "topk.json"), "w") as f:
        json.dump(result, f, indent=1)

    def ok(r):
        vals = [r.get(kind, {}).get(key) for kind in ("f32", "drafter", "bf16")
                for key in ("ids_equal_ref", "sorted", "ids_equal_torch", "values_equal_torch")]
        good = all(v in (True, None) for v in vals) and all(
            r.get(kind, {}).get("max_dlp_f64", 1) <= 1e-5 for kind in ("f32", "drafter", "bf16"))
        return "ok" if good and r.get("no_sync") is True and r.get("graph_replay_equals_eager") else "FAIL"

    print(f"\n{result['device']}  torch {result['torch']}  triton {result['triton']}  ({result['seconds']} s)")
    print("exact: ids == (value desc, id asc) and == torch.topk (f32), sorted, |log-prob - float64| "
          "<= 1e-5, no sync, graph replays == eager; dlp: max |log-prob - float64| f32 / drafter; "
          "vs torch: max |log-prob - torch's float32 path| (all inputs); cand: mean candidates per "
          "row (f32 / drafter); fb: fallback rows; times: us per call inside a graph")
    print(f"{'b':>2} {'k':>4} {'exact':>5} {'dlp f32':>8} {'dlp dr':>8} {'vs torch':>8} {'cand':>11} {'fb':>3} "
          f"{'triton':>7} {'bf16':>7} {'torch':>7} {'speedup':>7}")
    for r in rows:
        f32, dr = r.get("f32", {}), r.get("drafter", {})
        fb = sum(r.get(kind, {}).get("fallback_rows", 0) for kind in ("f32", "drafter", "bf16"))
        tri, tor = r.get("triton_us"), r.get("torch_us")
        vs_torch = max((r.get(kind, {}).get("max_dlp_torch", -1) for kind in ("f32", "drafter", "bf16")), default=-1)
        print(f"{r['b']:>2} {r['k']:>4} {ok(r):>5} {_e(f32.get('max_dlp_f64')):>8} {_e(dr.get('max_dlp_f64')):>8} "
              f"{_e(vs_torch if vs_torch >= 0 else None):>8} "
              f"{str(f32.get('cand_mean', '-')) + '/' + str(dr.get('cand_mean', '-')):>11} {fb:>3} "
              f"{_f(tri):>7} {_f(r.get('triton_bf16_us')):>7} {_f(tor):>7} "
              f"{(f'{tor / tri:.1f}x' if tri and tor else '-'):>7}")
    print(f"all-equal rows (fallback), b=2 k=64: exact {extra.get('equal_exact')}, "
          f"triton {extra.get('equal_triton_us')} us, torch {extra.get('equal_torch_us')} us")
    print("b=2 k=64 sweep (us): " + ", ".join(f"{k}: {v}" for k, v in sweep.items()))


def _f(v):
    return "-" if not isinstance(v, (int, float)) else f"{v:.1f}"


def _e(v):
    return "-" if not isinstance(v, (int, float)) else f"{v:.1e}"


if __name__ == "__main__":
    main()
