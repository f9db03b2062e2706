"""Baseline selection without MLflow: GPU classes, the JSON files, journaled runs, and the
`harness gate` exit codes around them."""

from __future__ import annotations

import json
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.gate import baselines
from harness.gate.baselines import gpu_class, samples_of
from harness.protocol.errors import InputError
from harness.protocol.params import cell_id, cell_label
from harness.protocol.workloads.decode import IMPL_DEFAULTS
from harness.sweep.journal import RunJournal
from harness.sweep.scenario import parse_scenario

runner = CliRunner()
NAME = "gate-files"
TEXT = textwrap.dedent(f"""\
    name: {NAME}
    defaults: {{model: tiny, device: cpu, repeats: 5, profile_steps: 0}}
    matrix:
      context_length: [64, 128]
    """)


def journal(root: Path, run_id: str, tps: float, gpu: str | None = "NVIDIA H200",
            failed: set[int] = frozenset(), sha: str = "abc1234", kernels: dict | None = None,
            ran_before_auto: dict | None = None, settle: float | None = None) -> RunJournal:
    """A run of TEXT's two cells. `kernels`: what each result records it ran; `ran_before_auto`:
    a result from before knobs had `auto`, whose cell holds the kernels it ran (its id did not);
    `settle`: the seconds each repeat settled, as a worker records them (None: a result from
    before settling, which records nothing)."""
    sc = parse_scenario(TEXT, "s.yaml")
    j = RunJournal.create(root / "runs", run_id, NAME, "s.yaml", TEXT, sc.cells(),
                          {"git_sha": sha, "trigger": "nightly"})
    for k, cell in enumerate(sc.cells()):
        ok = k not in failed
        if ran_before_auto is not None:     # its cell knew only the knobs of its day, no auto
            cell_then = {**{k: v for k, v in cell.items() if k not in IMPL_DEFAULTS},
                         **ran_before_auto}
        j.write_cell({"cell": cell_then if ran_before_auto is not None else cell,
                      "cell_id": cell_id(cell),
                      "label": cell_label(cell), **({"kernels": kernels} if kernels else {}),
                      **({"settle": {"seconds": settle, "steps": [150] * 5}}
                         if settle is not None else {}),
                      "status": "ok" if ok else "failed", "error": None if ok else "boom",
                      "metrics": {"tokens_per_s": tps, "accept_len_mean": 6.5, "idle_fraction": None}
                      if ok else {},
                      "samples": {"tokens_per_s": [tps * f for f in (0.99, 1.0, 1.01, 0.995, 1.005)],
                                  "accept_len_mean": [6.5] * 5, "step_ms": [1.0] * 40}
                      if ok else {},
                      "env": {"gpu": gpu}, "started_at": "2026-01-01T00:00:00+00:00"})
    return j


def harness(*args):
    r = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    return r.exit_code, r.output


def test_gpu_class_names():
    assert gpu_class("NVIDIA H200") == "h200"
    assert gpu_class("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3"
    assert gpu_class("NVIDIA GeForce RTX 4090") == "geforce-rtx-4090"
    assert gpu_class(None) == gpu_class("") == gpu_class("none") == "cpu"


def test_samples_pool_per_repeat_lists_and_single_values():
    results = [{"status": "ok", "metrics": {"tokens_per_s": 10.0, "step_ms_p50": 2.0, "idle_fraction": None},
                "samples": {"tokens_per_s": [9.0, 10.0, 11.0]}},
               {"status": "ok", "metrics": {"tokens_per_s": 12.0, "step_ms_p50": 3.0},
                "samples": {"tokens_per_s": [12.0]}},
               {"status": "failed", "metrics": {"tokens_per_s": 1.0}, "samples": {}}]
    assert samples_of(results) == {"tokens_per_s": [9.0, 10.0, 11.0, 12.0], "step_ms_p50": [2.0, 3.0]}


def test_file_roundtrip_merge_and_class_layout(tmp_path):
    root = tmp_path / "baselines"
    first = journal(tmp_path, "20260101-000000-000001", 100.0)
    [(path, n, kept)] = baselines.write_file(root, first)
    assert path == root / "h200" / f"{NAME}.json" and (n, kept) == (2, 0)
    data = json.loads(path.read_text())
    assert data["gpu_class"] == "h200" and len(data["cells"]) == 2
    entry = next(iter(data["cells"].values()))
    assert "step_ms" not in entry["samples"]               # only the metrics' samples are kept
    assert entry["git_sha"] == "abc1234" and entry["run_id"] == first.run_id

    # A later run with a failed cell keeps that cell's older entry.
    second = journal(tmp_path, "20260102-000000-000002", 120.0, failed={1}, sha="def5678")
    [(path, n, kept)] = baselines.write_file(root, second)
    assert (n, kept) == (1, 1)
    sides = baselines.from_file(root, NAME, "h200")
    shas = sorted(s.git_sha for s in sides.values())
    assert shas == ["abc1234", "def5678"]
    assert sides[first.cells[0]["cell_id"]].samples["tokens_per_s"][1] == 120.0
    # One class has a file: it is what an unnamed class means.
    assert baselines.from_file(root, NAME, None).keys() == sides.keys()


def test_file_source_refuses_other_gpu_classes(tmp_path):
    root = tmp_path / "baselines"
    baselines.write_file(root, journal(tmp_path, "20260101-000000-000003", 100.0))
    with pytest.raises(InputError, match="GPU class 'a100'.*exist for GPU class h200.*never compared"):
        baselines.from_file(root, NAME, "a100")
    # A file moved under the wrong class folder is refused too.
    (root / "b200").mkdir()
    (root / "h200" / f"{NAME}.json").rename(root / "b200" / f"{NAME}.json")
    with pytest.raises(InputError, match="lies under 'b200'"):
        baselines.from_file(root, NAME, "b200")


def test_gate_against_file_and_run_baselines(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(TEXT)
    results = tmp_path / "results"
    base = journal(results, "20260101-000000-000004", 100.0)
    code, out = harness("baseline", "mark", base.run_id, "--no-mlflow", "--file", "--results", results)
    assert code == 0 and "2 cell(s)" in out, out
    assert (results / "baselines" / "h200" / f"{NAME}.json").is_file()

    slow = journal(results, "20260102-000000-000005", 90.0)
    same = journal(results, "20260102-000000-000006", 100.0)
    code, out = harness("gate", scenario, "--baseline", "file", "--run", slow.run_id, "--results", results)
    assert code == 1, out
    code, out = harness("gate", scenario, "--baseline", "file", "--run", same.run_id, "--results", results)
    assert code == 0, out
    code, out = harness("gate", scenario, "--baseline", f"run:{base.run_id}", "--run", slow.run_id,
                        "--results", results)
    assert code == 1, out

    # Baseline missing for the head's GPU class: exit 2.
    cpu = journal(results, "20260102-000000-000007", 100.0, gpu=None)
    code, out = harness("gate", scenario, "--baseline", "file", "--run", cpu.run_id, "--results", results)
    assert code == 2 and "no baseline for scenario" in out
    # A journaled baseline run from another class: refused, exit 2.
    code, out = harness("gate", scenario, "--baseline", f"run:{base.run_id}", "--run", cpu.run_id,
                        "--results", results)
    assert code == 2 and "never compared" in out
    # Head cells all failed: nothing measured, exit 2.
    broken = journal(results, "20260102-000000-000008", 100.0, failed={0, 1})
    code, out = harness("gate", scenario, "--baseline", "file", "--run", broken.run_id, "--results", results)
    assert code == 2 and "boom" in out


def test_a_baseline_that_ran_other_kernels_is_not_compared(tmp_path):
    """A cell that leaves its kernels `auto` keeps its id when auto starts picking faster
    kernels: the gate tells the two configurations apart by what each result ran, and refuses
    to compare them (exit 2) rather than call the new kernels' speed a change of the code."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(TEXT)
    results = tmp_path / "results"
    legacy = {"fused_ops": False, "topk_impl": "torch", "linear_impl": "torch"}
    old = journal(results, "20260103-000000-000009", 100.0, ran_before_auto=legacy)
    # Recorded by a worker from before linear_impl: it ran what came before the knob (torch).
    new = journal(results, "20260103-000000-000010", 150.0,
                  kernels={"fused_ops": True, "topk_impl": "triton"})
    code, out = harness("gate", scenario, "--baseline", f"run:{old.run_id}", "--run", new.run_id,
                        "--results", results)
    assert code == 2 and "nothing was compared" in out, out
    gate = json.loads(max((results / "gates").glob("*/gate.json")).read_text())
    assert {c["verdict"] for c in gate["cells"]} == {"missing"}
    assert gate["cells"][0]["message"].startswith(
        "baseline ran other kernels (fused_ops false, topk_impl torch; this run: fused_ops true, "
        "topk_impl triton): a different configuration, not compared")
    # The same kernels, recorded by a worker that resolves auto: compared, unchanged.
    same = journal(results, "20260103-000000-000011", 100.0, kernels=legacy)
    code, out = harness("gate", scenario, "--baseline", f"run:{old.run_id}", "--run", same.run_id,
                        "--results", results)
    assert code == 0, out
    # And in a baseline file, which keeps what its run ran.
    code, out = harness("baseline", "mark", new.run_id, "--no-mlflow", "--file", "--results", results)
    assert code == 0, out
    code, out = harness("gate", scenario, "--baseline", "file", "--run", same.run_id,
                        "--results", results)
    assert code == 2 and "baseline ran other kernels" in " ".join(out.split()), out


def test_a_baseline_that_settled_otherwise_is_not_compared(tmp_path):
    """A decode repeat settles before its window on a GPU (warmup_s, a measurement knob, so the
    id stays): a baseline whose windows were timed unsettled, or settled for another time,
    measured another state of the GPU, and the gate refuses it (exit 2) as it refuses other
    kernels; one that settled as long is compared."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(TEXT)
    results = tmp_path / "results"
    before = journal(results, "20260104-000000-000001", 100.0)              # no settle recorded
    settled = journal(results, "20260104-000000-000002", 97.0, settle=2.0)
    code, out = harness("gate", scenario, "--baseline", f"run:{before.run_id}", "--run",
                        settled.run_id, "--results", results)
    assert code == 2 and "nothing was compared" in out, out
    gate = json.loads(max((results / "gates").glob("*/gate.json")).read_text())
    assert {c["verdict"] for c in gate["cells"]} == {"missing"}
    assert gate["cells"][0]["message"] == (
        "baseline timed its windows unsettled (this run: settled 2 s a repeat; warmup_s): "
        "another measurement, not compared; mark a baseline measured the same way")
    longer = journal(results, "20260104-000000-000003", 97.0, settle=5.0)
    code, out = harness("gate", scenario, "--baseline", f"run:{settled.run_id}", "--run",
                        longer.run_id, "--results", results)
    assert code == 2 and "baseline settled 2 s a repeat before its windows" in " ".join(out.split())
    # Settled alike: compared (the same tokens/s: passed).
    again = journal(results, "20260104-000000-000004", 97.0, settle=2.0)
    code, out = harness("gate", scenario, "--baseline", f"run:{settled.run_id}", "--run",
                        again.run_id, "--results", results)
    assert code == 0, out
    # A result that recorded settling 0 s is one from before settling, as a CPU's always is.
    zero = journal(results, "20260104-000000-000005", 100.0, settle=0.0)
    code, out = harness("gate", scenario, "--baseline", f"run:{before.run_id}", "--run",
                        zero.run_id, "--results", results)
    assert code == 0, out
    # A baseline file keeps how its run settled.
    code, out = harness("baseline", "mark", settled.run_id, "--no-mlflow", "--file", "--results",
                        results)
    assert code == 0, out
    code, out = harness("gate", scenario, "--baseline", "file", "--run", zero.run_id,
                        "--results", results)
    assert code == 2 and "baseline settled 2 s a repeat" in " ".join(out.split()), out


@pytest.mark.parametrize("args, message", [
    ([], "either --base REF"),
    (["--base", "HEAD", "--baseline", "file"], "either --base REF"),
    (["--baseline", "nightly"], "--baseline must be mlflow, file or run:RUN_ID"),
    (["--baseline", "file", "--run", "nope"], "no run 'nope'"),
    (["--head", "HEAD", "--baseline", "file"], "--head REF needs --base"),
    (["--baseline", "file", "--alpha", "2"], "--alpha must lie between 0 and 1"),
    (["--baseline", "file", "--trigger", "cron"], "--trigger must be one of"),
    (["--baseline", "file", "--rounds", "0"], "--rounds must be >= 1"),
])
def test_bad_gate_input_is_one_line_and_exit_2(tmp_path, args, message):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(TEXT)
    code, out = harness("gate", scenario, *args, "--results", tmp_path / "results")
    assert code == 2 and message in out, out
    assert "Traceback" not in out and len(out.strip().splitlines()) == 1


def test_baseline_mark_bad_input(tmp_path):
    code, out = harness("baseline", "mark", "nope", "--no-mlflow", "--file", "--results", tmp_path)
    assert code == 2 and "needs the run's journal" in out
    code, out = harness("baseline", "mark", "nope", "--no-mlflow", "--results", tmp_path)
    assert code == 2 and "nothing to do" in out


def test_decode_tokens_per_s_repeats_carry_no_acceptance_scatter():
    """Session 24's linear-ab 4096 cell on the H200: the repeats drew 5.375 / 5.5 / 6.0 / 4.75 /
    6.0 tokens a step, so tokens/s spread 679-863; divided by the draw and scaled by its mean,
    the repeats agree within 1 %, at the run's level. Other metrics, and a result without the
    draws, are as measured; a run's median (RUN) stays the raw one."""
    from harness.gate.baselines import RUN, samples_of
    from harness.gate.samples import repeat_samples
    tps = [769.8, 788.0, 862.5, 678.9, 858.7]
    accept = [5.375, 5.5, 6.0, 4.75, 6.0]
    result = {"status": "ok", "metrics": {"tokens_per_s": 788.0, "accept_len_mean": 5.525},
              "samples": {"tokens_per_s": tps, "accept_len_mean": accept}}
    norm = repeat_samples(result, "tokens_per_s")
    assert max(norm) / min(norm) < 1.01
    assert sum(norm) / 5 == pytest.approx(sum(tps) / 5, rel=0.01)
    assert repeat_samples(result, "accept_len_mean") == accept
    assert repeat_samples({"samples": {"tokens_per_s": tps}}, "tokens_per_s") == tps
    assert samples_of([result])["tokens_per_s"] == norm
    assert samples_of([result], RUN)["tokens_per_s"] == [788.0]


TARGETS = TEXT + textwrap.dedent("""\
    targets:
      - {name: 95 tok/s at 64, cells: context_length=64, metric: tokens_per_s, min: 95}
      - {name: 150 tok/s at 128, cells: context_length=128, metric: tokens_per_s, min: 150}
      - {name: 128 as fast as 64, cells: context_length=128, per: context_length=64,
         metric: tokens_per_s, min: 0.99}
    """)


def test_targets_are_reported_beside_the_verdict_and_never_decide_it(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(TARGETS)
    results = tmp_path / "results"
    base = journal(results, "20260101-000000-000004", 100.0)
    same = journal(results, "20260102-000000-000006", 100.0)
    md, js, xml = tmp_path / "pr.md", tmp_path / "g.json", tmp_path / "j.xml"
    # The gate passes (no regression) while a target is not met: the exit code is the gate's.
    code, out = harness("gate", scenario, "--baseline", f"run:{base.run_id}", "--run", same.run_id,
                        "--results", results, "--markdown", md, "--json", js, "--junit", xml)
    assert code == 0, out
    text = md.read_text()
    assert "**Targets**" in text and "(2 met, 1 not met)" in text
    # The baseline is a journaled run: its numbers are beside the head's.
    assert "| target | base | head | bound | verdict |" in text
    assert "| 150 tok/s at 128 | 100 | 100 | tokens_per_s >= 150 | ❌ not met (1 of 1 outside) |" in text
    assert "| 128 as fast as 64 | 1 | 1 | tokens_per_s / per >= 0.99 | ✅ met |" in text
    report = json.loads(js.read_text())
    assert [t["verdict"] for t in report["targets"]] == ["met", "not met", "met"]
    assert [t["verdict"] for t in report["targets_base"]] == ["met", "not met", "met"]
    props = {p.get("name"): p.get("value") for p in ET.fromstring(xml.read_text()).iter("property")}
    assert (props["targets_met"], props["targets_not_met"], props["targets_absent"]) == ("2", "1", "0")

    # A baseline file keeps no run to judge: the head's numbers alone.
    code, out = harness("baseline", "mark", base.run_id, "--no-mlflow", "--file", "--results", results)
    assert code == 0, out
    code, out = harness("gate", scenario, "--baseline", "file", "--run", same.run_id,
                        "--results", results, "--markdown", md, "--json", js)
    assert code == 0, out
    assert "| target | measured | bound | verdict |" in md.read_text()
    assert json.loads(js.read_text())["targets_base"] is None

    # -k gates one cell: the targets about the other (as cells or as per) are left out with a
    # note, not judged absent; the one about this cell is judged.
    for k, judged in (("context_length=64", "95 tok/s at 64"), ("context_length=128", "150 tok/s at 128")):
        code, out = harness("gate", scenario, "--baseline", f"run:{base.run_id}", "--run", same.run_id,
                            "--results", results, "-k", k, "--json", js)
        assert code == 0, out
        report = json.loads(js.read_text())
        assert [t["name"] for t in report["targets"]] == [judged]
        assert "2 of the scenario's 3 target(s) not judged: the cells they bound are not in this gate" in report["notes"]

    # A head cell that failed: its targets are absent, never met.
    broken = journal(results, "20260102-000000-000009", 100.0, failed={1})
    code, out = harness("gate", scenario, "--baseline", f"run:{base.run_id}", "--run", broken.run_id,
                        "--results", results, "--json", js)
    assert code == 2, out
    assert [t["verdict"] for t in json.loads(js.read_text())["targets"]] == ["met", "absent", "absent"]
