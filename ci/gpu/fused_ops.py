"""GPU check of the fused decode-forward kernels (kernels/fused/triton_fused.py) in bf16 on qwen3-8b shapes.

    OUT=/tmp/out PYTHONPATH=. python3 ci/gpu/fused_ops.py          # from the repo root

1. Each kernel against the torch ops it replaces, bf16 inputs: max abs error next to the error of
   the unfused bf16 ops themselves (both against a float32 computation of the same function).
2. A qwen3-8b verify forward (random weights, bf16, 65 tree tokens at 4096, Triton attention)
   fused vs unfused: logits relative error, argmax agreement, and the number of kernels each
   launches (torch.profiler), and the time of each as a captured CUDA graph (median replay).
Writes $OUT/fused_ops.json, prints a table last. About a minute on an H200.
"""

from __future__ import annotations

import json
import os

import torch
from torch.nn import functional as F

from ci.gpu.gputime import graph_of, replay_us, versions
from harness.decode import attention
from harness.decode.kernel_choice import Kernels
from harness.decode.model import Target, TargetConfig, apply_rope, init_random_, rope_tables
from harness.protocol.presets import PRESETS
from harness.kernels.fused import triton_fused

OUT = os.environ.get("OUT", "gpu-out")
DEV = torch.device("cuda")
BF = torch.bfloat16


def err(a, b) -> float:
    return float((a.float() - b.float()).abs().max())


def kernel_checks() -> dict:
    g = torch.Generator(device=DEV).manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g, device=DEV)  # noqa: E731
    out = {}
    x, res, w = r(65, 4096), r(65, 4096), r(4096)
    h32 = x.to(BF).float() + res.to(BF).float()
    ref = F.rms_norm(h32.to(BF).float(), (4096,), w.to(BF).float(), 1e-6)
    fused, _ = triton_fused.add_rmsnorm(x.to(BF), w.to(BF), 1e-6, res.to(BF))
    plain = F.rms_norm(x.to(BF) + res.to(BF), (4096,), w.to(BF), 1e-6)
    out["add_rmsnorm"] = dict(fused_err=err(fused, ref), unfused_err=err(plain, ref))
    gu = r(65, 2 * 12288).to(BF)
    gate, up = gu.float().chunk(2, -1)
    ref = F.silu(gate) * up
    out["silu_mul"] = dict(fused_err=err(triton_fused.silu_mul(gu), ref),
                           unfused_err=err(F.silu(gu.chunk(2, -1)[0]) * gu.chunk(2, -1)[1], ref))
    qkv = r(1, 65, 48, 128).to(BF)
    qw, kw = r(128).to(BF), r(128).to(BF)
    pos = (4096 + torch.arange(65, device=DEV))[None]
    slots = pos.clone()
    cos32, sin32 = rope_tables(pos, 128, 1e6, torch.float32)
    cos, sin = rope_tables(pos, 128, 1e6, BF)
    kc = torch.zeros(1, 8, 4200, 128, dtype=BF, device=DEV)
    vc = torch.zeros_like(kc)
    q = triton_fused.qk_norm_rope_store(qkv, 32, qw, kw, 1e-6, cos, sin, kc, vc, slots)
    qf, kf, vf = qkv.float().split([32, 8, 8], 2)
    q_ref = apply_rope(F.rms_norm(qf, (128,), qw.float(), 1e-6), (cos32, sin32))
    k_ref = apply_rope(F.rms_norm(kf, (128,), kw.float(), 1e-6), (cos32, sin32))
    q_plain = apply_rope(F.rms_norm(qkv[:, :, :32], (128,), qw, 1e-6), (cos, sin))
    out["qk_norm_rope_store"] = dict(
        fused_err=max(err(q, q_ref), err(kc[0, :, 4096:4161].transpose(0, 1), k_ref[0]),
                      err(vc[0, :, 4096:4161].transpose(0, 1), vf[0])),
        unfused_err=err(q_plain, q_ref))
    return out


def count_kernels(fn) -> int:
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def forward_check() -> dict:
    cfg = TargetConfig(**PRESETS["qwen3-8b"]["target"])
    torch.manual_seed(0)
    with torch.device(DEV):
        target = Target(cfg).to(BF)
    init_random_(target, 0)
    ctx, T = 4096, 65
    cache = target.new_cache(1, ctx + 128)
    g = torch.Generator(device=DEV).manual_seed(1)
    cache.k.normal_(generator=g)
    cache.v.normal_(generator=g)
    lengths = torch.tensor([ctx], device=DEV)
    ids = torch.randint(0, cfg.vocab_size, (1, T), generator=g, device=DEV)
    vis = torch.ones(T, T, dtype=torch.bool, device=DEV).tril()[None]
    bits = attention.visibility_bits(vis)
    pos = lengths[:, None] + torch.arange(T, device=DEV)
    res = {}
    for mode in ("off", "on"):
        kernels = Kernels(verify="triton", fused_ops=mode == "on")
        mask = attention.Mask(lengths, vis, ctx + 128, kernels=kernels, bits=bits)
        fwd = lambda: target(ids, pos, cache, pos, mask)[0]  # noqa: E731
        with torch.no_grad():
            res[mode] = {"logits": fwd().float()}
            graph = graph_of(fwd)
            res[mode]["graph_ms"] = replay_us(graph, 1, replays=15) / 1e3
            res[mode]["kernels"] = count_kernels(graph.replay)
            del graph
    a, b = res["on"].pop("logits"), res["off"].pop("logits")
    res["logits_rel_err"] = float((a - b).norm() / b.norm())
    res["argmax_agree"] = float((a.argmax(-1) == b.argmax(-1)).float().mean())
    return res


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    report = {**versions(),
              "kernels": kernel_checks(), "forward": forward_check()}
    with open(os.path.join(OUT, "fused_ops.json"), "w") as f:
        json.dump(report, f, indent=1)
    print("| kernel | fused max err | unfused bf16 max err |")
    for name, v in report["kernels"].items():
        print(f"| {name} | {v['fused_err']:.4g} | {v['unfused_err']:.4g} |")
    fw = report["forward"]
    print(f"qwen3-8b verify forward (T=65, ctx 4096, Triton attention): kernels {fw['off']['kernels']} -> "
          f"{fw['on']['kernels']}, graph {fw['off']['graph_ms']:.3f} -> {fw['on']['graph_ms']:.3f} ms, "
          f"logits rel err {fw['logits_rel_err']:.2e}, argmax agree {fw['argmax_agree']:.3f}")


if __name__ == "__main__":
    main()
