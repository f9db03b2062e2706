"""Where a custom verify call's time goes, CTA by CTA: the anatomy of the split kernel and its
combine in the steady state of back-to-back calls.

The kernel workload's cell gives a call's time (graph replays of one call per input set); ncu
gives each kernel's duration alone, caches flushed. Neither says how a call's ~25 µs at 4096 keys
divide between the wait for the kernel before (programmatic dependent launch), the prologue's
first tiles, the loop over the tiles, the epilogue and the combine, which is what decides where a
short context's time can be won. A trace build (HARNESS_KERNEL_TRACE=1: kernels/trace.cuh) stamps
each CTA at those points; this script replays the kernel workload's graph of calls, reads the
stamps and reports per call (medians over the calls of several replays):

  call_us         one call's period in the steady state (the combine's last end to the next's)
  split_us        the split kernel's span: its first CTA's start to its last CTA's end
  wait_us         a split CTA's wait at griddepcontrol.wait (it started early, beside the kernel
                  before it)
  released_us     the previous call's combine's last end to this split's last CTA past its wait
  landed_us       a split CTA from its wait to its first tiles landing (Q, K_0, V_0)
  first_tile_us   the first tile's S and exact softmax
  loop_us, tile_us  the loop over the other tiles, and per tile
  slowest_loop_us the slowest CTA's loop (a split with more work, or slower tiles, sets the end)
  epilogue_us     writing the partial rows (or the output)
  end_spread_us   the split's first CTA end to its last (imbalance and wave tail)
  combine_after_us  the split's last end to the combine's last end: what the combine adds
  combine_work_us a combine CTA from its wait to its end

  HARNESS_KERNEL_TRACE=1 python -m harness.kernels.verify.anatomy --context 4096 16384 65536 \\
      --tokens 65 --impl wgmma_sumcheck --json anatomy.json

Times inside a CTA come from its multiprocessor's %clock64, converted at the clock rate the
trace itself measures (cycles against %globaltimer over the split CTAs); spans across CTAs come
from %globaltimer. A trace build's stamps cost a few stores by thread 0 a CTA, so its call times
should sit within noise of the default build's: compare `call_us` (and `replay_call_us`, the
replay's time over its calls) with a default build's kernel cell at the same point.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter, defaultdict

import torch

from harness.kernels.verify import custom_verify as cv

SPLIT, COMBINE = 1, 2                      # verify_attention.cu's TraceKernel
WAITED, LANDED, FIRST_TILE, LOOP, END = 1, 2, 3, 4, 5


def launches(rows: list[dict], kernel: int) -> list[list[dict]]:
    """The rows of `kernel` grouped by launch: the n-th CTA of a block index to start belongs to
    the n-th launch (a later launch of the same kernel starts its CTAs after the earlier one's)."""
    by_block: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r["kernel"] == kernel:
            by_block[r["block"]].append(r)
    out: dict[int, list[dict]] = defaultdict(list)
    for ctas in by_block.values():
        for i, r in enumerate(sorted(ctas, key=lambda r: r["start_ns"])):
            out[i].append(r)
    return [out[i] for i in sorted(out)]


def clock_ghz(rows: list[dict]) -> float:
    """Cycles per ns over the longest CTAs (the global timer's grain is coarse: long spans only)."""
    spans = sorted(((r["end_ns"] - r["start_ns"], r["clock"][END] - r["clock"][0]) for r in rows
                    if r["kernel"] == SPLIT and r["clock"][END] > r["clock"][0]), reverse=True)
    top = spans[:max(1, len(spans) // 2)]
    return sum(c for _, c in top) / sum(ns for ns, _ in top)


def at(r: dict, stamp: int, ghz: float) -> float:
    """Stamp `stamp` of row r in ns on the global timer (its start plus its own cycles)."""
    return r["start_ns"] + (r["clock"][stamp] - r["clock"][0]) / ghz


def anatomy(rows: list[dict], tiles: int) -> dict:
    """Per-call medians (µs) of one replay's rows; `tiles` a split CTA streams."""
    ghz = clock_ghz(rows)
    splits, combines = launches(rows, SPLIT), launches(rows, COMBINE)
    call: dict[str, list[float]] = defaultdict(list)

    def med(ctas, a, b):
        return statistics.median((r["clock"][b] - r["clock"][a]) / ghz for r in ctas) / 1e3

    prev_end = None
    for i, sp in enumerate(splits):
        cb = combines[i] if i < len(combines) else []
        first_start = min(r["start_ns"] for r in sp)
        ends = sorted(r["end_ns"] for r in sp)
        call["split_us"].append((ends[-1] - first_start) / 1e3)
        call["wait_us"].append(med(sp, 0, WAITED))
        call["landed_us"].append(med(sp, WAITED, LANDED))
        call["first_tile_us"].append(med(sp, LANDED, FIRST_TILE))
        loop = med(sp, FIRST_TILE, LOOP)
        call["loop_us"].append(loop)
        call["slowest_loop_us"].append(max(r["clock"][LOOP] - r["clock"][FIRST_TILE] for r in sp) / ghz / 1e3)
        if tiles > 1:
            call["tile_us"].append(loop / (tiles - 1))
        call["epilogue_us"].append(med(sp, LOOP, END))
        call["end_spread_us"].append((ends[-1] - ends[0]) / 1e3)
        on_sm = Counter(r["sm"] for r in sp)
        call["ctas_most_on_an_sm"].append(max(on_sm.values()))
        call["sms_used"].append(len(on_sm))
        last = ends[-1]
        if prev_end is not None:
            released = max(at(r, WAITED, ghz) for r in sp)
            call["released_us"].append((released - prev_end) / 1e3)
        if cb:
            c_end = max(r["end_ns"] for r in cb)
            call["combine_after_us"].append((c_end - last) / 1e3)
            call["combine_start_us"].append((min(r["start_ns"] for r in cb) - last) / 1e3)
            call["combine_work_us"].append(med(cb, WAITED, END))
            if prev_end is not None:
                call["call_us"].append((c_end - prev_end) / 1e3)
            prev_end = c_end
        else:
            if prev_end is not None:
                call["call_us"].append((last - prev_end) / 1e3)
            prev_end = last
    out = {k: statistics.median(v) for k, v in call.items() if v}
    out["clock_ghz"] = ghz
    out["calls"] = len(splits)
    return out


def trace_point(context: int, tokens: int, impl: str, replays: int, device: torch.device) -> dict:
    from harness.worker.kerneltime import launch_count
    from harness.worker.workloads.kernel import Point, input_sets, prepare

    pt = Point("gqa", 1, context, tokens, 32, 8, 128, 128, "contiguous", 16)
    sets = input_sets(pt, device, torch.bfloat16, seed=1000)
    calls = [prepare("custom", pt, s, custom_impl=impl) for s in sets]
    calls = calls * (launch_count(len(calls)) // len(calls))
    for c in calls:
        c()
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()      # as the kernel workload times them (kerneltime.time_calls)
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    for _ in range(3):
        graph.replay()
    cv.read_trace()                     # the warm-up's rows out of the way
    plan = cv.plan(sets[0]["q"], 8, context + tokens, paged=False, impl=impl)
    tiles = cv.split_tiles(context + tokens, plan["num_splits"])
    results, timed = [], []
    for _ in range(replays):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        rows, n = cv.read_trace()
        if n > len(rows):
            _refuse(f"{n} CTAs stamped a replay, {len(rows)} kept (trace::ROWS): a point with fewer calls")
        timed.append(start.elapsed_time(stop) * 1e3 / len(calls))
        results.append(anatomy(rows, tiles))
    keys = sorted({k for r in results for k in r})
    point = {k: statistics.median(r[k] for r in results if k in r) for k in keys}
    point.update(context=context, tokens=tokens, impl=impl, splits=plan["num_splits"], tiles=tiles,
                 row_blocks=plan["m_blocks"], replay_call_us=statistics.median(timed))
    # The last replay's rows as they came, for a closer look than the medians:
    # [kernel, sm, block x, y, z, start_ns, end_ns, clock 0..5]
    point["rows"] = [[r["kernel"], r["sm"], *r["block"], r["start_ns"], r["end_ns"], *r["clock"]] for r in rows]
    return point


def _refuse(why: str) -> None:
    print(f"anatomy: {why}", file=sys.stderr)
    raise SystemExit(2)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context", type=int, nargs="+", default=[4096, 16384, 65536])
    ap.add_argument("--tokens", type=int, nargs="+", default=[65])
    ap.add_argument("--impl", nargs="+", default=["wgmma_sumcheck"])
    ap.add_argument("--replays", type=int, default=5)
    ap.add_argument("--json", help="write the points here")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        _refuse("needs a CUDA GPU (none is visible)")
    if cv.read_trace() is None:
        _refuse("not a trace build of the verify kernels: run with HARNESS_KERNEL_TRACE=1")
    device = torch.device("cuda")
    points = []
    for impl in args.impl:
        for tokens in args.tokens:
            for context in args.context:
                p = trace_point(context, tokens, impl, args.replays, device)
                points.append(p)
                print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in p.items()
                                  if k != "rows"}), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "points": points}, f,
                      indent=1)


if __name__ == "__main__":
    main()
