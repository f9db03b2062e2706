"""What the tests that run a workflow's job here share (tests/ci/test_*_workflow_runs.py): a
git repository made of this tree, the planted regression, the controller venv a previous job
left on the runner, and a stand-in for `nvidia-smi` on a machine without a GPU.

The job itself runs through tests/ci/workflow_job.py; each test stands in for its workflow's
`uses:` steps (checkout differs by event: a PR's merge ref, the nightly's main branch).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sysconfig
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# What a commit of this tree holds that a job reads: the package, its scenarios, ci/.
TREE = ("pyproject.toml", "README.md", "harness", "kernels", "dashboards", "scenarios", "ci")


def git(*args, cwd: Path) -> str:
    out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                              "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})
    assert out.returncode == 0, f"git {' '.join(args)}: {out.stderr}"
    return out.stdout.strip()


def author_repo(path: Path) -> Path:
    """A repository at `path` whose branch main is one commit of this tree (as it is on disk,
    uncommitted changes included: what the test is about is the working tree)."""
    files = git("ls-files", "-co", "--exclude-standard", "--", *TREE, cwd=REPO).splitlines()
    for name in files:
        if (REPO / name).is_file():
            (path / name).parent.mkdir(parents=True, exist_ok=True)
            (path / name).write_bytes((REPO / name).read_bytes())
    git("init", "-q", "-b", "main", cwd=path)
    git("add", "-A", cwd=path)
    git("commit", "-qm", "main", cwd=path)
    return path


def plant_worse_drafter(src: Path) -> None:
    """Commit, on `src`'s current branch, a drafter a third as good: the synthetic accepted
    length drops to tau/3 (the plant of tests/gate/test_gate_ab.py). A deterministic quantity,
    so no CPU noise can hide it from a gate."""
    loop = src / "harness" / "decode" / "loop.py"
    text, n = re.subn(r"SyntheticAcceptance\(\s*tau\b", "SyntheticAcceptance(max(1.0, tau / 3)",
                      loop.read_text())
    assert n == 1, ("harness/decode/loop.py no longer builds SyntheticAcceptance(tau, ...): "
                    "update this test")
    loop.write_text(text)
    git("commit", "-qam", "a worse drafter", cwd=src)


def cached_controller_venv(harness_home: Path, workspace_pyproject: bytes) -> Path:
    """The venv a previous job left, keyed like the workflows' step keys it (sha256 of
    pyproject.toml): this test's packages visible through a .pth file, and an old `harness`
    script that the step's `pip install --no-deps -e .` replaces with the checkout's (a fresh
    venv would download torch)."""
    key = hashlib.sha256(workspace_pyproject).hexdigest()[:12]
    path = harness_home / f"venv-{key}"
    venv.create(path, with_pip=False)
    site = Path(sysconfig.get_paths(vars={"base": str(path), "platbase": str(path)})["purelib"])
    site.mkdir(parents=True, exist_ok=True)
    (site / "zz-test-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # pip itself is this test's (from the .pth), run by the venv's python: it installs there.
    for name, body in (("pip", '"$(dirname "$0")/python" -m pip "$@"'),
                       ("harness", 'echo "the checkout was never installed" >&2; exit 99')):
        script = path / "bin" / name
        script.write_text(f"#!/bin/sh\nexec {body}\n" if name == "pip" else f"#!/bin/sh\n{body}\n")
        script.chmod(0o755)
    return path


def installed_from(venv_dir: Path, outside: Path) -> str:
    """Where the venv's `import harness` comes from, asked from `outside` both trees, so that
    no working directory answers instead."""
    return subprocess.run([str(venv_dir / "bin" / "python"), "-c",
                           "import harness; print(harness.__file__)"], cwd=outside,
                          capture_output=True, text=True, timeout=60).stdout.strip()


NO_GPU = "none (CPU test machine)"


def stub_nvidia_smi(folder: Path) -> Path:
    """A folder holding an `nvidia-smi` that prints one CSV row saying there is no GPU: the
    controller steps print the runner's GPU, and this machine has none."""
    folder.mkdir(parents=True, exist_ok=True)
    stub = folder / "nvidia-smi"
    stub.write_text(f"#!/bin/sh\necho 'name, driver_version, clocks.sm [MHz]'\n"
                    f"echo '{NO_GPU}, -, -'\n")
    stub.chmod(0o755)
    return folder


def machine_env(tmp: Path, stubs: Path) -> dict:
    """The runner machine's environment: the stubs first on PATH, a HOME of its own, one
    thread per worker (two CI cores)."""
    return {"PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp),
            "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1"}
