"""The parameters of one cell: names, allowed values, defaults; canonical form, id, label.

What the controller (scenario validation, cell ids, MLflow params) and the worker (which reads
a cell from JSON) share. The parameters every workload has are declared here; each workload's
own ones, checks and label in its module of harness/protocol/workloads/, from which the tables
below are built. It imports only the standard library, so the worker can use it on a GPU host
with nothing installed.

A *cell* is one point of a scenario's matrix: a flat dict of the parameters below, all
JSON scalars. Its id is a hash of its canonical form (see `cell_id`).
"""

from __future__ import annotations

import hashlib
import json

from harness.protocol.workloads import (SEED_MAX, SPECS, Param, choice, flag, non_negative_int,
                                       positive_int)
# Re-exported for the code that reads them from here (harness.decode.kernel_choice, the tests).
from harness.protocol.workloads.calibrate import REPLAYS  # noqa: F401
from harness.protocol.workloads.decode import (ACCEPTANCES, ACCEPTS, AUTO,  # noqa: F401
                                               ACCEPT_IMPLS, AUTO_KERNELS, BEFORE_AUTO, BLAS_IMPLS,
                                               CUSTOM_IMPLS,
                                               GRAPH_CAPTURES, LINEAR_IMPLS, PRESETS,
                                               SPECULATIONS, TOPK_IMPLS,
                                               TREE_BUILD_IMPLS, TREE_BUILDS, VERIFY_MODES,
                                               custom_auto, device_class, kernel_knobs,
                                               resolve_kernels)
from harness.protocol.workloads.op import op_knobs
from harness.protocol.workloads.kernel import ATTENTIONS, LAYOUTS  # noqa: F401

# The workloads, each declared by its module in harness/protocol/workloads/ (parameters, checks,
# label, gate policies, runner).
WORKLOADS = tuple(SPECS)
DEFAULT_WORKLOAD = "decode"
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "float64", "bfloat16", "float16")

# The parameters every workload has (the `workload` itself first).
WORKLOAD_PARAM = choice("workload", DEFAULT_WORKLOAD, WORKLOADS)
GENERAL_PARAMS: tuple[Param, ...] = (
    choice("device", "auto", DEVICES),
    choice("dtype", "auto", DTYPES),      # auto: float32 on CPU, bfloat16 on CUDA
    Param("seed", 0, int, "an integer >= 0", ge=0, le=SEED_MAX),
    # Measurement knobs: how a cell is measured rather than what it measures. They are logged
    # but excluded from the cell id, so raising `repeats` still lines up with baselines.
    non_negative_int("warmup_steps", 2, measurement=True),
    positive_int("steps", 8, measurement=True),       # steps timed per repeat (the steady window)
    positive_int("repeats", 3, measurement=True),
    # steps under the CUDA-activity profiler (GPU only; 0 = off)
    non_negative_int("profile_steps", 4, measurement=True),
    # false: no profile and no sync audit this run (the gate's later rounds, which need only
    # the timed window)
    flag("profile", True, measurement=True),
    # the controller kills the worker after this long
    positive_int("timeout_s", 900, "a positive integer (seconds)", measurement=True),
    # true: after its timing, the call of a kernel or op cell once more under Nsight Compute, its
    # kernels' hardware counters as `ncu.<kernel>.<counter>` metrics (harness/worker/ncu.py; a
    # host without ncu records why in the result's `kernel.ncu_errors`)
    flag("ncu", False, measurement=True),
)
# The workloads whose cells time one call, which `ncu` profiles.
PROFILED_WORKLOADS = ("kernel", "op")


def check_ncu(cell: dict):
    if cell["ncu"] and cell["workload"] not in PROFILED_WORKLOADS:
        return ("ncu", "workload"), (
            f"ncu profiles the call a kernel or op cell times; this cell runs workload "
            f"'{cell['workload']}'")
    return None


# Whole-cell checks of the parameters above, run on every cell before its workload's own.
GENERAL_CHECKS = (check_ncu,)

# Every parameter every cell has, with its default: the workload, the shared parameters some
# workloads declare (decode's: they predate workloads of their own), the general ones, then the
# implementation knobs. Changing a default changes the ids of cells that relied on it, so
# defaults are folded into the id (see `canonical`). The order is the schema's, the summary
# table's and the error messages'.
_EVERY_CELL: tuple[Param, ...] = (
    (WORKLOAD_PARAM,) + tuple(p for s in SPECS.values() for p in s.shared_params) + GENERAL_PARAMS
    + tuple(p for s in SPECS.values() for p in s.impl_params))
DEFAULTS: dict[str, object] = {p.name: p.default for p in _EVERY_CELL}

# Implementation knobs: which kernels a step runs, not what it computes (default `auto`: the
# worker picks and records what ran, harness/protocol/workloads/decode.py). Each joins a cell's
# id only when set, so cells (and their baselines) from before a knob existed keep their ids,
# and a cell that names a kernel is a different cell.
IMPL_DEFAULTS: dict[str, object] = {p.name: p.default for s in SPECS.values() for p in s.impl_params}

# Parameters that only one workload has, with their defaults. They join a cell's canonical form
# (and so its id) only when the cell runs that workload, so adding a workload or a parameter
# never changes the ids of other workloads' cells.
WORKLOAD_PARAMS: dict[str, dict[str, object]] = {
    name: {p.name: p.default for p in spec.params} for name, spec in SPECS.items() if spec.params}

# Every parameter some cell may set (the scenario schema), by name.
PARAMS: dict[str, Param] = {}
for _p in _EVERY_CELL + tuple(p for s in SPECS.values() for p in s.params):
    if _p.name in PARAMS:
        raise RuntimeError(f"cell parameter {_p.name} is declared twice (harness/protocol/params.py "
                           f"and harness/protocol/workloads/): each name belongs to one workload")
    PARAMS[_p.name] = _p
del _p
ALL_PARAMS: dict[str, object] = {name: p.default for name, p in PARAMS.items()}

# Parameters that describe how a cell is measured rather than what it measures: logged but
# excluded from the cell id.
MEASUREMENT_KNOBS = tuple(name for name, p in PARAMS.items() if p.measurement)

# Parameters that join a cell's id only when set off their default: the implementation knobs,
# and parameters added after cells were recorded (Param.id_when_set).
ID_WHEN_SET: dict[str, object] = {**IMPL_DEFAULTS,
                                  **{name: p.default for name, p in PARAMS.items() if p.id_when_set}}

# Workloads whose cells time one kernel (their gated metric is kernel_us, with achieved_tbps and
# pct_roofline beside it): reports give them the kernel table rather than the decode one.
KERNEL_WORKLOADS = tuple(name for name, s in SPECS.items() if "kernel_us" in s.policies)


def times_a_kernel(cell: dict) -> bool:
    return cell.get("workload", DEFAULT_WORKLOAD) in KERNEL_WORKLOADS


def canonical(cell: dict) -> dict:
    """The cell with every default filled in (its workload's own ones too), keys sorted."""
    full = dict(DEFAULTS)
    full.update(WORKLOAD_PARAMS.get(cell.get("workload", DEFAULT_WORKLOAD), {}))
    full.update(cell)
    return {k: full[k] for k in sorted(full)}


def cell_id(cell: dict) -> str:
    """Stable id of a cell: a short hash of its canonical identity parameters.

    Reruns and baselines of the same configuration get the same id; measurement knobs
    (repeats, steps, ...) do not change it.
    """
    ident = {k: v for k, v in canonical(cell).items() if k not in MEASUREMENT_KNOBS
             and not (k in ID_WHEN_SET and v == ID_WHEN_SET[k])}
    blob = json.dumps(ident, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def cell_kernels(cell: dict) -> tuple[str, ...]:
    """The implementation knobs whose kernel `cell` runs: an op cell's own one, a decode cell's
    by mode (decode.kernel_knobs), a kernel cell's custom_impl where it times the custom kernel,
    none for the other workloads."""
    c = canonical(cell)
    if c["workload"] == "op":
        return op_knobs(c["op"])
    if c["workload"] == "kernel":     # the custom kernel's variant, where the cell times it
        modes = [c["verify_mode"]] + [m for m in str(c.get("compare_modes", "")).split(",") if m]
        return ("custom_impl",) if "custom" in modes else ()
    return kernel_knobs(c) if c["workload"] == "decode" else ()


def kernels_ran(result: dict) -> dict | None:
    """The kernels a result's cell ran, by knob ({} for a workload without any; None when it
    cannot be told): as the worker recorded them (`kernels`), else, for a result from before
    workers recorded them, its cell's knobs; BEFORE_AUTO for a knob its result predates."""
    recorded = result.get("kernels")
    cell = result.get("cell")
    if isinstance(recorded, dict):
        ran = dict(recorded)
        if isinstance(cell, dict) and cell:
            # A knob added after the result was made: it ran what the code did before the knob.
            for k in cell_kernels(cell):
                ran.setdefault(k, BEFORE_AUTO[k])
        return ran
    if not isinstance(cell, dict) or not cell:
        return None
    ran = {k: cell.get(k, BEFORE_AUTO[k]) for k in cell_kernels(cell)}
    if any(v == AUTO for v in ran.values()):
        return None
    if not (result.get("env") or {}).get("gpu") and "tree_build_impl" in ran:
        ran["tree_build_impl"] = "torch"      # off CUDA the torch build was the only one
    return ran


def cell_label(cell: dict) -> str:
    """A readable name, e.g. `qwen3-8b ctx=32768 N=64 verify=sdpa graph=none tree=cpu`: its
    workload's label (WorkloadSpec.label; a workload this code does not know gets decode's)."""
    c = canonical(cell)
    return SPECS.get(c["workload"], SPECS[DEFAULT_WORKLOAD]).cell_label(c)
