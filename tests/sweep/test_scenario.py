"""Scenario loading: shipped scenarios, matrix expansion, cell ids, and every bad-input case
reported as one `file:line:column: message` line."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.protocol import params
from harness.protocol.errors import InputError
from harness.sweep.scenario import load_scenario, validate_tracking_uri

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def load(tmp_path: Path, text: str, name: str = "s.yaml"):
    return load_scenario(write(tmp_path, text, name))


def error(tmp_path: Path, text: str, name: str = "s.yaml") -> str:
    path = write(tmp_path, text, name)
    with pytest.raises(InputError) as info:
        load_scenario(path)
    message = str(info.value)
    assert "\n" not in message
    return message.replace(str(path), "s.yaml")


# --- errors.InputError ---------------------------------------------------------------------

def test_input_error_format():
    assert str(InputError("a.yaml", 3, 7, "bad")) == "a.yaml:3:7: bad"
    assert str(InputError("a.yaml", None, None, "bad")) == "a.yaml: bad"
    assert str(InputError(None, None, None, "bad\nthing")) == "bad thing"
    err = pickle.loads(pickle.dumps(InputError("a.yaml", 3, 7, "bad")))
    assert (err.path, err.line, err.column, err.message) == ("a.yaml", 3, 7, "bad")


# --- shipped scenarios ---------------------------------------------------------------------

@pytest.mark.parametrize("name,trigger,count", [
    ("quickstart", "manual", 4),
    ("nightly", "nightly", 145),   # 5 contexts x 4 verify x 7 valid graph/tree/accept combos + 5 AR
    ("pr", "pr", 10),              # 8 + 2 AR references
    ("verify-ab", "manual", 14),   # 8 GQA contiguous + 3 MLA + 3 paged
    ("linear-ab", "manual", 18),   # 3 contexts x cuBLAS / wgmma + 2 x (the layer, 4 GEMMs, lm_head)
])
def test_shipped_scenarios_validate(name, trigger, count):
    scenario = load_scenario(REPO / "scenarios" / f"{name}.yaml")
    assert scenario.name == name
    assert scenario.trigger == trigger
    assert len(scenario.cells()) == count
    assert len(set(scenario.cell_ids())) == count


def test_quickstart_is_cpu_and_small():
    cells = load_scenario(REPO / "scenarios" / "quickstart.yaml").cells()
    assert {c["model"] for c in cells} == {"tiny"}
    assert {c["device"] for c in cells} == {"cpu"}
    assert {c["acceptance"] for c in cells} == {"greedy", "synthetic"}
    assert {c["profile_steps"] for c in cells} == {0}


def test_nightly_has_no_impossible_cells():
    cells = load_scenario(REPO / "scenarios" / "nightly.yaml").cells()
    full = [c for c in cells if c["graph_capture"] == "full" and c["speculation"] != "none"]
    assert full and all(c["tree_build"] == c["accept"] == "gpu" for c in full)
    assert sum(c["speculation"] == "none" for c in cells) == 5   # one AR reference per context


def test_controller_modules_do_not_import_torch():
    code = "import sys, harness.sweep.scenario; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0


# --- expansion -----------------------------------------------------------------------------

BASIC = """
    name: demo
    description: a demo
    defaults:
      model: tiny
      repeats: 2
    matrix:
      context_length: [256, 512, 1024]
      verify_mode: [sdpa, flex]
    """


def test_scenario_attributes(tmp_path):
    path = write(tmp_path, BASIC)
    scenario = load_scenario(path)
    assert (scenario.name, scenario.description, scenario.trigger) == ("demo", "a demo", "manual")
    assert scenario.path == str(path)
    assert scenario.text == path.read_text()
    assert scenario.hosts == [] and scenario.metrics == {}


def test_matrix_product_in_order_and_canonical(tmp_path):
    cells = load(tmp_path, BASIC).cells()
    assert len(cells) == 6
    # first matrix key varies slowest
    assert [(c["context_length"], c["verify_mode"]) for c in cells] == [
        (256, "sdpa"), (256, "flex"), (512, "sdpa"), (512, "flex"), (1024, "sdpa"), (1024, "flex")]
    for cell in cells:
        assert cell == params.canonical(cell)
        # every parameter a cell has, and the decode workload's own ones
        assert list(cell) == sorted({**params.DEFAULTS, **params.WORKLOAD_PARAMS["decode"]})
        assert cell["repeats"] == 2


def test_cell_ids_stable_and_distinct(tmp_path):
    ids = load(tmp_path, BASIC).cell_ids()
    assert ids == load(tmp_path, BASIC).cell_ids()
    assert len(set(ids)) == len(ids)
    reordered = """
        matrix:
          verify_mode: [flex, sdpa]
          context_length: [1024, 512, 256]
        defaults:
          repeats: 7        # a measurement knob: not part of the id
          model: tiny
        name: other
        """
    assert sorted(load(tmp_path, reordered, "r.yaml").cell_ids()) == sorted(ids)


def test_int_tau_and_float_tau_are_the_same_cell(tmp_path):
    a = load(tmp_path, "name: a\nmatrix: {tau: [6]}\n", "a.yaml")
    b = load(tmp_path, "name: b\nmatrix: {tau: [6.0]}\n", "b.yaml")
    assert a.cell_ids() == b.cell_ids()
    assert a.cells()[0]["tau"] == 6.0 and isinstance(a.cells()[0]["tau"], float)


def test_exclude_and_include(tmp_path):
    scenario = load(tmp_path, """
        name: demo
        matrix:
          context_length: [256, 512]
          tree_build: [cpu, gpu]
          accept: [cpu, gpu]
        exclude:
          - {tree_build: cpu, accept: gpu}
          - {context_length: 512, accept: cpu}   # accept cpu is set in every such cell
        include:
          - {context_length: 2048, graph_capture: full, tree_build: gpu, accept: gpu}
        """)
    combos = [(c["context_length"], c["tree_build"], c["accept"], c["graph_capture"])
              for c in scenario.cells()]
    assert combos == [
        (256, "cpu", "cpu", "none"), (256, "gpu", "cpu", "none"), (256, "gpu", "gpu", "none"),
        (512, "gpu", "gpu", "none"),
        (2048, "gpu", "gpu", "full"),
    ]


def test_exclude_matches_defaults(tmp_path):
    cells = load(tmp_path, """
        name: demo
        matrix: {context_length: [256, 512]}
        exclude: [{context_length: 512, verify_mode: sdpa}]   # sdpa is the default
        """).cells()
    assert [c["context_length"] for c in cells] == [256]


def test_duplicate_cells_removed_keeping_first(tmp_path):
    cells = load(tmp_path, """
        name: demo
        matrix:
          context_length: [256, 512, 256]
          repeats: [1, 2]          # measurement knob: same ids
        include:
          - {context_length: 512}
        """).cells()
    assert [(c["context_length"], c["repeats"]) for c in cells] == [(256, 1), (512, 1)]


def test_merge_keys_and_hosts_and_metrics(tmp_path):
    scenario = load(tmp_path, """
        name: demo
        defaults: &common {model: tiny, steps: 4}
        matrix: {context_length: [256]}
        include:
          - {<<: *common, steps: 5, tree_budget: 4}
        hosts: [gpu-a, gpu-b]
        metrics:
          tokens_per_s: {direction: higher, threshold_rel: 0.05}
        """)
    assert [(c["steps"], c["tree_budget"]) for c in scenario.cells()] == [(4, 16), (5, 4)]
    assert scenario.hosts == ["gpu-a", "gpu-b"]
    assert scenario.metrics == {
        "tokens_per_s": {"direction": "higher", "threshold_rel": 0.05, "threshold_abs": None,
                         "gate": None}}


def test_checkpoint_resolved_against_scenario_dir(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "sub").mkdir()
    scenario = load(tmp_path, "name: c\nmatrix: {checkpoint: [../ckpt]}\n", "sub/s.yaml")
    assert scenario.cells()[0]["checkpoint"] == str(tmp_path / "ckpt")


# --- bad input: each names file:line:column of the offending node -------------------------

def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(InputError) as info:
        load_scenario(path)
    assert str(info.value) == f"{path}: no such scenario file"


def test_empty_file(tmp_path):
    assert error(tmp_path, "# only a comment\n").startswith("s.yaml: empty scenario file")


def test_yaml_syntax_error(tmp_path):
    assert error(tmp_path, """
        name: x
          matrix: {}
        """) == "s.yaml:2:9: YAML syntax error: mapping values are not allowed here"


def test_duplicate_key(tmp_path):
    assert error(tmp_path, """
        name: x
        matrix: {context_length: [256]}
        name: y
        """) == "s.yaml:3:1: duplicate key 'name' (first given on line 1)"


def test_not_a_mapping(tmp_path):
    assert error(tmp_path, "- a\n").startswith("s.yaml:1:1: the scenario must be a mapping")


def test_missing_required_key(tmp_path):
    assert error(tmp_path, "matrix: {context_length: [256]}\n") == (
        "s.yaml:1:1: missing required key 'name'")


def test_unknown_key_with_hint(tmp_path):
    assert error(tmp_path, """
        name: x
        defaults:
          model: tiny
          contxt_length: 256
        matrix: {tree_budget: [8]}
        """) == "s.yaml:4:3: unknown key 'contxt_length' (did you mean 'context_length'?)"


def test_misspelt_key_wins_over_the_missing_key_it_explains(tmp_path):
    assert error(tmp_path, "name: x\nmatrx: {tree_budget: [8]}\n") == (
        "s.yaml:2:1: unknown key 'matrx' (did you mean 'matrix'?)")


def test_wrong_type_string_for_int(tmp_path):
    assert error(tmp_path, """
        name: x
        matrix:
          context_length: [256, abc]
        """) == "s.yaml:3:25: context_length must be a positive integer, got 'abc'"


def test_wrong_type_in_defaults(tmp_path):
    assert error(tmp_path, """
        name: x
        defaults:
          context_length: "256"
        matrix: {tree_budget: [8]}
        """) == "s.yaml:3:19: context_length must be a positive integer, got '256'"


def test_empty_matrix(tmp_path):
    assert error(tmp_path, "name: x\nmatrix: {}\n") == (
        "s.yaml:2:9: matrix is empty: give at least one cell parameter with a list of values")


def test_empty_matrix_list(tmp_path):
    assert error(tmp_path, """
        name: x
        matrix:
          tree_budget: [8]
          context_length: []
        """) == "s.yaml:4:19: matrix.context_length must be a non-empty list of values, got []"


def test_missing_matrix_names_the_root(tmp_path):
    assert error(tmp_path, "name: x\n") == "s.yaml:1:1: missing required key 'matrix'"


@pytest.mark.parametrize("value,column,shown", [("0", 25, "0"), ("-5", 25, "-5"),
                                                ("1.5", 25, "1.5"), ("true", 25, "true")])
def test_bad_context_length(tmp_path, value, column, shown):
    assert error(tmp_path, f"""
        name: x
        matrix:
          context_length: [256, {value}]
        """) == f"s.yaml:3:{column}: context_length must be a positive integer, got {shown}"


def test_context_over_preset_limit(tmp_path):
    assert error(tmp_path, """
        name: x
        defaults:
          model: qwen3-8b
        matrix:
          context_length: [4096, 200000]
        """) == "s.yaml:5:26: context_length 200000 exceeds model 'qwen3-8b' limit 131072"


def test_context_plus_decoded_tokens_over_limit(tmp_path):
    message = error(tmp_path, """
        name: x
        defaults:
          context_length: 8190
        matrix: {tree_budget: [8]}
        """)
    assert message.startswith("s.yaml:3:19: context_length 8190 plus up to ")
    assert message.endswith("decoded tokens exceeds model 'tiny' limit 8192")


def test_unknown_verify_mode(tmp_path):
    assert error(tmp_path, """
        name: x
        matrix:
          verify_mode: [sdpa, trition]
        """) == ("s.yaml:3:23: unknown verify_mode 'trition' "
                 "(allowed: custom, triton, sdpa, flex; did you mean 'triton'?)")


def test_unknown_preset(tmp_path):
    assert error(tmp_path, """
        name: x
        defaults:
          model: qwen3-7b
        matrix: {tree_budget: [8]}
        """) == ("s.yaml:3:10: unknown model 'qwen3-7b' "
                 "(allowed: tiny, qwen3-8b, kimi-k2.6-rank; did you mean 'qwen3-8b'?)")


def test_nonexistent_checkpoint(tmp_path):
    message = error(tmp_path, """
        name: x
        matrix:
          checkpoint: [null, ./missing-ckpt]
        """)
    assert message.startswith("s.yaml:3:22: checkpoint './missing-ckpt' does not exist")


def test_impossible_graph_capture_full(tmp_path):
    assert error(tmp_path, """
        name: x
        defaults: {accept: gpu}
        matrix:
          graph_capture: [none, full]
          tree_build: [gpu, cpu]
        """) == ("s.yaml:4:25: graph_capture 'full' captures tree build and accept in one "
                 "replay: it needs tree_build: gpu and accept: gpu")


def test_graph_capture_on_a_cpu_cell_is_refused_where_it_is_written(tmp_path):
    assert error(tmp_path, """
        name: x
        defaults: {device: cpu}
        matrix:
          graph_capture: [none, verify]
        """) == ("s.yaml:4:25: graph_capture 'verify' records CUDA graphs; this cell runs on "
                 "device 'cpu' (graph_capture: none, or device: cuda / auto)")


def test_impossible_cell_removed_by_exclude_is_fine(tmp_path):
    cells = load(tmp_path, """
        name: x
        defaults: {accept: gpu}
        matrix:
          graph_capture: [none, full]
          tree_build: [gpu, cpu]
        exclude:
          - {graph_capture: full, tree_build: cpu}
        """).cells()
    assert len(cells) == 3


def test_tau_above_block_size(tmp_path):
    assert error(tmp_path, """
        name: x
        defaults: {acceptance: synthetic, tau: 6.5}
        matrix:
          block_size: [8, 4]
        """) == ("s.yaml:2:40: tau 6.5 exceeds block_size 4: "
                 "a step accepts at most block_size tokens")


def test_exclude_everything(tmp_path):
    assert error(tmp_path, """
        name: x
        matrix: {tree_budget: [8]}
        exclude:
          - {tree_budget: 8}
        """) == "s.yaml:4:3: exclude drops every cell of the matrix: nothing to run"


def test_bad_hosts_and_metrics(tmp_path):
    assert error(tmp_path, """
        name: x
        matrix: {tree_budget: [8]}
        hosts: [gpu-a, 7]
        """) == ("s.yaml:3:16: hosts[1] must be a host name or a non-empty mapping of labels "
                 "like {gpu: h200}, got 7")
    assert error(tmp_path, """
        name: x
        matrix: {tree_budget: [8]}
        metrics:
          tokens_per_s: {direction: higher, threshold: 0.1}
        """) == ("s.yaml:4:37: unknown key 'threshold' "
                 "(did you mean 'threshold_rel'?)")


# --- tracking URIs -------------------------------------------------------------------------

@pytest.mark.parametrize("uri", [
    "sqlite:///results/mlflow.db", "sqlite:////abs/mlflow.db", "http://localhost:5000",
    "https://mlflow.example.com", "http://10.0.0.2", "file:///tmp/mlruns", "./mlruns",
    "/abs/mlruns", "mlruns", "postgresql://user:pw@db:5432/mlflow",
    "postgresql+psycopg2://db/mlflow", "mysql://db/mlflow", "databricks",
])
def test_good_tracking_uris(uri):
    assert validate_tracking_uri(uri) == uri


@pytest.mark.parametrize("uri", [
    "", " ", "htp:/x", "sqlite:/x", "sqlite://", "http://", "http:/host", "https://:5000",
    "http://host:port", "ftp://host", "file://remote/x", "postgresql://",
])
def test_bad_tracking_uris(uri):
    with pytest.raises(InputError) as info:
        validate_tracking_uri(uri)
    assert str(info.value).startswith(f"malformed tracking URI {uri!r}")


def test_plain_decoding_may_capture_the_whole_step(tmp_path):
    # speculation: none has no tree build and no accept walk, so graph_capture full is valid
    # whatever tree_build / accept say; a speculative cell with the same knobs is not.
    path = tmp_path / "ar.yaml"
    path.write_text("name: ar\nmatrix:\n  speculation: [none]\n  graph_capture: [full]\n")
    [cell] = load_scenario(path).cells()
    assert cell["speculation"] == "none" and cell["graph_capture"] == "full"
    path.write_text("name: ar\nmatrix:\n  speculation: [ddtree]\n  graph_capture: [full]\n")
    with pytest.raises(InputError, match="graph_capture 'full'"):
        load_scenario(path)


# -- implementation knobs -------------------------------------------------------------------------


def test_impl_knobs_leave_default_ids_alone_and_make_new_cells(tmp_path):
    cells = load(tmp_path, """
        name: x
        defaults: {model: qwen3-8b, device: cuda, tree_build: gpu, accept: gpu}
        matrix:
          fused_ops: [auto, false, true]
          tree_build_impl: [auto, cuda]
        """).cells()
    assert len(cells) == 6 and len({params.cell_id(c) for c in cells}) == 6
    auto = next(c for c in cells if c["fused_ops"] == "auto" and c["tree_build_impl"] == "auto")
    # The cell that leaves the kernels to the harness has the id it had before the knobs
    # existed (the gate tells it from an older baseline by the kernels each recorded) ...
    before = {k: v for k, v in auto.items() if k not in params.IMPL_DEFAULTS}
    assert params.cell_id(auto) == params.cell_id(before)
    assert "fused_ops" not in params.cell_label(auto)
    # ... and a cell that names a kernel is another cell, even the kernel auto picks.
    off = next(c for c in cells if c["fused_ops"] is False and c["tree_build_impl"] == "auto")
    assert params.cell_label(off).endswith("fused_ops=false")
    both = next(c for c in cells if c["fused_ops"] is True and c["tree_build_impl"] == "cuda")
    assert params.cell_label(both).endswith("fused_ops tree_build_impl=cuda")


def test_a_number_is_not_a_flag_value(tmp_path):
    message = error(tmp_path, """
        name: x
        matrix:
          fused_ops: [1]
        """)
    assert "unknown fused_ops '1' (allowed: auto, true, false)" in message


def test_impl_knob_on_a_cpu_cell(tmp_path):
    assert error(tmp_path, """
        name: x
        defaults: {device: cpu}
        matrix:
          topk_impl: [torch, triton]
        """) == ("s.yaml:4:22: topk_impl triton picks CUDA kernels; this cell runs on device "
                 "'cpu' (leave it auto)")


def test_tree_build_impl_needs_the_gpu_tree_build(tmp_path):
    assert error(tmp_path, """
        name: x
        defaults: {device: cuda, tree_build: cpu}
        matrix:
          tree_build_impl: [cuda]
        """) == ("s.yaml:4:21: tree_build_impl picks the kernel of tree_build: gpu; this cell "
                 "builds its trees on the host (tree_build: cpu)")


def test_unknown_impl_value(tmp_path):
    message = error(tmp_path, """
        name: x
        matrix:
          fused_ops: [maybe]
        """)
    assert message.startswith("s.yaml:3:15:") and "(allowed: auto, true, false)" in message
