"""hosts.yaml validation (errors at file:line:column), ${VAR} secrets, host selection by name
and label, and the worker bundle. No SSH here: tests/hosts/test_ssh.py connects for real."""

from __future__ import annotations

import io
import shlex
import subprocess
import sys
import tarfile
import gzip
from pathlib import Path

import pytest

# harness.hosts.ssh needs asyncssh, a controller dependency: a GPU host with only torch (where
# `pytest -m gpu` runs) skips this file rather than failing the collection of the others.
pytest.importorskip("asyncssh", reason="asyncssh (a controller dependency) is not installed")

from harness.hosts import bundle
from harness.protocol.errors import InputError
from harness.hosts.local import LocalHost
from harness.hosts.inventory import load_hosts, parse_hosts, select_hosts
from harness.hosts.ssh import SSHHost, shell_path
from harness.protocol import deployment

GOOD = """\
hosts:
  gpu-a:
    ssh: gpu-a
    python: /opt/venv/bin/python
    gpus: [0, 1]
    labels: {gpu: h200}
  gpu-b:
    ssh: bench@10.0.0.7:2222
    labels: {gpu: h200, rack: 2}
    env: {HF_TOKEN: "${SPECDEC_TEST_TOKEN}", MODE: fast}
  lab:
    ssh: "root@[fe80::1]:22"
    labels: {gpu: b200}
    known_hosts: accept-new
    gpu_busy: noisy
"""


def error_of(text: str) -> str:
    with pytest.raises(InputError) as err:
        parse_hosts(text, "hosts.yaml")
    return str(err.value)


def test_a_good_inventory(monkeypatch):
    monkeypatch.setenv("SPECDEC_TEST_TOKEN", "tok-123")
    inv = parse_hosts(GOOD, "hosts.yaml")
    assert list(inv) == ["local", "gpu-a", "gpu-b", "lab"]
    a, b, lab = inv["gpu-a"], inv["gpu-b"], inv["lab"]
    assert isinstance(inv["local"], LocalHost) and isinstance(a, SSHHost)
    assert (a.address, a.user, a.port, a.slots, a.python) == ("gpu-a", None, None, 2, "/opt/venv/bin/python")
    assert (b.address, b.user, b.port, b.slots, b.python) == ("10.0.0.7", "bench", 2222, 1, "python3")
    assert b.workdir == "~/.cache/specdec-harness" and b.known_hosts_policy == "strict"
    assert b.env == {"HF_TOKEN": "tok-123", "MODE": "fast"}      # resolved here, at run time
    assert (lab.address, lab.port, lab.known_hosts_policy, lab.gpu_busy) == ("fe80::1", 22, "accept-new", "noisy")
    assert "tok-123" not in repr(b)


def test_select_hosts_by_name_and_by_labels(monkeypatch):
    monkeypatch.setenv("SPECDEC_TEST_TOKEN", "x")
    inv = parse_hosts(GOOD, "hosts.yaml")
    names = lambda wanted: [h.name for h in select_hosts(inv, wanted)]  # noqa: E731
    assert names([{"gpu": "h200"}]) == ["gpu-a", "gpu-b"]
    assert names([{"gpu": "h200", "rack": 2}]) == ["gpu-b"]
    assert names(["lab", {"gpu": "h200"}, "gpu-a"]) == ["lab", "gpu-a", "gpu-b"]
    with pytest.raises(InputError, match=r"no host in the inventory has labels \{gpu: 'a100'\}"):
        select_hosts(inv, [{"gpu": "a100"}])
    with pytest.raises(InputError, match="unknown host '; rm -rf ~'"):
        select_hosts(inv, ["; rm -rf ~"], "--host")


@pytest.mark.parametrize("text, where, message", [
    ("hosts:\n  'x; rm -rf ~':\n    ssh: a\n", "2:3", "host name 'x; rm -rf ~' may use only"),
    ("hosts:\n  a:\n    ssh: 'a; rm -rf ~'\n", "3:10", "is not an alias or [user@]host[:port]"),
    ("hosts:\n  a:\n    ssh: '$(reboot)'\n", "3:10", "is not an alias"),
    ("hosts:\n  a:\n    ssh: -oProxyCommand=x\n", "3:10", "is not an alias"),
    ("hosts:\n  a:\n    ssh: a:99999\n", "3:10", "port 99999 is out of range"),
    ("hosts:\n  a:\n    ssh: a\n    workdir: \"/tmp/x\\nrm -rf ~\"\n", "4:14", "without control characters"),
    ("hosts:\n  a:\n    ssh: a\n    python: \"python3\\n\"\n", "4:13", "without control characters"),
    ("hosts:\n  a:\n    ssh: a\n    python: ../venv/bin/python\n", "4:13", "must be absolute or start with ~/"),
    ("hosts:\n  a:\n    ssh: a\n    workdir: work\n", "4:14", "must be absolute or start with ~/"),
    ("hosts:\n  a:\n    ssh: a\n    env: {'A;B': 1}\n", "4:11", "env name 'A;B' is not a valid variable name"),
    ("hosts:\n  a:\n    ssh: a\n    env: {T: '${NOT_SET_ANYWHERE_42}'}\n", "4:14",
     "T refers to ${NOT_SET_ANYWHERE_42}, which is not set in the controller's environment"),
    ("hosts:\n  a:\n    ssh: a\n    gpus: [0, 0]\n", "4:11", "gpus lists a GPU twice"),
    ("hosts:\n  a:\n    ssh: a\n    gpus: []\n", "4:11", "gpus must be a non-empty list"),
    ("hosts:\n  a:\n    ssh: a\n    gpus: ['0']\n", "4:12", "gpus must be a non-empty list"),
    ("hosts:\n  a:\n    ssh: a\n    known_hosts: no\n", "4:18", "known_hosts must be strict or accept-new"),
    ("hosts:\n  a:\n    ssh: a\n    gpu_busy: later\n", "4:15", "gpu_busy must be wait or noisy"),
    ("hosts:\n  a:\n    ssh: a\n    sshh: b\n", "4:5", "unknown key 'sshh'"),
    ("hosts:\n  a:\n    python: /usr/bin/python3\n", "3:5", "host 'a' needs an ssh target"),
    ("hosts:\n  local:\n    ssh: elsewhere\n", "3:10", "'local' is this machine"),
    ("hosts:\n  a: gpu-a\n", "2:6", "host 'a' must be a mapping of settings"),
    ("hosts:\n  a:\n    ssh: a\n  a:\n    ssh: b\n", "4:3", "duplicate key 'a'"),
    ("hosts: [a, b]\n", "1:8", "hosts must be a mapping of host name -> settings"),
    ("- a\n", "1:1", "a hosts file is a mapping with a 'hosts' key"),
    # a host's serving engine (service:), each key checked as the scenario's service_* is
    ("hosts:\n  a:\n    ssh: a\n    service: [x]\n", "4:14", "service must be a mapping of"),
    ("hosts:\n  a:\n    ssh: a\n    service:\n      start: e\n      urll: x\n", "6:7",
     "unknown key 'urll' (expected one of: manager, start, unit,"),
    ("hosts:\n  a:\n    ssh: a\n    service:\n      manager: sometimes\n", "5:16",
     "service.manager must be setsid, systemd or external, got 'sometimes'"),
    ("hosts:\n  a:\n    ssh: a\n    service:\n      manager: systemd\n", "4:5",
     "service: with manager systemd needs unit"),
    ("hosts:\n  a:\n    ssh: a\n    service:\n      url: http://h:1\n", "4:5",
     "service: with manager setsid needs start"),
    ("hosts:\n  a:\n    ssh: a\n    service:\n      start: e\n      unit: e.service\n",
     "6:7", "service.unit is a setting of manager systemd; this service's manager is setsid"),
    ("hosts:\n  a:\n    ssh: a\n    service:\n      manager: systemd\n      unit: sglang\n",
     "6:13", "service.unit must be a systemd unit name like sglang.service, got 'sglang'"),
    ("hosts:\n  a:\n    ssh: a\n    service:\n      start: e\n      url: ftp://h\n", "6:12",
     "service.url must be an http:// or https:// URL, got 'ftp://h'"),
    ("hosts:\n  a:\n    ssh: a\n    service:\n      start: e\n      ready: health\n", "6:14",
     "service.ready must be a path starting with /"),
    ("hosts:\n  a:\n    ssh: a\n    service:\n      start: e\n      ready_timeout_s: 0\n",
     "6:24", "service.ready_timeout_s must be a positive integer (seconds), got 0"),
    ("hosts:\n  a:\n    ssh: a\n    service:\n      start: e\n      ready_timeout_s: '9'\n",
     "6:24", "service.ready_timeout_s must be a positive integer (seconds), got '9'"),
    ("hosts:\n  a:\n    ssh: a\n    service:\n      start: \"e 'x\"\n", "5:14",
     "service.start: unbalanced quoting"),
    ("hosts:\n  a:\n    ssh: a\n    service:\n      start: e\n      api_key: sk-live-1\n",
     "6:16", "service.api_key must be ${VAR}"),
    ("hosts:\n  a:\n    ssh: a\n    service:\n      start: e\n      api_key: '${K}'\n",
     "6:16", "service.api_key names ${K}, a variable of the worker's environment, which this "
             "host's env: does not give (add K: \"${K}\" to env:)"),
    ("hosts:\n  a:\n    ssh: a\n    service:\n      start: e\n      gpus: [0, 0]\n", "6:13",
     "service.gpus lists a GPU twice"),
    ("hosts:\n  a:\n    ssh: a\n    service:\n      start: e\n      gpus: 0\n", "6:13",
     "service.gpus must be a non-empty list of NVML GPU indices"),
])
def test_mistakes_are_reported_at_file_line_column(text, where, message):
    got = error_of(text)
    assert got.startswith(f"hosts.yaml:{where}: ") and message in got, got


def test_a_host_declares_its_serving_engine(monkeypatch):
    """A `service:` block: the cell parameters it declares, where each stands, and the JSON
    that carries them to the host's workers in its env — the key only as its ${VAR} name."""
    monkeypatch.setenv("SPECDEC_TEST_TOKEN", "tok-123")
    inv = parse_hosts("hosts:\n  gpu-a:\n    ssh: gpu-a\n"
                      "    env: {SGLANG_API_KEY: \"${SPECDEC_TEST_TOKEN}\"}\n"
                      "    service:\n"
                      "      manager: systemd\n"
                      "      unit: sglang.service\n"
                      "      url: http://127.0.0.1:30000\n"
                      "      api_key: ${SGLANG_API_KEY}\n"
                      "      gpus: [0, 1]\n", "hosts.yaml")
    service = inv["gpu-a"].service
    assert service.declared == {"service_manager": "systemd", "service_unit": "sglang.service",
                                "service_url": "http://127.0.0.1:30000",
                                "service_api_key": "${SGLANG_API_KEY}", "service_gpus": "0,1"}
    assert service.marks["service_url"] == (8, 12) and service.block == (5, 5)
    assert service.record() == {"host": "gpu-a", "declared_in": "hosts.yaml:5",
                                **service.declared}
    carried = inv["gpu-a"].env[deployment.DEPLOYMENT_ENV]
    assert deployment.decode(carried) == service.declared and "tok-123" not in carried
    assert getattr(inv["local"], "service", None) is None
    # the local host may declare one too; its workers inherit the controller's environment,
    # so its key's variable need not be in env:
    local = parse_hosts("hosts:\n  local:\n    service: {start: engine, api_key: '${K}'}\n")
    assert local["local"].service.declared["service_start"] == "engine"


def test_local_host_can_be_configured_and_always_exists(tmp_path, monkeypatch):
    inv = parse_hosts("hosts:\n  local:\n    gpus: [1]\n    labels: {gpu: cpu}\n", "h.yaml")
    assert inv["local"].gpus == [1] and inv["local"].labels == {"gpu": "cpu"}
    assert list(parse_hosts("", "h.yaml")) == ["local"]
    monkeypatch.chdir(tmp_path)
    assert list(load_hosts()) == ["local"]                   # no ./hosts.yaml: just local
    (tmp_path / "hosts.yaml").write_text("hosts:\n  g:\n    ssh: g\n")
    assert list(load_hosts()) == ["local", "g"]              # ./hosts.yaml by default
    with pytest.raises(InputError, match="missing.yaml: no such hosts file"):
        load_hosts(tmp_path / "missing.yaml")


def test_remote_paths_are_single_shell_words():
    nasty = "/srv/a b/$(touch x); 'q\" `id`"
    assert shlex.split(shell_path(nasty)) == [nasty]
    out = subprocess.run(["sh", "-c", f"printf %s {shell_path('~/x $(id)')}"],
                         capture_output=True, text=True, env={"HOME": "/home/u"})
    assert out.stdout == "/home/u/x $(id)"


# -- the worker bundle ---------------------------------------------------------------------------

def test_bundle_holds_the_worker_code_with_kernels_inside_harness():
    first, second = bundle.build_bundle(), bundle.build_bundle()
    assert first.hash == second.hash and first.tarball == second.tarball     # deterministic
    names = set(first.files)
    assert {"harness/__init__.py", "harness/worker/main.py", "harness/worker/__main__.py",
            "harness/remote/launcher.py", "harness/remote/probe.py", "harness/protocol/params.py",
            "harness/worker/workloads/__init__.py", "harness/worker/workloads/noop.py",
            "harness/decode/loop.py", "harness/kernels/__init__.py",
            "harness/kernels/verify/verify_attention.cu"} <= names
    # The controller's side stays behind.
    assert not any(n.startswith(("harness/commands/", "harness/sweep/", "harness/hosts/",
                                 "harness/gate/", "harness/dashboards/")) or n == "harness/cli.py"
                   or "__pycache__" in n or n.endswith(".pyc") for n in names)
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(first.tarball))) as tar:
        assert sorted(tar.getnames()) == sorted(names)
        assert {m.mtime for m in tar.getmembers()} == {0}


def test_bundle_runs_a_cell_with_nothing_but_pythonpath(tmp_path):
    with tarfile.open(fileobj=io.BytesIO(bundle.build_bundle().tarball), mode="r:gz") as tar:
        tar.extractall(tmp_path, filter="data")
    code = ("import harness, harness.kernels, harness.worker.workloads.noop as n; "
            "print(harness.__file__); print(harness.kernels.__file__)")
    out = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(tmp_path)!r}); {code}"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert [Path(p).parent for p in out.stdout.split()] == [tmp_path / "harness",
                                                             tmp_path / "harness" / "kernels"]


def test_scenario_hosts_take_names_and_label_filters_and_a_gpu_busy_policy():
    from harness.sweep.scenario import parse_scenario
    sc = parse_scenario("name: x\nmatrix: {seed: [1]}\nhosts: [gpu-a, {gpu: h200, rack: 2}]\n"
                        "gpu_busy: noisy\n", "s.yaml")
    assert sc.hosts == ["gpu-a", {"gpu": "h200", "rack": 2}] and sc.gpu_busy == "noisy"
    assert parse_scenario("name: x\nmatrix: {seed: [1]}\n", "s.yaml").gpu_busy is None
    with pytest.raises(InputError, match=r"^s.yaml:3:9: hosts\[0\] must be a host name or a "
                                         r"non-empty mapping of labels"):
        parse_scenario("name: x\nmatrix: {seed: [1]}\nhosts: [{}]\n", "s.yaml")
    with pytest.raises(InputError, match=r"^s.yaml:3:11: gpu_busy must be wait or noisy"):
        parse_scenario("name: x\nmatrix: {seed: [1]}\ngpu_busy: maybe\n", "s.yaml")


def test_a_connection_lost_during_the_check_probe_is_one_line_not_a_traceback(monkeypatch):
    """`harness hosts check`: connected, then the probe's channel fails (a dropped link, a
    loaded host past the probe's timeout): that host's line says so; nothing escapes."""
    import asyncio

    from harness.hosts import check as hostcheck
    from harness.hosts.interface import HostUnavailable
    from harness.hosts.ssh import SSHHost

    host = SSHHost(name="h", ssh="u@h", user="u", address="h", port=None, python="python3",
                   workdir="~/w", gpus=[0], labels={}, env={})

    async def connected():
        host.host_key = "known"
        return object()

    async def lost(*a, **k):
        raise HostUnavailable("host h: timed out")

    monkeypatch.setattr(host, "connect", connected)
    monkeypatch.setattr(host, "_run", lost)
    facts = asyncio.run(hostcheck.check_host(host))
    assert facts["reachable"] and facts["error"] == "host h: timed out"
    assert hostcheck.describe(facts) == (False, "h: [red][/]timed out")   # reachable, then lost
