"""kernels/verify/anatomy.py's arithmetic on stamps made up here (the GPU side is a trace build:
tests/kernels/test_custom_verify_gpu.py runs it where a GPU is)."""

import pytest

from harness.kernels.verify import anatomy as an

GHZ = 2.0      # cycles a ns


def row(kernel, block, sm, start_ns, stamps_ns):
    """A CTA that started at start_ns and reached stamp i at stamps_ns[i] (ns after its start;
    None: no such stamp), on a 2 GHz clock starting at 1000 cycles."""
    clock = [0] * 6
    clock[0] = 1000
    for i, t in enumerate(stamps_ns, start=1):
        if t is not None:
            clock[i] = 1000 + int(t * GHZ)
    end = max(t for t in stamps_ns if t is not None)
    return {"kernel": kernel, "sm": sm, "block": block, "start_ns": start_ns, "end_ns": start_ns + end,
            "clock": clock}


def call(t0, tiles_ns=10_000, combine_wait=3_000):
    """One call: two split CTAs (one a multiprocessor, the second 1 µs later), one combine CTA."""
    split = [row(an.SPLIT, (0, s, 0), s, t0 + 1000 * s,
                 [500, 1500, 2500, 2500 + tiles_ns, 3500 + tiles_ns]) for s in range(2)]
    last_end = max(r["end_ns"] for r in split)
    combine = row(an.COMBINE, (0, 0, 0), 5, last_end - combine_wait,
                  [combine_wait + 200, None, None, None, combine_wait + 2200])
    return split + [combine]


def test_anatomy_of_made_up_calls():
    rows = call(0) + call(40_000)
    got = an.anatomy(rows, tiles=11)
    assert got["clock_ghz"] == pytest.approx(GHZ, rel=1e-3)
    assert got["calls"] == 2
    assert got["wait_us"] == pytest.approx(0.5, abs=1e-3)
    assert got["landed_us"] == pytest.approx(1.0, abs=1e-3)
    assert got["first_tile_us"] == pytest.approx(1.0, abs=1e-3)
    assert got["loop_us"] == pytest.approx(10.0, abs=1e-3)
    assert got["tile_us"] == pytest.approx(1.0, abs=1e-3)
    assert got["slowest_loop_us"] == pytest.approx(10.0, abs=1e-3)
    assert got["epilogue_us"] == pytest.approx(1.0, abs=1e-3)
    assert got["split_us"] == pytest.approx(14.5, abs=1e-3)        # 0 .. 1000 + 13500
    assert got["end_spread_us"] == pytest.approx(1.0, abs=1e-3)
    assert got["combine_work_us"] == pytest.approx(2.0, abs=1e-3)
    assert got["combine_after_us"] == pytest.approx(2.2, abs=1e-3)   # the combine's end past the split's
    assert got["combine_start_us"] == pytest.approx(-3.0, abs=1e-3)  # started early, beside the split
    assert got["call_us"] == pytest.approx(40.0, abs=1e-3)           # one combine end to the next
    # the second call's last split CTA passed its wait 40000 + 1000 + 500 ns in; the first
    # call's combine ended at 14500 + 2200
    assert got["released_us"] == pytest.approx((41_500 - 16_700) / 1e3, abs=1e-3)
    assert got["ctas_most_on_an_sm"] == 1 and got["sms_used"] == 2


def test_launches_split_by_block_order():
    rows = call(0) + call(40_000) + call(80_000)
    groups = an.launches(rows, an.SPLIT)
    assert [len(g) for g in groups] == [2, 2, 2]
    assert [min(r["start_ns"] for r in g) for g in groups] == [0, 40_000, 80_000]


def test_the_slowest_cta_is_told_apart_from_the_median():
    """A third split CTA a call whose loop takes 6 µs longer (a split holding the tree's masked
    tiles): the median loop stays 10 µs, the slowest is 16."""
    rows = []
    for start in (0, 40_000):
        rows += call(start)
        rows.append(row(an.SPLIT, (0, 2, 0), 7, start + 500, [500, 1500, 2500, 18_500, 19_500]))
    got = an.anatomy(rows, tiles=11)
    assert got["loop_us"] == pytest.approx(10.0, abs=1e-3)
    assert got["slowest_loop_us"] == pytest.approx(16.0, abs=1e-3)
