"""Nsight Compute's pages read as counters (harness/worker/counters.py).

The details fixture (data/ncu_details_h200.csv) is two of the eight launches of session 28's
H200 profile (wgmma_pv's gqa_pipelined_kernel and the tail kernel at 65 tree tokens, 64k keys;
ncu 2025, `--section SpeedOfLight LaunchStats Occupancy SchedulerStats WarpStateStats`), its
details page laid out as `ncu --csv --page details` prints it: one quoted row per launch,
section and metric, values as ncu printed them. The raw page's stall columns carry session 16's
measured MLA stall reasons."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.worker import counters

DATA = Path(__file__).parent / "data"
DETAILS = (DATA / "ncu_details_h200.csv").read_text(encoding="utf-8")

RAW = "\n".join([
    '"ID","Process ID","Kernel Name","gpu__time_duration.sum",'
    '"smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",'
    '"smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",'
    '"smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",'
    '"smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio","smsp__inst_executed.sum"',
    '"","","","nsecond","","","","","inst"',                                # the units row
    '"0","1152","void gqa_pipelined_kernel<128, 4, 0, 0>(AttnParams)","235420","1.42","1.39","0.31","0.32",'
    '"13,600,000"',
    '"2","1152","void gqa_tail_kernel<128, 4, 0>(AttnParams)","212000","0.50","1.10","0.20","n/a",""',
])


def test_the_h200_details_page_reads_as_the_text_report_printed_it():
    pages = counters.parse(DETAILS)
    assert [k.name for k in pages.kernels] == ["gqa_pipelined_kernel", "gqa_tail_kernel"]
    pv = pages.kernels[0].values
    assert pv == pytest.approx({
        "duration_us": 235.42, "sm_ghz": 1.32, "sm_pct": 51.41, "memory_pct": 46.61,
        "dram_pct": 24.94, "l2_pct": 46.44, "grid_size": 520, "block_size": 128, "registers": 228,
        "dynamic_smem_kb": 115.71, "theoretical_occupancy_pct": 12.5, "occupancy_pct": 12.29,
        "warps_per_scheduler": 1.97, "eligible_per_scheduler": 0.5, "issued_per_scheduler": 0.39,
        "cycles_per_issue": 5.07})
    tail = pages.kernels[1].values
    assert tail["registers"] == 244 and tail["grid_size"] == 256
    assert pages.skipped == []


def test_units_are_converted_whatever_ncu_printed():
    """`--print-units base` (or another version) prints nanoseconds and cycles per nanosecond:
    the same counters come out; a unit of the wrong kind is left out and named."""
    base = (DETAILS.replace('"Duration","us","235.42"', '"Duration","nsecond","235,420"')
                   .replace('"SM Frequency","Ghz","1.32"', '"SM Frequency","cycle/nsecond","1.32"')
                   .replace('"Dynamic Shared Memory Per Block","Kbyte/block","115.71"',
                            '"Dynamic Shared Memory Per Block","byte/block","115710"'))
    assert base != DETAILS
    pv = counters.parse(base).kernels[0].values
    assert pv["duration_us"] == pytest.approx(235.42)
    assert pv["sm_ghz"] == pytest.approx(1.32) and pv["dynamic_smem_kb"] == pytest.approx(115.71)
    odd = DETAILS.replace('"Duration","us","235.42"', '"Duration","fortnight","235.42"')
    pages = counters.parse(odd)
    assert "duration_us" not in pages.kernels[0].values
    assert "duration_us" in pages.kernels[1].values
    assert pages.skipped == ["Duration: '235.42' 'fortnight'"]
    percent_as_count = DETAILS.replace('"DRAM Throughput","%","24.94"', '"DRAM Throughput","byte/second","24.94"')
    assert "dram_pct" not in counters.parse(percent_as_count).kernels[0].values


def test_the_profilers_own_lines_before_the_csv_are_ignored():
    noisy = "==PROF== Connected to process 1152\n==WARNING== something\n" + DETAILS
    assert counters.parse(noisy).kernels[0].values == counters.parse(DETAILS).kernels[0].values
    assert counters.parse("==PROF== Disconnected\n").kernels == []


def test_a_page_without_the_columns_it_needs_says_which():
    with pytest.raises(ValueError, match="no column Metric Unit, Metric Value"):
        counters.parse('"ID","Kernel Name","Section Name","Metric Name"\n"0","k","S","M"\n')


def test_stall_reasons_and_instructions_come_from_the_raw_page_by_launch_id():
    pages = counters.parse(DETAILS, RAW)
    pv, tail = (k.values for k in pages.kernels)
    assert pv["stall.barrier"] == 1.42 and pv["stall.wait"] == 1.39
    assert pv["stall.long_scoreboard"] == 0.31 and pv["stall.lg_throttle"] == 0.32
    assert tail["stall.barrier"] == 0.5 and "stall.lg_throttle" not in tail     # n/a: absent
    assert pv["instructions"] == 13_600_000 and "instructions" not in tail
    assert "duration_us" in pv and pv["duration_us"] == pytest.approx(235.42)  # details win


def test_flat_names_number_a_kernel_launched_again():
    pages = counters.parse(DETAILS)
    pages.kernels[1].name = pages.kernels[0].name          # the same function twice in a call
    flat = counters.flatten(pages)
    assert flat["ncu.gqa_pipelined_kernel.registers"] == 228
    assert flat["ncu.gqa_pipelined_kernel.2.registers"] == 244
    assert all(k.startswith("ncu.") for k in flat)


@pytest.mark.parametrize("name, short", [
    ("void gqa_tma_kernel<128, 4, true>(GqaTmaParams)", "gqa_tma_kernel"),
    ("void gqa_pipelined_kernel<128, 4, 0, 0>(AttnParams)", "gqa_pipelined_kernel"),
    ("_verify_fwd_kernel", "_verify_fwd_kernel"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
     "at::detail::Array<char *, 1>>(int, T2, T3)", "vectorized_elementwise_kernel"),
    ("combine_kernel(float const*, int)", "combine_kernel"),
])
def test_short_kernel_names(name, short):
    assert counters.short_name(name) == short


@pytest.mark.parametrize("text, value", [("235.42", 235.42), ("312,621", 312621.0),
                                         ("289,643.40", 289643.4), ("n/a", None), ("", None),
                                         ("1,5", None), ("-3", -3.0)])
def test_numbers_as_ncu_prints_them(text, value):
    assert counters.number(text) == value


# The source page of a real profile (session 31, H100: wgmma_sumcheck at 65 tree tokens over
# 65536 keys, `--page source --csv --print-source sass`), trimmed to its columns this reads and
# to the instructions with samples; the combine kernel printed twice, as ncu printed every kernel.
SOURCE = (DATA / "ncu_source_h100.csv").read_text(encoding="utf-8")


def test_the_source_page_says_which_instructions_the_warps_spend_their_time_at():
    found = counters.parse_source(SOURCE)
    assert set(found) == {"gqa_pipelined_kernel", "combine_kernel"}
    pv = found["gqa_pipelined_kernel"]
    # the exponentials first (32 MUFU.EX2 a tile at the special-function pipe's rate), then the
    # copies' address arithmetic and the row sums: what kernels/NOTES.md read off this profile
    assert pv["time.MUFU"] == pytest.approx(21.50, abs=0.01)
    assert pv["time.IMAD"] == pytest.approx(11.67, abs=0.01)
    assert pv["time.FADD"] == pytest.approx(7.03, abs=0.01)
    assert sorted(pv, key=pv.get, reverse=True)[:3] == ["time.MUFU", "time.IMAD", "time.other"]
    assert all(v >= counters.TIME_MIN_PCT for k, v in pv.items() if k != "time.other")
    assert sum(pv.values()) == pytest.approx(100.0)
    # printed twice, counted once: the shares are those of one listing
    marker = '"Kernel Name","void tva::combine_kernel'
    before, listing, _again = SOURCE.split(marker)
    assert counters.parse_source(before + marker + listing)["combine_kernel"] == found["combine_kernel"]
    assert found["combine_kernel"]["time.FMNMX"] == pytest.approx(59.52, abs=0.01)


def test_the_source_shares_go_to_a_kernels_first_launch():
    pages = counters.parse(DETAILS)
    pages.kernels[1].name = pages.kernels[0].name          # gqa_pipelined_kernel launched twice
    counters.add_source(pages, counters.parse_source(SOURCE))
    flat = counters.flatten(pages)
    assert flat["ncu.gqa_pipelined_kernel.time.MUFU"] == pytest.approx(21.5, abs=0.01)
    assert not any(k.startswith("ncu.gqa_pipelined_kernel.2.time.") for k in flat)


@pytest.mark.parametrize("text", ["", "==PROF== nothing", '"Kernel Name","k"\n"Address","Source"\n"0x0","NOP"'])
def test_a_source_page_without_samples_gives_nothing(text):
    assert counters.parse_source(text) == {}


@pytest.mark.parametrize("sass, op", [("      MUFU.EX2 R168, R168", "MUFU"), ("@!P0  BRA 0x7f65", "BRA"),
                                      ("@!PT  LDS RZ, [RZ]", "LDS"), ("HGMMA.64x64x16.F32.BF16 R88", "HGMMA"),
                                      ("", "")])
def test_opcodes_of_sass_lines(sass, op):
    assert counters.opcode(sass) == op

