"""GPU check of the SSH host machinery (issue 6): GPU facts, foreign-process detection, pinning.

    OUT=/tmp/out PYTHONPATH=. python ci/gpu/host_gpus.py          # from the repo root

Needs only torch (CUDA) and the repo; about 30 s. Writes $OUT/host_gpus.json and prints a table
last. The CPU-only test suite can only fake nvidia-smi; this runs the real one:

1. probe.gpus() parses `nvidia-smi --query-gpu` (index, uuid, name, driver, memory) for every GPU.
2. Pinning: for each GPU N, a process with CUDA_VISIBLE_DEVICES=N and CUDA_DEVICE_ORDER=PCI_BUS_ID
   (what harness.remote.launcher sets) sees exactly one device, whose UUID is nvidia-smi's GPU N.
3. A foreign process holding a CUDA context on GPU 0 shows up in probe.busy_gpus()[0].
4. The launcher (python -m harness.remote, the process an SSH host runs per cell) with that
   process alive: policy `noisy` runs the cell and reports @@busy with the foreign pid; policy
   `wait` with busy_wait_s 0 exits 75 with @@infra naming the pid; after the foreign process is
   gone, policy `wait` runs the cell with no @@busy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from harness.remote import probe

OUT = os.environ.get("OUT", "./gpu-out")
HOLDER = ("import time, torch; x = torch.ones(1 << 20, device='cuda:0'); "
          "torch.cuda.synchronize(); print('ready', flush=True); time.sleep(120)")
UUID_OF_DEVICE_0 = ("import torch; p = torch.cuda.get_device_properties(0); "
                    "print(torch.cuda.device_count(), 'GPU-' + str(p.uuid))")


def launch(policy: str, lock: str, busy_wait_s: float = 0.0) -> dict:
    job = {"cell": {"workload": "noop", "sleep_s": 0.0}, "env": {}, "gpu": 0, "lock": lock,
           "cache_dir": None, "gpu_busy": policy, "busy_wait_s": busy_wait_s}
    # stdin stays open until the result is in (the launcher's dead man's switch): Popen, not run.
    proc = subprocess.Popen(["setsid", "-w", sys.executable, "-m", "harness.remote"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdin.write((json.dumps(job) + "\n").encode())
    proc.stdin.flush()
    out = proc.stdout.read().decode()
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    proc.stdin.close()
    lines = err.splitlines()
    busy = [json.loads(line[len("@@busy "):]) for line in lines if line.startswith("@@busy ")]
    infra = [line for line in lines if line.startswith("@@infra ")]
    result = json.loads(out.strip().splitlines()[-1]) if out.strip() else None
    return {"exit": proc.returncode, "busy": busy, "infra": infra,
            "status": result and result["status"]}


def main() -> int:
    os.makedirs(OUT, exist_ok=True)
    rows, report = [], {}

    gpus = probe.gpus()
    report["gpus"] = gpus
    rows.append(("nvidia-smi parsed", bool(gpus) and all(g["uuid"].startswith("GPU-") for g in gpus),
                 f"{len(gpus or [])} GPU(s), driver {gpus[0]['driver'] if gpus else None}"))
    if not gpus:
        print("no GPU visible to nvidia-smi")
        return 1

    pinned = []
    for g in gpus:
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(g["index"]), CUDA_DEVICE_ORDER="PCI_BUS_ID")
        out = subprocess.run([sys.executable, "-c", UUID_OF_DEVICE_0], env=env,
                             capture_output=True, text=True, timeout=120)
        count, uuid = (out.stdout.split() + ["?", "?"])[:2]
        pinned.append({"index": g["index"], "count": count, "uuid": uuid, "want": g["uuid"]})
    report["pinning"] = pinned
    rows.append(("CUDA_VISIBLE_DEVICES=N is nvidia-smi GPU N",
                 all(p["count"] == "1" and p["uuid"] == p["want"] for p in pinned),
                 ", ".join(f"{p['index']}:{p['uuid'][:12]}" for p in pinned)))

    lock = os.path.join(tempfile.mkdtemp(), "gpu0.lock")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE,
                              env=dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpus[0]["index"]),
                                       CUDA_DEVICE_ORDER="PCI_BUS_ID"))
    try:
        holder.stdout.readline()
        seen = []
        for _ in range(60):
            seen = [p["pid"] for p in probe.busy_gpus().get(0, [])]
            if holder.pid in seen:
                break
            time.sleep(0.5)
        report["busy_pids_gpu0"] = seen
        rows.append(("foreign process seen on GPU 0", holder.pid in seen,
                     f"holder pid {holder.pid}, seen {seen}"))
        noisy = launch("noisy", lock)
        report["noisy"] = noisy
        rows.append(("policy noisy: runs, reports @@busy",
                     noisy["status"] == "ok" and any(p["pid"] == holder.pid
                                                     for b in noisy["busy"] for p in b["processes"]),
                     f"exit {noisy['exit']}, busy {noisy['busy']}"))
        waits = launch("wait", lock, busy_wait_s=0)
        report["wait"] = waits
        rows.append(("policy wait (0 s): exit 75, @@infra",
                     waits["exit"] == 75 and any(str(holder.pid) in line for line in waits["infra"]),
                     f"exit {waits['exit']}, {waits['infra'][:1]}"))
    finally:
        holder.kill()
        holder.wait()
    for _ in range(60):
        if holder.pid not in [p["pid"] for p in probe.busy_gpus().get(0, [])]:
            break
        time.sleep(0.5)
    free = launch("wait", lock, busy_wait_s=30)
    report["free"] = free
    rows.append(("GPU free: runs without @@busy", free["status"] == "ok" and not free["busy"],
                 f"exit {free['exit']}"))

    report["ok"] = all(ok for _, ok, _ in rows)
    with open(os.path.join(OUT, "host_gpus.json"), "w") as f:
        json.dump(report, f, indent=2)
    width = max(len(name) for name, _, _ in rows)
    print(f"{'check':<{width}}  ok    detail")
    for name, ok, detail in rows:
        print(f"{name:<{width}}  {'yes' if ok else 'NO ':<4}  {detail}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
