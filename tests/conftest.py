"""Fixtures shared by the test files, and the `gpu` marker's skip.

A test marked `@pytest.mark.gpu` needs a CUDA GPU: without torch or without a visible CUDA
device it is skipped, with the reason, before it runs (`pytest_collection_modifyitems`). The
check is `torch.cuda.is_available()` alone, made once and only when a collected test carries
the marker, so collecting on a CPU host initialises nothing. `pytest -m gpu` runs exactly these
tests (ci/gpu/selfcheck.sh runs them and then the kernels under compute-sanitizer). GPU tests
ask for the device through the `cuda` fixture; a test that does is marked `gpu` here if its
file forgot to. The same hook collects the slowest files first (SLOW_FILES).
"""

from __future__ import annotations

import functools
import importlib.util
import multiprocessing

import pytest


@functools.cache
def _no_gpu_reason() -> str | None:
    """Why the gpu tests cannot run here, or None when they can."""
    if importlib.util.find_spec("torch") is None:
        return "needs a CUDA GPU: torch is not installed"
    import torch

    if not torch.cuda.is_available():
        return f"needs a CUDA GPU: none is visible to torch {torch.__version__}"
    return None


# The files that take longest on a two-CPU CI machine (tens of seconds each: a serving engine,
# the kernels' emulation and nvcc, the Triton interpreter, real workflows, browsers, sshd and
# Slurm), longest first: `make test` hands whole files to its workers in collection order
# (pytest-xdist, --dist loadfile), so one of these collected late ran alone at the end of the
# suite (~600 s with it there). Seconds a file, `pytest --durations=0` on two CPUs, session 54.
SLOW_FILES = (
    "tests/service/test_service_engine.py",             # 105
    "tests/kernels/test_custom_kernel_emulated.py",     # 95
    "tests/kernels/test_triton_topk.py",                # 91
    "tests/ci/test_nightly_workflow_runs.py",           # 85
    "tests/kernels/test_kernels_compile.py",            # 75
    "tests/dashboards/test_report.py",                  # 65
    "tests/hosts/test_slurm.py",                        # 55
    "tests/hosts/test_ssh.py",                          # 45
    "tests/commands/test_compare.py",                   # 38
    "tests/dashboards/test_mlflow_ui.py",               # 34
    "tests/ci/test_pr_workflow_runs.py",                # 32
)


@pytest.hookimpl(tryfirst=True)        # before `-m gpu` selects: the marker added here counts
def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))   # stable
    for item in items:                  # a test that asks for the GPU is a gpu test
        if "cuda" in getattr(item, "fixturenames", ()) and item.get_closest_marker("gpu") is None:
            item.add_marker(pytest.mark.gpu)
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    reason = _no_gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def cuda():
    """torch.device("cuda"), or a skip saying why there is none (no torch, no visible GPU)."""
    reason = _no_gpu_reason()
    if reason is not None:
        pytest.skip(reason)
    import torch

    return torch.device("cuda")


@pytest.fixture(scope="session")
def interp():
    """A child process with TRITON_INTERPRET=1 that runs Triton kernels on CPU tensors, fed
    through a spawn pool (tensors travel through shared memory): `interp.apply(fn, args)`.

    triton.jit reads TRITON_INTERPRET when a kernel (or one of triton's own library functions) is
    defined, i.e. at the first `import triton`; in this process that may already have happened,
    so the interpreter gets a fresh spawned process, one for the whole session.
    """
    pytest.importorskip("triton", reason="Triton is needed (Linux wheels only)")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        pool = multiprocessing.get_context("spawn").Pool(1)
    try:
        from harness.kernels.verify import triton_verify
        assert pool.apply(triton_verify._interpreting), "the child does not interpret"
        yield pool
    finally:
        pool.terminate()
        pool.join()


@pytest.fixture(scope="session")
def _migrated_store(tmp_path_factory):
    """An empty MLflow sqlite store with its schema made, once per test process: creating one
    runs every migration of MLflow's schema (seconds), and most tests only need a store."""
    pytest.importorskip("mlflow", reason="MLflow is needed")
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def fresh_store(_migrated_store):
    """fresh_store(folder, name="mlflow.db") -> the sqlite URI of a new, empty store there (a
    copy of a migrated one). Tests of creating a store itself use a path that does not exist."""
    import shutil

    def make(folder, name: str = "mlflow.db") -> str:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_migrated_store, path)
        return f"sqlite:///{path}"

    return make
