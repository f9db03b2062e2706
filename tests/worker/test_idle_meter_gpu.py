"""The idle meter (harness/worker/idle.py) on a GPU, against the truth of the calibrate workload
(harness/worker/workloads/calibrate.py): spin kernels of known length paced by the host to a
target idle fraction, the truth taken from the kernels' own GPU timestamps.

A short grid: 500 µs steps at 10 % and 50 % idle, launched eagerly and as graph replays. The
profiled meter must be within 1 point of the truth of its window, the always-on estimate
within 2 points of the truth of its windows, with one kernel per step, no dropped records and
the step's GPU time attributed to its `work` phase. The cells run in a child process: the
profiler stays out of the test session (CUPTI takes one subscriber per process, and a process
that has profiled can hang at exit), and the child is ended once its result is in. The full
grid is scenarios/calibrate.yaml; what the profiler costs the steps it records,
scenarios/profiler-overhead.yaml.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
CELLS = [(500.0, replay, target) for replay in ("eager", "graph") for target in (0.1, 0.5)]
CHILD = r"""
import json, sys
from harness.protocol import params
from harness.worker.workloads import calibrate
rows = []
for work_us, replay, target in json.loads(sys.argv[1]):
    cell = params.canonical({"workload": "calibrate", "device": "cuda", "work_us": work_us,
                             "idle_target": target, "replay": replay, "warmup_steps": 4,
                             "steps": 8, "repeats": 2, "profile_steps": 8})
    out = calibrate.run(cell, lambda **k: None)
    prof = out.get("profile") or {}
    rows.append({"cell": [work_us, replay, target], "metrics": out["metrics"],
                 "records_dropped": prof.get("records_dropped"),
                 "kernels_per_step": sorted(set(prof.get("kernels_per_step") or []))})
print("@@result " + json.dumps(rows), flush=True)
"""


def run_child(cells) -> list[dict]:
    """The cells' rows from a child process; the child is killed if it lingers after them."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(cells)], cwd=REPO, env=env,
                                stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            rows = None
            for line in proc.stdout:
                if line.startswith("@@result "):
                    rows = json.loads(line[len("@@result "):])
                    break
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:    # done, but stuck in its exit: not our concern
                proc.kill()
                proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        err.seek(0)
        assert rows is not None, f"the child gave no result (exit {proc.returncode}):\n{err.read()[-4000:]}"
    return rows


@pytest.fixture(scope="module")
def rows(cuda):
    return {tuple(r["cell"]): r for r in run_child(CELLS)}


@pytest.mark.parametrize("work_us,replay,target", CELLS)
def test_meter_and_estimate_agree_with_the_kernels_own_timestamps(rows, work_us, replay, target):
    r = rows[(work_us, replay, target)]
    m = r["metrics"]
    assert m["idle_true"] is not None and m["idle_error_pp"] is not None, m
    assert abs(m["idle_error_pp"]) <= 1, m
    assert abs(m["idle_est_error_pp"]) <= 2, m
    assert r["records_dropped"] is False
    assert r["kernels_per_step"] == [1]
    assert m["phase.work.gpu_ms"] > 0
