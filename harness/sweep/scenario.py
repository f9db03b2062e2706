"""Scenarios: load a YAML sweep, validate it, expand its matrix into cells.

A scenario names an MLflow experiment and describes a set of cells (harness.protocol.params): shared
`defaults`, a `matrix` whose cartesian product gives the cells, `exclude` entries that drop
cells, and `include` entries that add cells (a scenario may list all of its cells there and
have no matrix). Every mistake becomes an `InputError` that points at the YAML node
responsible (`file:line:column: message`), never a traceback.

How it works:
1. `harness.sweep.yamldoc` reads the YAML under a budget (size, depth, alias expansions) into plain
   data, remembering where every value and every mapping key starts (keyed by its data path,
   e.g. ('matrix', 'tau', 2)).
2. pydantic models check the shape and the value of every parameter; each pydantic error is
   mapped back to its node through that data path.
3. `_expand` counts the cells before it builds them (at most `max_cells`, DEFAULT_MAX_CELLS
   unless the caller raises it on purpose), remembering which node set each value, so the
   checks that need a whole cell (context vs. model limit, impossible combinations, ...: each
   workload declares its own, harness/protocol/workloads/) point at the right node.

The controller never imports torch: this module needs only the standard library, PyYAML and
pydantic.
"""

from __future__ import annotations

import difflib
import itertools
import math
import os
import re
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StrictBool,
                      ValidationError, create_model)
from pydantic_core import PydanticCustomError

from harness.protocol import params, workloads
from harness.protocol.errors import InputError
from harness.sweep.cellfilter import cell_matcher
from harness.sweep.yamldoc import DataPath, EmptyDocument, Source, read_text, read_yaml, show

# The most cells a scenario may expand to unless the caller raises it (`--max-cells`): a
# nightly sweep of every mode, capture and context is a few hundred; a million is a typo.
DEFAULT_MAX_CELLS = 10_000

TRIGGERS = ("manual", "nightly", "pr")
METRIC_DIRECTIONS = ("higher", "lower")
GPU_BUSY_POLICIES = ("wait", "noisy")
TARGET_OF = ("each", "sum")      # a target bounds each selected cell's value, or their sum


# --------------------------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------------------------

# Strict: "abc" or 1.5 is not an int, "true" is not a bool, 5 is not a string. Ints are still
# accepted where a float is expected.
_STRICT = ConfigDict(extra="forbid", strict=True)

# Integers stop where the kernels' int32 indices and sizes do (harness.protocol.workloads).
INT_MAX = workloads.INT_MAX
SEED_MAX = workloads.SEED_MAX
NAME_MAX_CHARS = 200      # an MLflow experiment name, shown in tables and titles


def _number_is_not_a_bool(value: Any) -> Any:
    """A Literal of True and False also matches 1 and 0: refuse them, as StrictBool does (the
    string is what the error then shows)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return value


def _matching_whole(pattern: str) -> AfterValidator:
    """A Param's `pattern` matched against the whole value, as hosts.yaml matches it
    (harness/hosts/inventory.py, re.fullmatch): pydantic's own `pattern` only searches, so
    `/\\S*` would pass `a/b`. The error keeps pydantic's kind, so it reads like any other
    (`<name> must be <what>, got ...`)."""
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if compiled.fullmatch(value) is None:
            raise PydanticCustomError("string_pattern_mismatch",
                                      "String should match pattern '{pattern}'",
                                      {"pattern": pattern})
        return value
    return AfterValidator(check)


def _param_type(name: str) -> Any:
    """The pydantic type of a cell parameter, from its declaration (harness.protocol.params
    for the general ones, harness/protocol/workloads/ for each workload's)."""
    p = params.PARAMS[name]
    if p.choices:
        if any(isinstance(c, bool) for c in p.choices):   # e.g. fused_ops: auto | true | false
            return Annotated[Literal[p.choices], BeforeValidator(_number_is_not_a_bool)]
        return Literal[p.choices]
    if p.type is bool:
        return StrictBool
    bounds = {k: v for k, v in (("ge", p.ge), ("gt", p.gt), ("le", p.le), ("lt", p.lt))
              if v is not None}
    if p.type is int:
        kind = Annotated[int, Field(**bounds)]
    elif p.type is float:      # always finite; ints are accepted too
        kind = Annotated[float, Field(**bounds, allow_inf_nan=False)]
    elif p.type is str:
        kind = Annotated[str, _matching_whole(p.pattern)] if p.pattern else str
    else:
        raise RuntimeError(f"cell parameter {name}: unsupported type {p.type!r}")
    return kind | None if p.nullable else kind


# All fields default to None and are left out with `exclude_unset`, so "not given" (use the
# default) stays distinct from an explicit `checkpoint: null`.
CellParams = create_model(
    "CellParams", __config__=_STRICT,
    **{name: (_param_type(name), None) for name in params.ALL_PARAMS})

MatrixParams = create_model(
    "MatrixParams", __config__=_STRICT,
    **{name: (Annotated[list[_param_type(name)], Field(min_length=1)], None)
       for name in params.ALL_PARAMS})


class MetricPolicy(BaseModel):
    """How the regression gate treats one metric (used by the gate, validated here)."""

    model_config = _STRICT
    direction: Literal[METRIC_DIRECTIONS] | None = None
    threshold_rel: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    threshold_abs: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    gate: bool | None = None        # false: reported beside the gate, never decides it


class TargetSpec(BaseModel):
    """An absolute bound on what some cells measure (harness.sweep.targets judges it)."""

    model_config = _STRICT
    name: Annotated[str, Field(min_length=1, max_length=NAME_MAX_CHARS,
                               pattern=r"^[^\x00-\x1f\x7f]*$")] | None = None
    cells: Annotated[str, Field(min_length=1)]          # a -k expression over the scenario's cells
    metric: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.]*$")]
    min: Annotated[float, Field(allow_inf_nan=False)] | None = None
    max: Annotated[float, Field(allow_inf_nan=False)] | None = None
    of: Literal[TARGET_OF] = "each"
    per: Annotated[str, Field(min_length=1)] | None = None   # one cell: the values are ratios to its


class ScenarioSpec(BaseModel):
    """The top level of a scenario file."""

    model_config = _STRICT
    # No control characters: the name is printed in terminals, tables and HTML titles.
    name: Annotated[str, Field(min_length=1, max_length=NAME_MAX_CHARS,
                               pattern=r"^[^\x00-\x1f\x7f]*$")]
    description: str | None = None
    trigger: Literal[TRIGGERS] = "manual"
    defaults: CellParams = Field(default_factory=CellParams)
    # None: the scenario lists its cells under `include` alone (harness ingest writes such)
    matrix: MatrixParams | None = None
    exclude: list[CellParams] = Field(default_factory=list)
    include: list[CellParams] = Field(default_factory=list)
    # Host names, or label filters ({gpu: h200}: every inventory host with those labels).
    hosts: list[str | Annotated[dict[str, str | int | float | bool], Field(min_length=1)]] = \
        Field(default_factory=list)
    gpu_busy: Literal[GPU_BUSY_POLICIES] | None = None   # overrides each host's policy
    metrics: dict[str, MetricPolicy] = Field(default_factory=dict)
    targets: list[TargetSpec] = Field(default_factory=list)


_TOP_WHAT = {
    "name": "a non-empty string (the MLflow experiment name)",
    "description": "a string",
    "defaults": "a mapping of cell parameters",
    "matrix": "a mapping of cell parameter -> list of values",
    "exclude": "a list of mappings of cell parameters",
    "include": "a list of mappings of cell parameters",
    "hosts": "a list of host names or label filters like {gpu: h200}",
    "gpu_busy": "wait or noisy (what a cell does when its GPU has a foreign process)",
    "metrics": "a mapping of metric name -> policy",
    "targets": "a list of targets (cells, metric, min and/or max)",
}
_TARGET_WHAT = {"name": "a one-line string", "cells": "a cell filter expression like "
                "'verify_mode=custom and context_length=65536'",
                "metric": "a metric name like tokens_per_s", "min": "a number", "max": "a number",
                "per": "a cell filter expression that selects one cell"}
_METRIC_WHAT = {"threshold_rel": "a number >= 0", "threshold_abs": "a number >= 0",
                "gate": "true or false (false: reported, never decides the gate)"}
_CELL_SECTIONS = ("defaults", "matrix", "exclude", "include")


# --------------------------------------------------------------------------------------------
# pydantic errors -> InputError at the right node
# --------------------------------------------------------------------------------------------

class _Field(NamedTuple):
    """What an error message says about the value at a location."""

    label: str                 # how the message names it, e.g. `context_length`, `hosts[2]`
    what: str = ""             # what it must be, e.g. `a positive integer`
    choices: tuple = ()        # allowed values of an enumeration


def _describe(loc: DataPath) -> _Field:
    """Name and expectation of the value at pydantic location `loc` (a data path)."""
    if not loc:
        return _Field("the scenario", "a mapping with at least 'name' and 'matrix'")
    section, rest = loc[0], loc[1:]
    if not rest:
        return _Field(section, _TOP_WHAT.get(section, ""), TRIGGERS if section == "trigger" else ())
    if section == "hosts":
        return _Field(f"hosts[{rest[0]}]", "a host name or a non-empty mapping of labels "
                                            "like {gpu: h200}")
    if section == "metrics":
        if len(rest) == 1:
            return _Field(f"metrics.{rest[0]}", "a mapping of direction, threshold_rel, "
                                                "threshold_abs, gate")
        key = rest[1]
        return _Field(key, _METRIC_WHAT.get(key, ""),
                      METRIC_DIRECTIONS if key == "direction" else ())
    if section == "targets":
        if len(rest) == 1:
            return _Field(f"targets[{rest[0]}]", "a mapping of cells, metric, min, max, of, per, name")
        key = rest[1]
        return _Field(f"targets[{rest[0]}].{key}", _TARGET_WHAT.get(key, ""),
                      TARGET_OF if key == "of" else ())
    if section in ("exclude", "include"):
        if len(rest) == 1:
            return _Field(f"{section}[{rest[0]}]", "a mapping of cell parameters")
        rest = rest[1:]
    if section == "matrix" and len(rest) == 1:
        return _Field(f"matrix.{rest[0]}", "a non-empty list of values")
    name = rest[0]
    declared = params.PARAMS.get(name)
    return _Field(name, declared.what, declared.choices) if declared else _Field(name)


def _allowed_keys(parent: DataPath) -> list[str]:
    if not parent:
        return list(ScenarioSpec.model_fields)
    if parent[0] == "metrics":
        return list(MetricPolicy.model_fields)
    if parent[0] == "targets":
        return list(TargetSpec.model_fields)
    return list(params.ALL_PARAMS)


def _did_you_mean(word: Any, candidates) -> str:
    close = difflib.get_close_matches(str(word), [str(c) for c in candidates], n=1)
    return f"did you mean '{close[0]}'?" if close else ""


def _pydantic_error(err: dict, source: Source) -> InputError:
    loc = tuple(err["loc"])
    kind = err["type"]
    if kind == "missing":
        return source.error(loc[:-1], f"missing required key '{loc[-1]}'")
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1])
        hint = _did_you_mean(loc[-1], allowed) or "expected one of: " + ", ".join(allowed)
        return source.error(loc, f"unknown key '{loc[-1]}' ({hint})", key=True)
    described = _describe(loc)
    if kind == "less_than_equal" and isinstance(err["input"], int):    # INT_MAX, SEED_MAX
        return source.error(loc, f"{described.label} must be at most {err['ctx']['le']}, "
                                 f"got {show(err['input'])}")
    if kind == "string_too_long":
        return source.error(loc, f"{described.label} is {len(err['input'])} characters long: "
                                 f"at most {err['ctx']['max_length']} are allowed")
    if kind == "string_pattern_mismatch" and loc == ("name",):
        return source.error(loc, "name must not contain control characters (tabs, line "
                                 "breaks, escapes)")
    if kind == "literal_error" and described.choices:
        hint = _did_you_mean(err["input"], described.choices)
        allowed = "allowed: " + ", ".join(workloads.yaml_word(c) for c in described.choices) + (
            f"; {hint}" if hint else "")
        return source.error(loc, f"unknown {described.label} {show(err['input'])} ({allowed})")
    if described.what:
        return source.error(loc, f"{described.label} must be {described.what}, "
                                 f"got {show(err['input'])}")
    return source.error(loc, f"{described.label}: {err['msg']}")


def _first_schema_error(exc: ValidationError, source: Source) -> InputError:
    """The error that comes first in the file, so fixing errors top-down converges.

    Missing keys go last: they sit at their parent mapping, ahead of everything inside it, yet
    are often explained by a misspelt key further down ("unknown key 'matrx'").
    """
    ranked = [(err["type"] == "missing", _pydantic_error(err, source)) for err in exc.errors()]
    return min(ranked, key=lambda r: (r[0], r[1].line or 0, r[1].column or 0))[1]


# --------------------------------------------------------------------------------------------
# Expansion and whole-cell checks
# --------------------------------------------------------------------------------------------

@dataclass
class _Draft:
    """A cell before canonicalisation, and the data path of the node that set each value."""

    values: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, DataPath] = field(default_factory=dict)

    def with_values(self, values: dict[str, Any], origin: dict[str, DataPath]) -> "_Draft":
        return _Draft({**self.values, **values}, {**self.origin, **origin})

    def where(self, *names: str) -> DataPath:
        """Where the first of `names` that the scenario sets was set (else the root)."""
        for name in names:
            if name in self.origin:
                return self.origin[name]
        return ()


def _matches(cell: dict, entry: dict) -> bool:
    # A key of another workload (work_us on a decode cell) is absent, so it does not match.
    return all(key in cell and cell[key] == value for key, value in entry.items())


def _expand(spec: ScenarioSpec, source: Source, max_cells: int) -> list[_Draft]:
    """Defaults x matrix product, minus excluded cells, plus included ones (in that order)."""
    defaults = spec.defaults.model_dump(exclude_unset=True)
    base = _Draft(defaults, {name: ("defaults", name) for name in defaults})

    matrix = spec.matrix.model_dump(exclude_unset=True) if spec.matrix is not None else {}
    # Keys in the order the file gives them, so the first key varies slowest.
    keys = [key for key in source.data.get("matrix") or {} if key in matrix]
    excludes = [entry.model_dump(exclude_unset=True) for entry in spec.exclude]

    # Counted before anything is built: the product of a few long lists is astronomically large.
    product = math.prod(len(matrix[key]) for key in keys) if spec.matrix is not None else 0
    count = product + len(spec.include)
    if count > max_cells:
        raise source.error(("matrix",), key=True, message=f"the matrix expands to {count:,} cells (before "
                                        f"exclude), more than the cap of {max_cells:,}; "
                                        f"pass --max-cells {count} to run that many on purpose")

    drafts = []
    # (The product of no lists is one empty combination: without a matrix there is none.)
    combos = itertools.product(*(list(enumerate(matrix[key])) for key in keys)) if product else ()
    for combo in combos:
        draft = base.with_values(
            {key: value for key, (_, value) in zip(keys, combo)},
            {key: ("matrix", key, index) for key, (index, _) in zip(keys, combo)})
        cell = params.canonical(draft.values)
        if not any(_matches(cell, entry) for entry in excludes):
            drafts.append(draft)

    for j, entry in enumerate(spec.include):
        values = entry.model_dump(exclude_unset=True)
        drafts.append(base.with_values(values, {name: ("include", j, name) for name in values}))
    return drafts


def _check_structure(spec: ScenarioSpec, source: Source) -> None:
    """Shape problems pydantic cannot express: no matrix and no listed cells, an empty
    matrix, an exclude that drops all."""
    if spec.matrix is None:
        if not spec.include:
            raise source.error((), "missing required key 'matrix'")
    elif not spec.matrix.model_fields_set:
        raise source.error(("matrix",), "matrix is empty: give at least one cell parameter "
                                        "with a list of values")
    for j, entry in enumerate(spec.exclude):
        if not entry.model_fields_set:
            raise source.error(("exclude", j), "empty exclude entry: it would drop every cell")


def _check_workload_params(draft: _Draft, cell: dict, source: Source) -> None:
    """A workload's own parameter (params.WORKLOAD_PARAMS) set on a cell of another workload."""
    for name in draft.values:
        owner = next((w for w, own in params.WORKLOAD_PARAMS.items() if name in own), None)
        if owner is not None and owner != cell["workload"]:
            raise source.error(draft.where(name),
                               f"{name} is a parameter of workload '{owner}' only; this cell "
                               f"runs workload '{cell['workload']}'")


def _check_whole_cell(draft: _Draft, cell: dict, source: Source) -> None:
    """The whole-cell checks: the general parameters' (params.GENERAL_CHECKS), then those the
    workloads declare (harness/protocol/workloads/): every workload's `shared_checks` (of the
    parameters every cell has), then the cell's own workload's `checks`. A check blames
    parameters; the error points at the first of them the scenario sets."""
    specs = workloads.SPECS
    own = specs[cell["workload"]].checks
    shared = [c for spec in specs.values() for c in spec.shared_checks]
    for check in list(params.GENERAL_CHECKS) + shared + list(own):
        problem = check(cell)
        if problem is not None:
            blamed, message = problem
            raise source.error(draft.where(*blamed), message)


def _resolve_checkpoint(draft: _Draft, cell: dict, source: Source, base_dir: Path) -> None:
    """Make a relative checkpoint path absolute (against the scenario's folder); it must exist."""
    if cell["checkpoint"] is None:
        return
    given = cell["checkpoint"]
    resolved = Path(os.path.expanduser(given))
    if not resolved.is_absolute():
        resolved = base_dir / resolved
    resolved = Path(os.path.abspath(resolved))
    if not resolved.exists():
        raise source.error(draft.where("checkpoint"),
                           f"checkpoint '{given}' does not exist (looked for {resolved})")
    draft.values["checkpoint"] = str(resolved)


def _finish_cells(drafts: list[_Draft], source: Source,
                  base_dir: Path) -> tuple[list[dict], dict[str, frozenset]]:
    """Check each cell as a whole and return the canonical cells, duplicates dropped, and by
    cell id the parameters the scenario itself sets on it."""
    cells: dict[str, dict] = {}
    given: dict[str, frozenset] = {}
    for draft in drafts:
        cell = params.canonical(draft.values)
        _check_workload_params(draft, cell, source)
        _check_whole_cell(draft, cell, source)
        _resolve_checkpoint(draft, cell, source, base_dir)
        cell = params.canonical(draft.values)
        cid = params.cell_id(cell)
        cells.setdefault(cid, cell)
        given[cid] = given.get(cid, frozenset()) | frozenset(draft.values)
    return list(cells.values()), given


def _check_target_bounds(targets: list[TargetSpec], source: Source) -> None:
    """What a target's keys cannot say alone: a bound, min <= max, not both `of: sum` and `per`."""
    for i, target in enumerate(targets):
        where = ("targets", i)
        if target.min is None and target.max is None:
            raise source.error(where, f"targets[{i}] needs a bound: min, max or both")
        if target.min is not None and target.max is not None and target.min > target.max:
            raise source.error(where + ("min",), f"targets[{i}].min {target.min:g} is above its "
                                                 f"max {target.max:g}")
        if target.per is not None and target.of == "sum":
            raise source.error(where + ("per",), f"targets[{i}]: per (each value over one cell's) "
                                                 "and of: sum do not go together")


def _check_targets(spec: ScenarioSpec, source: Source, cells: list[dict]) -> None:
    """The targets' bounds, and expressions that parse and select some of this scenario's cells
    (`per`: one), so a typo never makes a target that no run can meet."""
    _check_target_bounds(spec.targets, source)
    for i, target in enumerate(spec.targets):
        where = ("targets", i)
        for key, wanted in (("cells", None), ("per", 1)):
            expr = getattr(target, key)
            if expr is None:
                continue
            try:
                selects = cell_matcher(expr, f"targets[{i}].{key}")
            except InputError as e:
                raise source.error(where + (key,), e.message) from None
            count = sum(selects(c) for c in cells)
            if count == 0 or (wanted is not None and count != wanted):
                need = "one" if wanted else "at least one"
                raise source.error(where + (key,), f"targets[{i}].{key} {expr!r} selects {count} of "
                                                   f"the scenario's {len(cells)} cells, not {need}")


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------

class Scenario:
    """A validated scenario. `cells()` gives its expanded cells, canonical and de-duplicated."""

    def __init__(self, *, name: str, description: str | None, trigger: str, path: str | None,
                 text: str, hosts: list, metrics: dict[str, dict], cells: list[dict],
                 gpu_busy: str | None = None, given: dict[str, frozenset] | None = None,
                 targets: list[dict] | None = None):
        self.name = name
        self.description = description
        self.trigger = trigger
        self.path = path
        self.text = text          # the raw YAML, e.g. to log as an MLflow artifact
        self.hosts = hosts        # names and label filters (dicts); empty: not chosen here
        self.gpu_busy = gpu_busy  # None: each host's own policy (hosts.yaml)
        self.metrics = metrics    # metric name -> {direction, threshold_rel, threshold_abs}
        self.targets = targets or []   # {name, cells, metric, min, max, of, per}: harness.sweep.targets
        self._cells = cells
        self._given = given or {}

    def given(self, cell: dict) -> frozenset:
        """The parameters the scenario itself sets on `cell` (its defaults:, matrix or include
        entry); the rest of the canonical cell is defaults. A host's declared service values
        meet a cell's by this (harness.protocol.deployment)."""
        return self._given.get(params.cell_id(cell), frozenset())

    def cells(self) -> list[dict]:
        """Canonical cells in matrix order (first matrix key slowest), then include entries."""
        return [dict(cell) for cell in self._cells]

    def cell_ids(self) -> list[str]:
        return [params.cell_id(cell) for cell in self._cells]

    def __repr__(self) -> str:
        return f"Scenario(name={self.name!r}, path={self.path!r}, cells={len(self._cells)})"


def parse_scenario(text: str, path: str | os.PathLike | None = None, *,
                   max_cells: int | None = None) -> Scenario:
    """Validate scenario YAML `text`; `path` names it in errors and anchors relative paths.

    At most `max_cells` cells (DEFAULT_MAX_CELLS if None), counted before exclude; more is an
    InputError at the matrix.
    """
    shown_path = None if path is None else str(path)
    try:
        source = read_yaml(text, shown_path)
    except EmptyDocument:
        raise InputError(shown_path, None, None, "empty scenario file: expected a mapping with "
                         "at least 'name' and 'matrix'") from None
    try:
        spec = ScenarioSpec.model_validate(source.data)
    except ValidationError as exc:
        raise _first_schema_error(exc, source) from None
    _check_structure(spec, source)

    drafts = _expand(spec, source, max_cells or DEFAULT_MAX_CELLS)
    if not drafts:
        raise source.error(("exclude",), "exclude drops every cell of the matrix: nothing to run")
    base_dir = Path(shown_path).parent if shown_path else Path.cwd()
    cells, given = _finish_cells(drafts, source, base_dir)
    _check_targets(spec, source, cells)

    return Scenario(
        name=spec.name, description=spec.description, trigger=spec.trigger, path=shown_path,
        text=text, hosts=list(spec.hosts), gpu_busy=spec.gpu_busy,
        metrics={name: policy.model_dump() for name, policy in spec.metrics.items()},
        cells=cells, given=given, targets=[t.model_dump() for t in spec.targets])


class _TargetsOnly(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    targets: list[TargetSpec] = Field(default_factory=list)


def parse_targets(text: str, path: str | os.PathLike | None = None) -> list[dict]:
    """The `targets` of scenario YAML `text`, their keys and bounds checked and nothing else: a
    stored run's scenario, which this code may no longer expand (a kernel since removed), still
    has its targets read. The expressions are judged against the run's results instead
    (harness.sweep.targets)."""
    shown_path = None if path is None else str(path)
    try:
        source = read_yaml(text, shown_path)
    except EmptyDocument:
        return []
    if not isinstance(source.data, dict):
        return []
    try:
        spec = _TargetsOnly.model_validate(source.data)
    except ValidationError as exc:
        raise _first_schema_error(exc, source) from None
    _check_target_bounds(spec.targets, source)
    return [t.model_dump() for t in spec.targets]


def load_scenario(path: str | os.PathLike, *, max_cells: int | None = None) -> Scenario:
    """Read and validate the scenario file at `path` (see parse_scenario)."""
    return parse_scenario(read_text(path, "scenario"), str(path), max_cells=max_cells)


# --------------------------------------------------------------------------------------------
# Tracking URI
# --------------------------------------------------------------------------------------------

_TRACKING_URI_FORMS = ("sqlite:///PATH, http(s)://HOST[:PORT], file:///PATH or a local path, "
                       "postgresql://..., mysql://..., mssql://..., databricks")
_DATABASE_SCHEMES = ("postgresql", "mysql", "mssql")  # each optionally `+driver`, as SQLAlchemy


def _tracking_uri_problem(uri: str) -> str | None:
    """Why `uri` is not a tracking URI MLflow understands, or None if it looks fine."""
    if not uri or uri != uri.strip():
        return "empty or surrounded by spaces"
    if re.match(r"^[A-Za-z]:[\\/]", uri):  # a Windows drive path, not a one-letter scheme
        return None
    scheme, sep, rest = uri.partition(":")
    if not sep or "/" in scheme or "\\" in scheme:
        return None  # a plain local path
    scheme = scheme.lower()
    if scheme == "databricks":
        return None if rest == "" or re.fullmatch(r"//[^/\s]+", rest) else "bad databricks profile"
    if scheme == "sqlite":
        return None if re.fullmatch(r"///.+", rest) else "an SQLite URI is sqlite:///PATH"
    if scheme == "file":
        parsed = urllib.parse.urlparse(uri)
        if parsed.netloc in ("", "localhost") and parsed.path and rest.startswith("/"):
            return None
        return "a file URI is file:///ABSOLUTE/PATH"
    if scheme in ("http", "https"):
        return _http_problem(uri)
    if scheme.split("+", 1)[0] in _DATABASE_SCHEMES:
        return None if rest.startswith("//") and len(rest) > 2 else "no database after //"
    return f"unknown scheme '{scheme}'"


def _http_problem(uri: str) -> str | None:
    parsed = urllib.parse.urlparse(uri)
    if not uri.lower().startswith(parsed.scheme + "://"):
        return "expected http(s)://HOST[:PORT]"
    if not parsed.hostname:
        return "no host"
    try:
        parsed.port  # noqa: B018 -- raises on a non-numeric or out-of-range port
    except ValueError:
        return "bad port"
    return None


def validate_tracking_uri(uri: str) -> str:
    """Return `uri` if it is a tracking URI MLflow can use; raise InputError otherwise."""
    problem = _tracking_uri_problem(uri) if isinstance(uri, str) else "not a string"
    if problem:
        raise InputError(None, None, None,
                         f"malformed tracking URI {uri!r}: {problem} (expected {_TRACKING_URI_FORMS})")
    return uri
