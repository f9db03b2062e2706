"""Inputs that would cost without bound: every one stops with one `file:line:column` line.

Alias and merge bombs, deep nesting, huge matrices, huge names and numbers, non-UTF-8 bytes:
each is refused while it is read (harness.sweep.yamldoc's Budget, the scenario's cell cap and value
bounds), by the real `harness validate` where it matters that nothing hangs or prints a
traceback. How long each takes is recorded by benchmarks/input_budgets.py, not asserted here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.hosts.inventory import load_hosts
from harness.protocol.errors import InputError
from harness.sweep.scenario import DEFAULT_MAX_CELLS, load_scenario
from harness.sweep.yamldoc import DEFAULT_BUDGET

REPO = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 60      # a hang is a failure; the real cost is well under a second

MINIMAL = "name: s\nmatrix:\n  workload: [noop]\n"


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """The billion-laughs document: `width ** levels` strings from a few hundred bytes."""
    lines = ["name: s", "a0: &a0 [lol]"]
    for i in range(1, levels + 1):
        refs = ", ".join([f"*a{i - 1}"] * width)
        lines.append(f"a{i}: &a{i} [{refs}]")
    lines.append(f"matrix: {{workload: [noop], tau: *a{levels}}}")
    return "\n".join(lines) + "\n"


def merge_bomb(levels: int = 12) -> str:
    """Merge keys copy mappings: each level doubles the pairs of the one before."""
    lines = ["name: s", "m0: &m0 {a: 1, b: 2}"]
    for i in range(1, levels + 1):
        lines.append(f"m{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 1}, *m{i - 1}, *m{i - 1}]}}")
    lines.append("matrix: {workload: [noop]}")
    return "\n".join(lines) + "\n"


def validate(path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", "validate", str(path), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    """The single stderr line of a refused input (exit 2, no traceback)."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def refused(path: Path, **kw) -> str:
    with pytest.raises(InputError) as info:
        load_scenario(path, **kw)
    return str(info.value).replace(str(path), "s.yaml")


# --- the document itself ---------------------------------------------------------------------

def test_alias_bomb_stops_at_its_line(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(alias_bomb())
    line = one_line_error(validate(path))
    assert line.startswith(f"error: {path}:")
    assert "aliases are expanded" in line


def test_merge_bomb_stops(tmp_path):
    # PyYAML >= 6.0.2 merges each key once, which keeps this bomb small; older ones copy every
    # pair, and the budget stops them instead. Either way: one line (here the schema's, about
    # the unknown top-level keys), no hang.
    path = tmp_path / "s.yaml"
    path.write_text(merge_bomb())
    line = one_line_error(validate(path))
    assert "merge keys expand this mapping" in line or "unknown key 'm0'" in line


@pytest.mark.parametrize("style", ["flow", "block"])
def test_deep_nesting_is_one_line_not_a_recursion_error(tmp_path, style):
    depth = 5000
    if style == "flow":
        text = "name: s\nmatrix: {workload: [noop]}\nx: " + "[" * depth + "]" * depth + "\n"
    else:
        text = "name: s\nmatrix: {workload: [noop]}\nx:\n  " + "- " * depth + "deep\n"
    path = tmp_path / "s.yaml"
    path.write_text(text)
    line = one_line_error(validate(path))
    assert f"nested more than {DEFAULT_BUDGET.max_depth} levels deep" in line
    assert "RecursionError" not in line
    assert f":{3 if style == 'flow' else 4}:" in line   # where the nesting passes the limit


def test_an_ordinary_alias_still_works(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: s\ndefaults: &d {seed: 3}\nmatrix:\n  workload: [noop]\n"
                    "include:\n  - {<<: *d, workload: noop, batch_size: 2}\n")
    assert [c["seed"] for c in load_scenario(path).cells()] == [3, 3]


def test_a_huge_file_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(MINIMAL + "# " + "x" * DEFAULT_BUDGET.max_bytes + "\n")
    assert "larger than 512 KiB" in refused(path)


def test_a_huge_value_is_refused_at_its_line(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(f"name: s\ndescription: {'d' * 100_000}\nmatrix: {{workload: [noop]}}\n")
    assert refused(path) == ("s.yaml:2:14: a value of 100000 characters: at most "
                             f"{DEFAULT_BUDGET.max_scalar_chars} are allowed")


def test_non_utf8_byte_is_reported_at_its_line_and_column(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_bytes(b"name: s\nmatrix:\n  workload: [n\xe9oop]\n")
    line = one_line_error(validate(path))
    assert f"{path}:3:15: not UTF-8 text: byte 0xe9" in line


def test_non_utf8_column_counts_characters(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_bytes("description: ñé \n".encode() + b"\xff\n")
    assert refused(path).startswith("s.yaml:2:1: not UTF-8 text: byte 0xff")
    path.write_bytes("description: ñé ".encode() + b"\xff\n")
    assert refused(path).startswith("s.yaml:1:17: not UTF-8 text")


# --- the scenario's values -------------------------------------------------------------------

def test_a_million_cells_are_counted_not_built(tmp_path):
    path = tmp_path / "s.yaml"
    values = ", ".join(str(v) for v in range(1, 101))
    path.write_text(f"name: s\nmatrix:\n  workload: [noop]\n  context_length: [{values}]\n"
                    f"  batch_size: [{values}]\n  seed: [{values}]\n")
    line = one_line_error(validate(path))
    assert f"{path}:2:1: the matrix expands to 1,000,000 cells" in line
    assert f"more than the cap of {DEFAULT_MAX_CELLS:,}" in line
    assert "pass --max-cells 1000000" in line


def test_the_cell_cap_is_raised_on_purpose(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: s\nmatrix:\n  workload: [noop]\n  seed: [1, 2, 3]\n"
                    "include:\n  - {workload: noop, seed: 9}\n")
    assert "expands to 4 cells" in refused(path, max_cells=3)
    assert len(load_scenario(path, max_cells=4).cells()) == 4
    line = one_line_error(validate(path, "--max-cells", "3"))
    assert "--max-cells 4" in line
    proc = validate(path, "--max-cells", "4")
    assert proc.returncode == 0, proc.stderr
    assert "4 cell(s)" in proc.stdout


def test_a_seed_past_32_bits_is_refused_where_it_is_written(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(f"name: s\nmatrix:\n  workload: [noop]\n  seed: [1, {10**29}]\n")
    assert refused(path) == "s.yaml:4:13: seed must be at most 4294967295, got an integer of 30 digits"


def test_counts_stop_at_int32(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(f"name: s\nmatrix:\n  workload: [noop]\ndefaults:\n  repeats: {2**31}\n")
    assert refused(path) == "s.yaml:5:12: repeats must be at most 2147483647, got 2147483648"


def test_a_long_name_is_refused(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(f"name: {'n' * 5000}\nmatrix: {{workload: [noop]}}\n")
    assert refused(path) == "s.yaml:1:7: name is 5000 characters long: at most 200 are allowed"


def test_a_name_with_control_characters_is_refused(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text('name: "bench\\e[31mmark"\nmatrix: {workload: [noop]}\n')
    assert "name must not contain control characters" in refused(path)


# --- the hosts file reads under the same budget ----------------------------------------------

def test_hosts_file_alias_bomb_and_bad_byte(tmp_path):
    path = tmp_path / "hosts.yaml"
    levels = "\n".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10))
    path.write_text(f"a0: &a0 [x]\n{levels}\nhosts: {{}}\n")
    with pytest.raises(InputError, match="aliases are expanded"):
        load_hosts(path)
    path.write_bytes(b"hosts:\n  gpu1: {ssh: h\xff}\n")
    with pytest.raises(InputError, match=r"hosts.yaml:2:16: not UTF-8 text"):
        load_hosts(path)
    path.write_text("")
    assert list(load_hosts(path)) == ["local"]     # an empty hosts file is still just local
