"""The service workload against a real engine: `transformers serve` (installed from the package
index with transformers[serving]) serving a tiny random Qwen3 the module makes, started by the
worker on a loopback sshd host, through `harness run`.

`transformers serve` rather than vLLM's CPU build: it is a pip install of a few small packages
on top of the transformers the dev extras already hold, starts in seconds on two cores, streams
`/v1/completions`, and has real toggles (`--continuous-batching` switches it to another
generation path, which its log names per request). It has no profiler route and no /metrics,
which the cells report as absent (the idle meter on engine traces is tested on a real Kineto
trace in test_engine_trace.py).

One sweep (two contexts x two toggle values) starts the engine twice; a second, whose engine
is declared by its host in hosts.yaml rather than by the scenario, twice more (ending on the
same toggles); the bad-input sweep after them reuses that engine for its good cell.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="transformers[serving] is not installed")
pytest.importorskip("transformers", reason="transformers is not installed")

import engine_model
import sshd_server
from cli_process import run_cli
from sshd_server import LoopbackSSH

from harness.protocol import params
from harness.worker import service_load, service_proc

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(sshd_server.available() is not None,
                                 reason=str(sshd_server.available()))]

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv" / "bin"
CB = "--continuous-batching --cb-num-blocks 64 --cb-max-batch-tokens 512"
SECRET = "sk-test-" + os.urandom(8).hex()


class World:
    def __init__(self, root: Path):
        self.root = root
        (root / "ssh").mkdir()
        self.ssh = LoopbackSSH(root / "ssh")
        self.server = self.ssh.start_sshd()
        self.home = self.ssh.home(known=[self.server])
        self.model = engine_model.make(root / "model")
        self.port = sshd_server.free_port()
        self.log = root / "engine.log"
        login = (f"    ssh: root@127.0.0.1:{self.server.port}\n"
                 f"    python: {VENV / 'python'}\n"
                 f"    workdir: {root}/work\n"
                 '    env: {OMP_NUM_THREADS: "1", SVC_KEY: "${SPECDEC_SVC_KEY}"}\n')
        engine = self.engine()
        # The same login twice: `svc` runs scenarios that declare their engine; `svc-host`
        # declares the same engine itself (service:), for scenarios of toggles and load alone.
        (root / "hosts.yaml").write_text(
            "hosts:\n  svc:\n" + login + "  svc-host:\n" + login + "    service:\n"
            + "".join(f"      {key.removeprefix('service_')}: {json.dumps(value)}\n"
                      for key, value in engine.items()))

    def engine(self) -> dict:
        """How the tests' engine is started, reached and read: service_* parameters."""
        return {"service_start": f"{VENV / 'transformers'} serve {self.model} --host 127.0.0.1 "
                                 f"--port {self.port} --device cpu",
                "service_url": f"http://127.0.0.1:{self.port}", "service_log": str(self.log),
                "service_api_key": "${SVC_KEY}", "service_ready_timeout_s": 120,
                "service_trace_dir": str(self.root / "traces")}

    def load(self, **over) -> dict:
        """A cell's toggles and load, without the engine."""
        cell = {"workload": "service", "output_tokens": 8, "concurrency": 2, "warmup_steps": 1,
                "steps": 2, "repeats": 2, "timeout_s": 300}
        cell.update(over)
        return cell

    def defaults(self, **over) -> dict:
        return {**self.engine(), **self.load(**over)}

    def harness(self, folder: Path, scenario: dict, host: str = "svc"):
        folder.mkdir()
        (folder / "s.yaml").write_text(json.dumps(scenario))
        env = dict(os.environ, HOME=str(self.home), COLUMNS="200", SPECDEC_SVC_KEY=SECRET)
        env.pop("MLFLOW_TRACKING_URI", None)
        proc = run_cli(["run", "s.yaml", "--hosts", str(self.root / "hosts.yaml"), "--host",
                        host, "--tracking-uri", f"sqlite:///{folder}/mlflow.db"],
                       cwd=folder, env=env, timeout=280)
        [run] = (folder / "results" / "runs").iterdir()
        cells = [json.loads(p.read_text()) for p in (run / "cells").glob("*.json")]
        return proc, cells

    def close(self):
        for log in self.root.glob("*.log"):
            service_proc.SetsidService({"service_name": "x", "service_log": str(log)}).stop()
        self.ssh.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = World(tmp_path_factory.mktemp("service"))
    yield w
    w.close()


@pytest.fixture(scope="module")
def sweep(world):
    scenario = {"name": "service-test", "defaults": world.defaults(),
                "matrix": {"service_flags": ["", CB], "context_length": [128, 512]}}
    return world.harness(world.root / "sweep", scenario)


def test_two_contexts_by_two_toggles_measure_a_real_engine(world, sweep):
    proc, cells = sweep
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(cells) == 4 and all(c["status"] == "ok" for c in cells)
    assert {(c["cell"]["service_flags"], c["cell"]["context_length"]) for c in cells} == \
        {("", 128), ("", 512), (CB, 128), (CB, 512)}
    for c in cells:
        m = c["metrics"]
        assert m["tokens_per_s"] > 0 and m["ttft_ms_p50"] > 0 and m["itl_ms_p50"] > 0
        assert len(c["samples"]["tokens_per_s"]) == 2 and "tokens_per_s_spread" in m
        # 2 repeats of max(steps, concurrency) = 2 requests each
        assert len(c["samples"]["ttft_ms"]) == 4 and c["service"]["requests"] == 4
        # transformers serve has no profiler route and no /metrics: absent, not made up, and
        # the result says why
        assert "idle_fraction" not in m and "accept_len_mean" not in m
        assert c["idle"] == {"note": "no profiler: POST /start_profile gave HTTP 404 "
                                     "(idle_fraction absent)"}
        # nor NVML's coarse figure in its place on this GPU-less host: absent, with why
        assert "idle_fraction_nvml" not in m
        assert c["idle_nvml"]["note"].startswith("no NVML estimate: GPU 0: ")
    # The engine restarted only when the toggles changed: once per toggle value.
    by_flags = {}
    for c in cells:
        by_flags.setdefault(c["cell"]["service_flags"], set()).add(c["service"]["pid"])
    assert all(len(pids) == 1 for pids in by_flags.values())
    assert len(set.union(*by_flags.values())) == 2
    assert sum(c["service"]["restarted"] for c in cells) == 2
    # The toggle changed the engine's behaviour: the running (second) engine served on its
    # continuous-batching path.
    assert served_by_continuous_batching(world.log.read_text())
    # Toggles are part of a cell's identity; the URL is not.
    a, b = (params.cell_id(world.defaults(service_flags=f)) for f in ("", CB))
    assert a != b
    assert params.cell_id(world.defaults(service_url="http://10.0.0.1:1")) == a


def served_by_continuous_batching(log: str) -> bool:
    """Whether an engine's log shows it served on its continuous-batching path, and never
    without it: per request up to transformers 5.24 ("CB: True"), through the batching
    manager's own logger from 5.25, which dropped the per-request line."""
    return ("CB: True" in log or "ContinuousBatchingLogger" in log) and "CB: False" not in log


@pytest.fixture(scope="module")
def host_declared(world, sweep):
    """The engine declared by the host (`svc-host`'s service:), the scenario only toggles and
    load; run after `sweep`, whose last engine (the CB one) it finds running."""
    scenario = {"name": "service-host", "defaults": world.load(context_length=64),
                "matrix": {"service_flags": ["", CB]}}
    return world.harness(world.root / "host", scenario, host="svc-host")


def test_an_engine_declared_in_hosts_yaml_serves_a_scenario_of_toggles_and_load(world, sweep,
                                                                               host_declared):
    proc, cells = host_declared
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(cells) == 2 and all(c["status"] == "ok" for c in cells)
    by = {c["cell"]["service_flags"]: c for c in cells}
    # The scenario's cells, ids and all: the deployment is where they ran, not what they are.
    assert {c["cell_id"] for c in cells} == {
        params.cell_id(world.load(context_length=64, service_flags=f)) for f in ("", CB)}
    assert all(c["cell"]["service_start"] is None for c in cells)
    # The host's command started the engine with each cell's toggles: the running CB engine
    # of the first sweep is not what "" asks for (restarted), then CB is again (restarted).
    assert by[""]["service"]["restarted"] is True and by[CB]["service"]["restarted"] is True
    assert by[""]["service"]["pid"] != by[CB]["service"]["pid"]
    assert by[CB]["metrics"]["tokens_per_s"] > 0
    log = world.log.read_text()              # the host's log: the CB engine's
    assert served_by_continuous_batching(log)
    # Each result says which deployment it measured; the key only as its ${VAR} name.
    for c in cells:
        assert c["deployment"]["host"] == "svc-host"
        assert c["deployment"]["declared_in"].endswith("hosts.yaml:12")
        assert {k: v for k, v in c["deployment"].items()
                if k not in ("host", "declared_in")} == {**world.engine(),
                                                         "service_manager": "setsid"}


def test_a_scenario_that_contradicts_its_hosts_engine_is_refused_before_anything_runs(world,
                                                                                      tmp_path):
    scenario = {"name": "service-clash", "defaults": world.load(
        context_length=64, service_url=f"http://127.0.0.1:{sshd_server.free_port()}"),
        "matrix": {"service_flags": [CB]}}
    (tmp_path / "s.yaml").write_text(json.dumps(scenario))
    env = dict(os.environ, HOME=str(world.home), COLUMNS="1000", SPECDEC_SVC_KEY=SECRET)
    proc = run_cli(["run", "s.yaml", "--hosts", str(world.root / "hosts.yaml"), "--host",
                    "svc-host"], cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    # at the host's url (line 14: service: on 12, start 13), naming both sides
    assert len(lines) == 1 and "hosts.yaml:14:" in lines[0], lines
    assert "host 'svc-host'" in lines[0] and "drop service_url from the scenario" in lines[0]
    assert not (tmp_path / "results").exists()


def test_the_api_key_is_never_recorded(world, sweep, host_declared):
    proc, _ = sweep
    assert SECRET not in proc.stdout + proc.stderr
    assert SECRET not in host_declared[0].stdout + host_declared[0].stderr
    for folder in ("sweep", "host"):
        for path in (world.root / folder).rglob("*"):
            if path.is_file():
                assert SECRET.encode() not in path.read_bytes(), path


def test_bad_services_fail_their_own_cell_in_one_line(world, sweep):
    """Unreachable, never ready, a rejected toggle, a response that is not the API's, a prompt
    the engine counts differently: each its own failed cell with one line; the good cell of
    the same sweep (the running engine, reused) is measured."""
    dead = sshd_server.free_port()
    other = sshd_server.free_port()
    bad = {
        "unreachable": {"service_manager": "external", "service_url": f"http://127.0.0.1:{dead}"},
        "never-ready": {"service_start": f"{sys.executable} -c 'import time; time.sleep(60)'",
                        "service_ready_timeout_s": 3, "service_url": f"http://127.0.0.1:{dead}",
                        "service_log": str(world.root / "never.log")},
        "rejected": {"service_start": world.defaults()["service_start"].replace(
                         str(world.port), str(other)),
                     "service_url": f"http://127.0.0.1:{other}",
                     "service_flags": "--no-such-toggle",
                     "service_log": str(world.root / "rejected.log")},
        # a real HTTP server that is not an engine: its root answers, POST is not implemented
        "not-an-engine": {"service_start": f"{sys.executable} -m http.server {other} "
                                           f"--bind 127.0.0.1",
                          "service_ready": "/", "service_model": "m",
                          "service_url": f"http://127.0.0.1:{other}",
                          "service_log": str(world.root / "http.log")},
        "two-token-word": {"service_flags": CB, "prompt_word": " hello world"},
        "good": {"service_flags": CB},
    }
    include = [dict(world.defaults(context_length=64, repeats=1, warmup_steps=0, **over),
                    service_name=name) for name, over in bad.items()]
    proc, cells = world.harness(world.root / "bad", {"name": "service-bad", "include": include})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    by = {c["cell"]["service_name"]: c for c in cells}
    assert set(by) == set(bad)
    assert by["good"]["status"] == "ok" and by["good"]["service"]["restarted"] is False
    errors = {name: c["error"] for name, c in by.items() if name != "good"}
    assert all(c["status"] == "failed" for name, c in by.items() if name != "good")
    assert all("\n" not in e and "Traceback" not in e for e in errors.values()), errors
    assert "is not reachable" in errors["unreachable"]
    assert "was not ready" in errors["never-ready"] and "after 3 s" in errors["never-ready"]
    assert "exited with status 2 before it was ready" in errors["rejected"]
    assert "no-such-toggle" in errors["rejected"]           # the engine's own complaint
    assert "HTTP 501" in errors["not-an-engine"]
    assert "counted 128 prompt tokens, not context_length 64" in errors["two-token-word"]
    assert SECRET not in json.dumps(cells)


def test_a_non_streamed_answer_is_refused(world, sweep):
    """The real engine answers `stream: false` with one JSON body: not what a cell measures."""
    cell = params.canonical(world.defaults(service_flags=CB, context_length=16))
    load = service_load.Load(cell, str(world.model), None)
    body = dict(load.body, stream=False)
    import requests
    with requests.Session() as s, pytest.raises(service_proc.ServiceError) as err:
        service_load.one_request(s, load.url, body, {}, 60)
    assert "not a streamed response (content-type 'application/json')" in str(err.value)


def test_an_engine_killed_between_cells_is_started_again_and_env_toggles_reach_it(world, sweep):
    """A stale state file (the engine died) is not mistaken for a running engine; a
    `service_env` toggle restarts the engine with it in its environment."""
    cell = params.canonical(world.defaults(service_flags=CB, context_length=16, repeats=1))
    state = json.loads(world.log.with_name(world.log.name + ".state.json").read_text())
    service_proc._stop_group(state["pid"])
    got = service_proc.ensure(cell, lambda **_: None)
    assert got["restarted"] is True and got["pid"] != state["pid"]
    cell = dict(cell, service_env="SPECDEC_TOGGLE='on and off'")
    toggled = service_proc.ensure(cell, lambda **_: None)
    assert toggled["restarted"] is True and toggled["pid"] != got["pid"]
    environ = Path(f"/proc/{toggled['pid']}/environ").read_bytes().split(b"\0")
    assert b"SPECDEC_TOGGLE=on and off" in environ
    assert not Path(f"/proc/{got['pid']}").exists()            # the old one stopped (reaped)
    assert service_proc.ensure(cell, lambda **_: None) == {"restarted": False,
                                                           "pid": toggled["pid"]}
