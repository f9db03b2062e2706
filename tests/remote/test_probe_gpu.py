"""The SSH host machinery against the real nvidia-smi and CUDA (harness/remote/probe.py and
launcher.py): GPU facts, pinning, foreign-process detection and the busy-GPU policies. The CPU
tests (tests/hosts/) can only fake nvidia-smi.

1. probe.gpus() parses `nvidia-smi --query-gpu` for every GPU, and holds each GPU torch sees.
2. Pinning: a process with CUDA_VISIBLE_DEVICES=N and CUDA_DEVICE_ORDER=PCI_BUS_ID (what the
   launcher sets for `gpu: N`) sees exactly one device, nvidia-smi's GPU N.
3. A foreign process holding a CUDA context on a GPU shows up in probe.busy_gpus().
4. The launcher (`python -m harness.remote`, what an SSH host runs per cell) with that process
   alive: policy `noisy` runs the cell and reports @@busy with its pid; policy `wait` with
   busy_wait_s 0 exits 75 with @@infra naming it; once it is gone, the cell runs with no word
   of it (and, where nothing else holds the GPU, policy `wait` runs it with no @@busy at all).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.remote import probe

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
HOLDER = ("import time, torch; x = torch.ones(1 << 20, device='cuda:0'); "
          "torch.cuda.synchronize(); print('ready', flush=True); time.sleep(120)")
UUID_OF_DEVICE_0 = ("import torch; p = torch.cuda.get_device_properties(0); "
                    "print(torch.cuda.device_count(), 'GPU-' + str(p.uuid))")


def env_for(**extra) -> dict:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, **extra)


def pinned_to(index: int) -> dict:
    return env_for(CUDA_VISIBLE_DEVICES=str(index), CUDA_DEVICE_ORDER="PCI_BUS_ID")


def launch(policy: str, lock: str, gpu: int, busy_wait_s: float = 0.0) -> dict:
    """One noop cell through the launcher on `gpu`; its exit, @@busy reports, @@infra lines and
    result status."""
    job = {"cell": {"workload": "noop", "sleep_s": 0.0}, "env": {}, "gpu": gpu, "lock": lock,
           "cache_dir": None, "gpu_busy": policy, "busy_wait_s": busy_wait_s}
    # stdin stays open until the result is in (the launcher's dead man's switch): Popen, not run.
    proc = subprocess.Popen(["setsid", "-w", sys.executable, "-m", "harness.remote"], cwd=REPO,
                            env=env_for(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        proc.stdin.write((json.dumps(job) + "\n").encode())
        proc.stdin.flush()
        out = proc.stdout.read().decode()
        err = proc.stderr.read().decode()
        proc.wait(timeout=120)
    finally:
        proc.stdin.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = err.splitlines()
    busy = [json.loads(line[len("@@busy "):]) for line in lines if line.startswith("@@busy ")]
    infra = [line for line in lines if line.startswith("@@infra ")]
    result = json.loads(out.strip().splitlines()[-1]) if out.strip() else None
    return {"exit": proc.returncode, "busy": busy, "infra": infra,
            "status": result and result["status"], "stderr": err[-2000:]}


def busy_pids(gpu: int) -> list[int]:
    return [p["pid"] for p in probe.busy_gpus().get(gpu, [])]


@pytest.fixture(scope="module")
def gpus(cuda):
    found = probe.gpus()
    assert found, "nvidia-smi lists no GPU although torch sees one"
    return found


def test_nvidia_smi_is_parsed_and_holds_every_gpu_torch_sees(gpus):
    import torch

    assert [g["index"] for g in gpus] == list(range(len(gpus)))
    for g in gpus:
        assert g["uuid"].startswith("GPU-") and g["name"] and g["driver"]
        assert isinstance(g["memory_mib"], int) and g["memory_mib"] > 0
    seen = {"GPU-" + str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())}
    assert seen <= {g["uuid"] for g in gpus}
    assert probe.report()["driver"] == gpus[0]["driver"]


def test_cuda_visible_devices_n_is_nvidia_smi_gpu_n(gpus):
    procs = [(g, subprocess.Popen([sys.executable, "-c", UUID_OF_DEVICE_0], env=pinned_to(g["index"]),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
             for g in gpus]
    for g, proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        count, uuid = out.split()[-2:]
        assert (count, uuid) == ("1", g["uuid"]), g["index"]


def test_foreign_processes_and_the_busy_gpu_policies(gpus, tmp_path):
    gpu = gpus[-1]["index"]          # the last GPU: with several, one this session leaves alone
    lock = str(tmp_path / f"gpu{gpu}.lock")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE,
                              env=pinned_to(gpu), text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        for _ in range(60):
            if holder.pid in busy_pids(gpu):
                break
            time.sleep(0.5)
        assert holder.pid in busy_pids(gpu)
        noisy = launch("noisy", lock, gpu)
        assert noisy["exit"] == 0 and noisy["status"] == "ok", noisy
        assert any(p["pid"] == holder.pid for b in noisy["busy"] for p in b["processes"]), noisy
        waits = launch("wait", lock, gpu, busy_wait_s=0)
        assert waits["exit"] == 75 and waits["status"] is None, waits
        assert any(f"pid {holder.pid}" in line for line in waits["infra"]), waits
    finally:
        holder.kill()
        holder.wait()
    for _ in range(60):
        if holder.pid not in busy_pids(gpu):
            break
        time.sleep(0.5)
    assert holder.pid not in busy_pids(gpu)
    others = busy_pids(gpu)          # this test session's own context, when it is on this GPU
    if not others:
        free = launch("wait", lock, gpu, busy_wait_s=30)
        assert free["exit"] == 0 and free["status"] == "ok" and not free["busy"], free
    else:
        free = launch("noisy", lock, gpu)
        assert free["exit"] == 0 and free["status"] == "ok", free
        reported = {p["pid"] for b in free["busy"] for p in b["processes"]}
        assert holder.pid not in reported and reported <= set(others), free
