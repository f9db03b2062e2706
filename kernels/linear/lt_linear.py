"""F.linear on cuBLASLt with each GEMM shape's algorithm timed on this GPU (blas_impl cublaslt_tuned).

    linear(x, weight) -> y          x [..., K] bf16 / fp16 on CUDA, weight [N, K]

torch's F.linear asks cuBLAS (or, with `preferred_blas_library("cublaslt")`, cuBLASLt's
heuristic) for one algorithm a call shape and runs its first pick. At the verify's 65 rows on an
H100 that pick is not the fastest algorithm the heuristic offers at every Qwen3-8B shape
(kernels/NOTES.md, "Session 35": the lm_head 435.6 against 420.5 µs, q/k/v 22.5 against 21.6),
and the lm_head's is a cooperative kernel behind a memset, whose boundary idles 5 µs a step.

So at the first call of a shape (rows, N, K, dtype) in a process this module asks cuBLASLt's
heuristic for up to MAX_ALGOS algorithms that fit WORKSPACE_BYTES, checks each one's output
against F.linear's, times each one and F.linear itself the way the loop runs them (CUDA graphs
of calls over weight copies that together exceed L2 twice, each call between a kernel that
writes its input and one that reads its output, whose own time is taken off; rounds
interleaved, median of ROUNDS), and keeps the fastest for every later call of that shape,
F.linear included: an algorithm replaces it only when faster by more than MIN_GAIN, so noise
does not flip the choice.
A first call inside a CUDA graph capture cannot time anything: it takes the heuristic's first
pick and says so (`Plan.timed`). `plans()` lists the choices, which a decode result records.

cuBLASLt is reached through ctypes in the copy of libcublasLt that torch's cuBLAS loaded: no
build and no headers, only the few declarations below. Every call runs on torch's current
stream with a workspace kept per device, never synchronises with the host and allocates only
its output, so it can be captured in a CUDA graph.

Measured (kernels/NOTES.md, "Session 37" and "Session 40", H100): alone, one layer's four GEMMs
at 65 rows take 144.6 µs against cuBLASLt's heuristic pick's 149.4 and the lm_head 422.0 against
435.2. Ranked between neighbours, q/k/v and the lm_head take another algorithm and gate/up keeps
the heuristic's pick (alone, its 128x72 tile ranked 1 µs faster and ran 1.2 µs slower in the
step); in the gpu/full loop that is 0.3-0.4 % more tokens/s at 4k and 16k, level at 64k (the
gate's verdict: unchanged), so `auto` keeps the heuristic's pick and this stays opt-in.

More rows than MAX_ROWS (prefill) and inputs the call cannot take as they are (not contiguous,
a pointer off cuBLASLt's default 256-byte alignment, another dtype) go to F.linear, which
computes the same GEMM.

Reference: torch.nn.functional.linear. Tests: tests/kernels/test_lt_linear.py (the choice, on the
CPU) and test_lt_linear_gpu.py. Benchmark: the op workload's `linear` family and the decode loop
with blas_impl cublaslt_tuned (scenarios/blas-ab.yaml).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import statistics
import threading
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

MAX_ROWS = 512             # decode's forwards (the verify's b x 65 rows); prefill goes to F.linear
MAX_ALGOS = 16             # algorithms asked of the heuristic a shape
WORKSPACE_BYTES = 32 << 20
MIN_GAIN = 0.01            # an algorithm replaces F.linear only when this much faster
ROUNDS, CALLS = 5, 8       # timing: rounds of a graph of CALLS calls a weight copy, a candidate
ALIGNMENT = 256            # the heuristic's default assumption for every pointer (bytes)

# cuBLASLt's enums (cublasLt.h, library_types.h; stable since CUDA 11)
_CUDA_R_32F, _CUDA_R_16F, _CUDA_R_16BF = 0, 2, 14
_CUBLAS_COMPUTE_32F = 68
_OP_N, _OP_T = 0, 1
_DESC_TRANSA, _DESC_TRANSB = 3, 4
_PREF_MAX_WORKSPACE_BYTES = 1
_ALGO_CONFIG_ID, _ALGO_CONFIG_TILE_ID, _ALGO_CONFIG_SPLITK_NUM = 0, 1, 2
_DTYPES = {torch.bfloat16: _CUDA_R_16BF, torch.float16: _CUDA_R_16F}


class _Algo(ctypes.Structure):                  # cublasLtMatmulAlgo_t
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class _Heuristic(ctypes.Structure):             # cublasLtMatmulHeuristicResult_t
    _fields_ = [("algo", _Algo), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves_count", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


class CublasLtError(RuntimeError):
    pass


@dataclass
class Plan:
    """What one GEMM shape runs: `algo` (None: F.linear was fastest, or nothing else ran), its
    time and F.linear's a call (µs, None where not timed), how many algorithms were tried, and
    the algorithm's cuBLASLt id, tile id and split-K count."""
    rows: int
    n: int
    k: int
    dtype: str
    algo: _Algo | None = None
    us: float | None = None
    torch_us: float | None = None
    tried: int = 0
    timed: bool = True
    config: tuple[int, int, int] | None = None
    _descs: tuple = field(default=(), repr=False)

    def as_dict(self) -> dict:
        cfg = self.config
        return {"rows": self.rows, "n": self.n, "k": self.k, "dtype": self.dtype,
                "runs": "torch" if self.algo is None else f"algo {cfg[0]} tile {cfg[1]} splitk {cfg[2]}",
                "us": _round(self.us), "torch_us": _round(self.torch_us), "tried": self.tried,
                "timed": self.timed}


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def choose(torch_us: float, algo_us: list[float], min_gain: float = MIN_GAIN) -> int | None:
    """The index of the algorithm to run, or None for F.linear: the fastest algorithm if it
    beats F.linear's time by more than `min_gain` (a fraction), else F.linear."""
    if not algo_us:
        return None
    best = min(range(len(algo_us)), key=algo_us.__getitem__)
    return best if algo_us[best] < torch_us * (1.0 - min_gain) else None


def takes(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear` runs x @ weight^T on cuBLASLt itself (else F.linear)."""
    K = x.shape[-1]
    return (x.device.type == "cuda" and x.dtype in _DTYPES and weight.dtype == x.dtype
            and weight.dim() == 2 and weight.shape[1] == K and K % 8 == 0 and weight.shape[0] % 8 == 0
            and 0 < x.numel() // K <= MAX_ROWS and x.is_contiguous() and weight.is_contiguous()
            and x.data_ptr() % ALIGNMENT == 0 and weight.data_ptr() % ALIGNMENT == 0)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """F.linear(x, weight), on the algorithm timed fastest for its shape on this GPU."""
    if not takes(x, weight):
        return F.linear(x, weight)
    K, N = x.shape[-1], weight.shape[0]
    plan = _plan(x.numel() // K, N, K, x.dtype, x.device, weight)
    if plan.algo is None:
        return F.linear(x, weight)
    y = torch.empty(*x.shape[:-1], N, dtype=x.dtype, device=x.device)
    _matmul(plan, x, weight, y)
    return y


def plans() -> list[dict]:
    """Every shape planned in this process, in the order first called."""
    return [p.as_dict() for p in _PLANS.values()]


# -- the library --------------------------------------------------------------------------

_LOCK = threading.Lock()
_PLANS: dict[tuple, Plan] = {}
_STATE: dict = {}                       # "lib", and per device index: (handle, workspace)


def _lib() -> ctypes.CDLL:
    if "lib" not in _STATE:
        torch.cuda.current_blas_handle()       # loads torch's libcublas, and libcublasLt with it
        path = None
        with open("/proc/self/maps") as maps:
            for line in maps:
                if "libcublasLt.so" in line:
                    path = line.split()[-1]
                    break
        path = path or ctypes.util.find_library("cublasLt")
        if path is None:
            raise CublasLtError("libcublasLt is not loaded by torch and not on the library path")
        lib = ctypes.CDLL(path)
        p, i, u64, i64, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_int64, ctypes.c_size_t
        for name, args in (
                ("cublasLtCreate", [ctypes.POINTER(p)]),
                ("cublasLtMatmulDescCreate", [ctypes.POINTER(p), i, i]),
                ("cublasLtMatmulDescSetAttribute", [p, i, p, sz]),
                ("cublasLtMatrixLayoutCreate", [ctypes.POINTER(p), i, u64, u64, i64]),
                ("cublasLtMatmulPreferenceCreate", [ctypes.POINTER(p)]),
                ("cublasLtMatmulPreferenceSetAttribute", [p, i, p, sz]),
                ("cublasLtMatmulAlgoGetHeuristic", [p, p, p, p, p, p, p, i, ctypes.POINTER(_Heuristic),
                                                    ctypes.POINTER(i)]),
                ("cublasLtMatmulAlgoConfigGetAttribute", [ctypes.POINTER(_Algo), i, p, sz,
                                                          ctypes.POINTER(sz)]),
                ("cublasLtMatmul", [p, p, p, p, p, p, p, p, p, p, p, p, ctypes.POINTER(_Algo), p, sz, p])):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int
        _STATE["lib"] = lib
    return _STATE["lib"]


def _check(status: int, what: str) -> None:
    if status != 0:
        raise CublasLtError(f"{what} failed: cublasStatus_t {status}")


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _device_state(device: torch.device):
    index = _index(device)
    if index not in _STATE:
        lib = _lib()
        handle = ctypes.c_void_p()
        with torch.cuda.device(index):
            _check(lib.cublasLtCreate(ctypes.byref(handle)), "cublasLtCreate")
            workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        _STATE[index] = (handle, workspace)
    return _STATE[index]


def _descs(rows: int, N: int, K: int, dtype: torch.dtype) -> tuple:
    """(matmul desc, A, B, D layouts) of y [rows, N] = x [rows, K] @ w [N, K]^T, row-major, as
    cuBLASLt's column-major y^T (N x rows) = w (op T of K x N, ld K) x^T (K x rows, ld K)."""
    lib, dt = _lib(), _DTYPES[dtype]
    desc = ctypes.c_void_p()
    _check(lib.cublasLtMatmulDescCreate(ctypes.byref(desc), _CUBLAS_COMPUTE_32F, _CUDA_R_32F),
           "cublasLtMatmulDescCreate")
    for attr, op in ((_DESC_TRANSA, _OP_T), (_DESC_TRANSB, _OP_N)):
        v = ctypes.c_int32(op)
        _check(lib.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(v), ctypes.sizeof(v)),
               "cublasLtMatmulDescSetAttribute")
    layouts = []
    for r, c, ld in ((K, N, K), (K, rows, K), (N, rows, N)):
        layout = ctypes.c_void_p()
        _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), dt, r, c, ld),
               "cublasLtMatrixLayoutCreate")
        layouts.append(layout)
    return (desc, *layouts)


def _heuristics(handle, descs: tuple) -> list[_Algo]:
    lib = _lib()
    desc, a, b, d = descs
    pref = ctypes.c_void_p()
    _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "cublasLtMatmulPreferenceCreate")
    ws = ctypes.c_uint64(WORKSPACE_BYTES)
    _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_MAX_WORKSPACE_BYTES, ctypes.byref(ws),
                                                    ctypes.sizeof(ws)), "cublasLtMatmulPreferenceSetAttribute")
    results = (_Heuristic * MAX_ALGOS)()
    found = ctypes.c_int(0)
    _check(lib.cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, d, d, pref, MAX_ALGOS, results,
                                              ctypes.byref(found)), "cublasLtMatmulAlgoGetHeuristic")
    return [_copy_algo(results[i].algo) for i in range(found.value)
            if results[i].state == 0 and results[i].workspace_size <= WORKSPACE_BYTES]


def _copy_algo(algo: _Algo) -> _Algo:
    out = _Algo()
    ctypes.memmove(ctypes.byref(out), ctypes.byref(algo), ctypes.sizeof(_Algo))
    return out


def _config(algo: _Algo) -> tuple[int, int, int]:
    lib, values = _lib(), []
    for attr in (_ALGO_CONFIG_ID, _ALGO_CONFIG_TILE_ID, _ALGO_CONFIG_SPLITK_NUM):
        v, written = ctypes.c_int32(0), ctypes.c_size_t(0)
        _check(lib.cublasLtMatmulAlgoConfigGetAttribute(ctypes.byref(algo), attr, ctypes.byref(v),
                                                        ctypes.sizeof(v), ctypes.byref(written)),
               "cublasLtMatmulAlgoConfigGetAttribute")
        values.append(v.value)
    return tuple(values)


_ONE, _ZERO = ctypes.c_float(1.0), ctypes.c_float(0.0)


def _run(descs: tuple, algo: _Algo, x: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> int:
    handle, workspace = _device_state(x.device)
    desc, a, b, d = descs
    return _lib().cublasLtMatmul(
        handle, desc, ctypes.byref(_ONE), w.data_ptr(), a, x.data_ptr(), b, ctypes.byref(_ZERO),
        y.data_ptr(), d, y.data_ptr(), d, ctypes.byref(algo), workspace.data_ptr(), WORKSPACE_BYTES,
        torch.cuda.current_stream(x.device).cuda_stream)


def _matmul(plan: Plan, x: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> None:
    _check(_run(plan._descs, plan.algo, x, w, y), "cublasLtMatmul")


# -- the plan: checked and timed at a shape's first call --------------------------------------

def _plan(rows: int, N: int, K: int, dtype: torch.dtype, device: torch.device,
          weight: torch.Tensor) -> Plan:
    key = (rows, N, K, dtype, _index(device))
    plan = _PLANS.get(key)
    if plan is None:
        with _LOCK:
            plan = _PLANS.get(key) or _tune(rows, N, K, dtype, device, weight)
            _PLANS[key] = plan
    return plan


def _tune(rows: int, N: int, K: int, dtype: torch.dtype, device: torch.device,
          weight: torch.Tensor) -> Plan:
    name = str(dtype).removeprefix("torch.")
    capturing = torch.cuda.is_current_stream_capturing()
    if capturing and _index(device) not in _STATE:
        # its workspace would come from the capture's memory pool: F.linear, untimed
        return Plan(rows, N, K, name, timed=False)
    handle, _ = _device_state(device)
    descs = _descs(rows, N, K, dtype)
    algos = _heuristics(handle, descs)
    plan = Plan(rows, N, K, name, tried=len(algos), _descs=descs)
    if not algos:
        return plan                                      # F.linear
    if capturing:
        # nothing can be timed or checked inside a capture: the heuristic's first pick
        plan.algo, plan.config, plan.timed = algos[0], _config(algos[0]), False
        return plan
    x = torch.randn(rows, K, dtype=dtype, device=device)
    # weight copies that together exceed L2 twice, so each call streams its weight from memory
    # as the loop's calls of a layer do (the first copy is the weight itself)
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    extra = min(7, max(0, -(-2 * l2 // max(1, weight.numel() * weight.element_size())) - 1))
    weights = [weight] + [torch.randn_like(weight) for _ in range(extra)]
    ref = F.linear(x, weight).float()
    tol = 1e-2 * ref.abs().max().item() + 1e-6
    good = []
    for algo in algos:
        y = torch.empty(rows, N, dtype=dtype, device=device)
        if _run(descs, algo, x, weight, y) == 0:
            torch.cuda.synchronize(device)
            if (y.float() - ref).abs().max().item() <= tol:
                good.append(algo)
    if not good:
        return plan
    times = time_candidates([None] + good, descs, x, weights)
    best = choose(times[0], times[1:])
    plan.torch_us = times[0]
    if best is None:
        plan.us = times[0]
    else:
        plan.algo, plan.us, plan.config = good[best], times[1 + best], _config(good[best])
    return plan


def time_candidates(candidates: list, descs: tuple, x: torch.Tensor, weights: list[torch.Tensor],
                    neighbours: bool = True) -> list[float]:
    """Each candidate's time a call (µs; None: F.linear, else an algorithm), as the loop runs it:
    CUDA graphs of CALLS calls a weight copy, rounds interleaved, median of ROUNDS.

    With `neighbours` every call sits between the two kernels it has in the step, one that
    writes its input (a norm there) and one that reads its output (the next layer's kernel),
    and their own time, timed alone the same way, is taken off: the algorithm is ranked where
    it runs. Alone, back to back over cold weights, the 128x72 tile won gate/up by 1.0 µs and
    lost it by 1.2 µs in the step (kernels/NOTES.md, "Session 37")."""
    rows, N = x.shape[0], weights[0].shape[0]
    outs = [torch.empty(rows, N, dtype=x.dtype, device=x.device) for _ in weights]
    sink = torch.empty(rows, N, dtype=x.dtype, device=x.device)
    alone = object()                     # the neighbours without a GEMM between them

    def calls(algo):
        for _ in range(CALLS):
            for w, y in zip(weights, outs):
                if neighbours:
                    x.mul_(1.0)
                if algo is None:
                    y = F.linear(x, w)
                elif algo is not alone:
                    _check(_run(descs, algo, x, w, y), "cublasLtMatmul")
                if neighbours:
                    torch.neg(y, out=sink)

    sets = list(candidates) + ([alone] if neighbours else [])
    graphs = []
    for algo in sets:
        calls(algo)                       # the set eagerly first: first calls load outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            calls(algo)
        graphs.append(graph)
    # Rounds interleave the candidates (not kerneltime.time_calls, which times one call set's
    # replays back to back): a clock that drifts during the tuning moves every candidate alike.
    samples = [[] for _ in graphs]
    n_calls = CALLS * len(weights)
    for _ in range(ROUNDS):
        for i, g in enumerate(graphs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            g.replay()
            end.record()
            end.synchronize()
            samples[i].append(start.elapsed_time(end) * 1e3 / n_calls)
    times = [statistics.median(s) for s in samples]
    if neighbours:
        base = times.pop()
        times = [t - base for t in times]
    return times
