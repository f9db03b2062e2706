"""What each workload declares, one module per workload, found by listing this package.

A module here (noop.py, calibrate.py, kernel.py, decode.py, ...) defines `SPEC = WorkloadSpec(...)`:
its parameters with their defaults, types and the "what it must be" of error messages; the
checks a whole cell of it must pass; its label; the gate policies of the metrics it reports; and
the import path of its runner on the worker (docs/ADDING_A_WORKLOAD.md). Everything here is the
standard library and plain data, so the controller validates cells, names them and picks gate
policies without importing worker code or torch, and the worker reads the same declarations.

`SPECS` is the registry, name -> spec, in `order` (then name): nothing lists the workloads by hand,
so a new workload is a new module here (and its runner under harness/worker/workloads/).
harness.protocol.params builds the cell schema (WORKLOADS, DEFAULTS, WORKLOAD_PARAMS, ...) from
it, harness.sweep.scenario the pydantic models and whole-cell checks, harness.gate.policy the
default policies, harness.worker.workloads the runners.

Spec modules import only the standard library, this package and harness.protocol.presets (never
harness.protocol.params, which imports them).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

# Integers stop where the kernels' int32 indices and sizes do: a larger count is a typo, and
# one that validated would fail only inside a worker.
INT_MAX = 2**31 - 1
SEED_MAX = 2**32 - 1      # every generator the workers seed takes 32 bits

# A whole-cell check: the canonical cell -> None (fine) or (names, message): the parameters to
# blame (the error points at the first of them the scenario sets, else at the scenario) and the
# one-line message.
Check = Callable[[dict], "tuple[tuple[str, ...], str] | None"]


@dataclass(frozen=True)
class Param:
    """One cell parameter: its default and the values a scenario may give it.

    Either `choices` (an enumeration) or a `type`: bool, int, float (always finite; an int is
    accepted too) or str, with optional bounds (`ge`, `gt`, `le`, `lt`), a regex `pattern` (str)
    and `nullable` (null allowed as well). `what` says what a value must be in error messages
    ("compare_modes must be <what>, got ..."); choices speak for themselves.
    """

    name: str
    default: object
    type: type | None = None
    what: str = ""
    choices: tuple = ()
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    pattern: str | None = None
    nullable: bool = False
    measurement: bool = False   # how a cell is measured, not what: logged, never in its id
    # Added after cells were recorded, its default being what they did: it joins a cell's id only
    # when set off that default, so those cells (and their baselines) keep their ids.
    id_when_set: bool = False

    def __post_init__(self):
        if bool(self.choices) == (self.type is not None):
            raise ValueError(f"parameter {self.name}: give either choices or a type")
        if self.choices and self.default not in self.choices:
            raise ValueError(f"parameter {self.name}: default {self.default!r} is not a choice")
        if self.type is not None and not self.what:
            raise ValueError(f"parameter {self.name}: say what a value must be (what=...)")


def yaml_word(value: object) -> str:
    """A parameter's value as a scenario writes it (`true`, not `True`): for messages, labels
    and the gate's tables."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def choice(name: str, default: object, choices: tuple, **kw) -> Param:
    return Param(name, default, choices=tuple(choices), **kw)


def flag(name: str, default: bool, **kw) -> Param:
    return Param(name, default, bool, "true or false", **kw)


def positive_int(name: str, default: int, what: str = "a positive integer", **kw) -> Param:
    return Param(name, default, int, what, gt=0, le=INT_MAX, **kw)


def non_negative_int(name: str, default: int, what: str = "an integer >= 0", **kw) -> Param:
    return Param(name, default, int, what, ge=0, le=INT_MAX, **kw)


@dataclass(frozen=True)
class WorkloadSpec:
    """Everything the controller and the worker know about one workload.

    - `params`: its own parameters. They join the canonical form (and so the id) of its cells
      only, so adding a workload or a parameter never changes other workloads' cell ids; a
      scenario that sets one on another workload's cell is refused.
    - `checks`: whole-cell checks (`Check`) run on each of its cells, in order, after the
      type and range checks of every parameter.
    - `label`: the canonical cell -> a short readable name; None: the workload's name and its
      own parameters, `calibrate work_us=500 idle_target=0.5 replay=eager`.
    - `policies`: metric -> the gate's default policy for it, as plain data (direction
      higher|lower, threshold_rel, threshold_abs, gate, per repeat|run: harness.gate.policy).
      A scenario without `metrics:` gates the union of every workload's policies.
    - `runner`: "module:function" of its runner, imported only inside the worker.
    - `order`: its place among the workloads (the `workload` choices, the schema's parameter
      order, error messages), then its name.
    - `shared_params`, `impl_params`, `shared_checks`: parameters every cell has whatever its
      workload, and the checks of them run on every cell. Only decode has them: its
      parameters predate workloads of their own, and moving them would change every cell's
      id. `impl_params` pick kernels, not results: they join an id only when set away from
      their default. A new workload leaves these empty.
    """

    name: str
    runner: str
    params: tuple[Param, ...] = ()
    checks: tuple[Check, ...] = ()
    label: Callable[[dict], str] | None = None
    policies: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    order: int = 100
    shared_params: tuple[Param, ...] = ()
    impl_params: tuple[Param, ...] = ()
    shared_checks: tuple[Check, ...] = ()

    def __post_init__(self):
        if not self.name.isidentifier():
            raise ValueError(f"workload name {self.name!r} is not an identifier")
        module, sep, func = self.runner.partition(":")
        if not (module and sep and func):
            raise ValueError(f"workload {self.name}: runner {self.runner!r} is not 'module:function'")
        names = [p.name for p in self.all_params()]
        if len(set(names)) != len(names):
            raise ValueError(f"workload {self.name}: a parameter is declared twice: {names}")

    def all_params(self) -> tuple[Param, ...]:
        return self.shared_params + self.impl_params + self.params

    def cell_label(self, cell: dict) -> str:
        """The label of canonical `cell` (a cell of this workload)."""
        if self.label is not None:
            return self.label(cell)
        return " ".join([self.name] + [f"{p.name}={cell[p.name]:g}" if isinstance(cell[p.name], float)
                                       else f"{p.name}={cell[p.name]}" for p in self.params])


def discover(package: str) -> dict[str, WorkloadSpec]:
    """The `SPEC` of every module of `package` (modules named `_...` skipped), by name, in
    (order, name) order. A module's spec must be named after the module."""
    pkg = importlib.import_module(package)
    found = []
    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name.startswith("_"):
            continue
        spec = getattr(importlib.import_module(f"{package}.{info.name}"), "SPEC", None)
        if not isinstance(spec, WorkloadSpec):
            raise TypeError(f"{package}.{info.name} defines no SPEC = WorkloadSpec(...)")
        if spec.name != info.name:
            raise RuntimeError(f"{package}.{info.name}: its SPEC is named {spec.name!r}; a "
                               f"workload's spec module is named after the workload")
        found.append(spec)
    return {spec.name: spec for spec in sorted(found, key=lambda s: (s.order, s.name))}


SPECS: dict[str, WorkloadSpec] = discover(__name__)
