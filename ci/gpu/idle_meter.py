"""GPU check of the idle meter (issue 5): calibration grid, profiler overhead, sync audit.

    OUT=/tmp/out PYTHONPATH=. python ci/gpu/idle_meter.py          # from the repo root

Needs only torch (CUDA) and the repo. Under 3 minutes on an H200. Writes $OUT/idle_meter.json
(plus $OUT/calibration.md, the table for results/, and $OUT/fixture_trace.json.gz, a small real
trace that tests/data/ can take as a fixture) and prints a table last.

1. Calibration: the `calibrate` workload over work 50 us / 500 us / 10 ms x true idle 0 / 10 /
   50 / 90 % x eager / graph replay (the grid of scenarios/calibrate.yaml, with fewer repeats).
   Targets: meter within 1 pp of the truth, estimate within 2 pp, no dropped records.
2. Profiler overhead: steps/s of a decode-like loop (many small kernels, one .item() per step)
   in windows before and after a profiled window (target: <= 2 % change), and with the
   always-on EventStepClock (negligible), plus the meter vs the estimate on that loop.
3. Sync audit on a toy loop with a known number of syncs per step, by kind and site.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch

from harness import idle, params, syncaudit
from harness.workloads import calibrate

OUT = os.environ.get("OUT", "gpu-out")
WORK_US = (50, 500, 10000)
IDLE_TARGETS = (0.0, 0.1, 0.5, 0.9)
REPLAYS = ("eager", "graph")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# -- 1. calibration --------------------------------------------------------------------------------
def calibration() -> list[dict]:
    rows = []
    for work_us in WORK_US:
        for replay in REPLAYS:
            for target in IDLE_TARGETS:
                cell = params.canonical({
                    "workload": "calibrate", "device": "cuda", "dtype": "bfloat16",
                    "work_us": float(work_us), "idle_target": target, "replay": replay,
                    "warmup_steps": 4, "steps": 8, "repeats": 2, "profile_steps": 8})
                t0 = time.perf_counter()
                try:
                    out = calibrate.run(cell, lambda **k: None)
                except Exception as exc:  # one broken cell must not hide the others
                    log(f"calibrate {work_us} us {replay} idle {target}: FAILED {exc!r}")
                    rows.append({"work_us": work_us, "replay": replay, "idle_target": target,
                                 "error": repr(exc), "ok": False})
                    continue
                m, prof = out["metrics"], out.get("profile", {})
                row = {"work_us": work_us, "replay": replay, "idle_target": target,
                       **{k: m.get(k) for k in (
                           "idle_true", "idle_true_profiled", "idle_fraction", "idle_error_pp",
                           "idle_fraction_est", "idle_est_error_pp", "step_us",
                           "step_us_target", "phase.gap.idle_ms", "phase.work.gpu_ms")},
                       "work_us_measured": m["work_us"],
                       "work_us_profiled": m.get("work_us_profiled"),
                       "records_dropped": prof.get("records_dropped"),
                       "kernels_per_step": sorted(set(prof.get("kernels_per_step", []))),
                       "steps": out["calibration"]["steps"],
                       "matmul": "{matmuls_per_step}x{matmul_n}".format(**out["calibration"]),
                       "wall_s": round(time.perf_counter() - t0, 2)}
                row["ok"] = (row["idle_error_pp"] is not None and abs(row["idle_error_pp"]) <= 1
                             and row["idle_est_error_pp"] is not None
                             and abs(row["idle_est_error_pp"]) <= 2 and not row["records_dropped"])
                if work_us == 500 and target == 0.5:
                    row["timeline"] = out.get("timeline")
                rows.append(row)
                log(f"calibrate {work_us:>5} us {replay:5} idle {target:.1f}: "
                    f"true {row['idle_true_profiled']:.4f} meter {row['idle_fraction']:.4f} "
                    f"est {row['idle_fraction_est']:.4f} ({row['wall_s']} s)")
    return rows


# -- 2. profiler overhead on a decode-like loop ----------------------------------------------------
def toy_loop(kernels: int = 200):
    x = torch.ones(1 << 20, device="cuda")

    def step():
        for _ in range(kernels // 2):
            x.mul_(1.0001).add_(1e-4)
        return x[0].item()            # one host sync per step, like a decode loop's accept
    return step


def steps_per_s(step, n: int, clock: idle.EventStepClock | None = None) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        if clock:
            clock.mark()
        step()
    if clock:
        clock.mark()
    torch.cuda.synchronize()
    return n / (time.perf_counter() - t0)


def overhead() -> dict:
    step, n = toy_loop(), 100
    for _ in range(50):
        step()
    plain = [steps_per_s(step, n) for _ in range(3)]
    events, windows = [], []
    for _ in range(3):                     # interleaved: events vs none
        clock = idle.EventStepClock(n)
        events.append(steps_per_s(step, n, clock))
        windows.append(clock.window_ms())
        plain.append(steps_per_s(step, n))
    before = plain
    stats = idle.profile_window(step, 20)
    after = [steps_per_s(step, n) for _ in range(6)]
    est = [idle.idle_fraction_est(w, n, stats["step_busy_ms"]) for w in windows]
    b, a, e = statistics.median(before), statistics.median(after), statistics.median(events)
    return {"steps_per_s_before": before, "steps_per_s_after_profile": after,
            "steps_per_s_with_events": events,
            "profile_change_pct": (a / b - 1) * 100, "event_clock_change_pct": (e / b - 1) * 100,
            "meter_idle": stats["idle_fraction"], "est_idle": statistics.median(est),
            "kernels_per_step": sorted(set(stats["kernels_per_step"])),
            "records_dropped": stats["records_dropped"], "timeline_items": len(stats["timeline"])}


def fixture_trace() -> None:
    """A small real trace (3 steps of a 3-phase loop) for tests/data/, gzipped."""
    x = torch.ones(1 << 16, device="cuda")

    def step():
        for name in ("draft", "tree", "verify"):
            with torch.profiler.record_function("phase." + name):
                for _ in range(3):
                    x.mul_(1.0001)
                if name == "tree":
                    x[0].item()
    os.environ["HARNESS_TRACE_DIR"] = os.path.join(OUT, "trace")
    try:
        idle.profile_window(step, 3)
    finally:
        del os.environ["HARNESS_TRACE_DIR"]
    (name,) = os.listdir(os.path.join(OUT, "trace"))
    os.replace(os.path.join(OUT, "trace", name), os.path.join(OUT, "fixture_trace.json.gz"))
    os.rmdir(os.path.join(OUT, "trace"))


# -- 3. sync audit ---------------------------------------------------------------------------------
EXPECTED_PER_STEP = {"d2h": 5, "h2d_pageable": 1, "sync": 2}


def sync_toy():
    a = torch.randn(64, device="cuda")
    pinned = torch.zeros(64).pin_memory()

    def step():
        for _ in range(3):
            a.sum().item()                       # d2h x3
        for _ in range(2):
            a[:4].tolist()                       # d2h x2
        torch.tensor([1.0, 2.0]).to("cuda")      # h2d_pageable x1
        if (a > 0).any():                        # sync x1 (bool of a CUDA tensor: torch warns)
            pass
        torch.nonzero(a > 0)                     # sync x1 (output size known only on the GPU)
        pinned.to("cuda", non_blocking=True)     # pinned, async: not a sync
    return step


def audit() -> dict:
    step = sync_toy()
    step()
    out = syncaudit.audit_window(step, 4, "cuda")
    by_kind = {}
    for s in out["sync_sites"]:
        by_kind[s["kind"]] = by_kind.get(s["kind"], 0) + s["per_step"]
    out["per_step_by_kind"] = by_kind
    out["expected_per_step_by_kind"] = EXPECTED_PER_STEP
    out["ok"] = by_kind == EXPECTED_PER_STEP
    return out


# -- main ------------------------------------------------------------------------------------------
def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def table(rows) -> str:
    head = ("| work µs (measured / profiled) | replay | target | true | meter | err pp | est | "
            "est err pp | kernels/step | dropped | ok |")
    lines = [head, "|---" * 11 + "|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['work_us']} | {r['replay']} | {r['idle_target']:.1f} | "
                         f"failed: {r['error'][:60]} |" + " |" * 7 + " NO |")
            continue
        lines.append(f"| {r['work_us']} ({fmt(r['work_us_measured'], '.1f')} / "
                     f"{fmt(r['work_us_profiled'], '.1f')}) | {r['replay']} | "
                     f"{r['idle_target']:.1f} | {fmt(r['idle_true_profiled'], '.4f')} | "
                     f"{fmt(r['idle_fraction'], '.4f')} | {fmt(r['idle_error_pp'], '+.2f')} | "
                     f"{fmt(r['idle_fraction_est'], '.4f')} | "
                     f"{fmt(r['idle_est_error_pp'], '+.2f')} | "
                     f"{r['kernels_per_step']} | {r['records_dropped']} | "
                     f"{'yes' if r['ok'] else 'NO'} |")
    return "\n".join(lines)


def main() -> int:
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    os.makedirs(OUT, exist_ok=True)
    t0 = time.perf_counter()
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cuda": torch.version.cuda}
    result["sync_audit"] = audit()               # first: no profiler has run in this process yet
    log("sync audit done", result["sync_audit"]["per_step_by_kind"])
    result["overhead"] = overhead()
    log("overhead done", {k: v for k, v in result["overhead"].items() if "pct" in k})
    fixture_trace()
    result["calibration"] = calibration()
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    with open(os.path.join(OUT, "idle_meter.json"), "w") as f:
        json.dump(result, f, indent=1)
    md = table(result["calibration"])
    with open(os.path.join(OUT, "calibration.md"), "w") as f:
        f.write(f"Idle-meter calibration on {result['gpu']} (torch {result['torch']}, "
                f"CUDA {result['cuda']}):\n`OUT=... PYTHONPATH=. python ci/gpu/idle_meter.py`\n\n"
                + md + "\n")

    o, s = result["overhead"], result["sync_audit"]
    print(md)
    print(f"\nprofiler overhead on a decode-like loop: {o['profile_change_pct']:+.2f} % steps/s "
          f"after a profiled window (target within 2 %); "
          f"event clock {o['event_clock_change_pct']:+.2f} %; "
          f"meter idle {o['meter_idle']:.4f} vs estimate {o['est_idle']:.4f}; "
          f"kernels/step {o['kernels_per_step']}, dropped {o['records_dropped']}")
    print(f"sync audit: {s['syncs_per_step']:.2f} syncs/step, by kind {s['per_step_by_kind']} "
          f"(expected {EXPECTED_PER_STEP}): {'ok' if s['ok'] else 'MISMATCH'}")
    for site in s["sync_sites"][:8]:
        print(f"   {site['per_step']:.1f}/step  {site['kind']:13}  {site['site']}")
    bad = [r for r in result["calibration"] if not r["ok"]]
    print(f"calibration: {len(result['calibration']) - len(bad)}/{len(result['calibration'])} "
          f"cells within target; wall {result['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
