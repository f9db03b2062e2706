"""The drafter's top-k log-probs as one CUDA C++ kernel (kernels/tree/topk.cu), called from Python.

    topk_logprobs(logits, k, out=None, workspace=None, slices=None)

Same contract as kernels/tree/triton_topk.topk_logprobs: (log_probs float32, ids int64) [..., k'],
k' = min(k, V), rows sorted by value descending with ties to the lower id, log_probs = topk -
logsumexp over the whole row in float32. One launch of `slices` CTAs per row: each reads its
slice once and sorts its own top k'; the row's last CTA merges them (topk.cu's header says how).

The call never synchronises with the host and allocates nothing once the workspace exists
(`alloc_workspace`, reused across calls of one shape), so a CUDA graph can capture it; make the
first call outside the capture (it compiles and loads the library: kernels/build.py, cached on
disk). Importing this module works on a host without a GPU.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass

import torch

from harness.kernels.tree.rows import rows_view

MAX_KP, MAX_SLICE, MAX_MERGE = 256, 24576, 4096      # = topk.cu
DTYPES = {torch.float32: 0, torch.bfloat16: 1}       # fp16 is widened to float32 first (a copy)


class _Params(ctypes.Structure):
    """Mirror of ttk::Params (every field 8 bytes wide)."""

    _fields_ = [(name, ctypes.c_void_p) for name in
                ("logits", "out_lp", "out_ids", "part_keys", "part_m", "part_s", "arrive")] + \
               [(name, ctypes.c_int64) for name in
                ("rows", "n1", "stride0", "stride1", "vocab", "kp", "slices", "slice_len", "dtype")]


def _lib():
    from harness.kernels.build import TOPK_SOURCE, load_library

    lib = load_library(source=TOPK_SOURCE)
    if lib.ttk_struct_size() != ctypes.sizeof(_Params):
        raise RuntimeError("topk.cu and cuda_topk.py disagree on the parameter struct")
    return lib


def plan(V: int, k: int, rows: int, sms: int, slices: int | None = None) -> dict:
    """Slices per row and their length (host only). By default one CTA per multiprocessor for
    the whole launch (rows x slices ~ sms): a row read by more CTAs is read faster, but its
    last CTA then merges more lists. Slices hold at most MAX_SLICE logits, and slices x k' at
    most MAX_MERGE (the last CTA's sort)."""
    if V < 1 or k < 1:
        raise ValueError(f"need V >= 1 and k >= 1 (got V={V}, k={k})")
    kp = min(int(k), V)
    if kp > MAX_KP:
        raise ValueError(f"the CUDA top-k supports k <= {MAX_KP} (got {k})")
    fewest, most = math.ceil(V / MAX_SLICE), min(MAX_MERGE // kp, V)
    if fewest > most:
        raise ValueError(f"a vocabulary of {V} needs {fewest} slices, more than the {most} the "
                         f"merge of k' = {kp} takes")
    want = slices if slices is not None else math.ceil(max(sms, 1) / max(rows, 1))
    if slices is not None and not fewest <= slices <= most:
        raise ValueError(f"slices must be in [{fewest}, {most}] for V={V}, k'={kp} (got {slices})")
    n = min(max(want, fewest), most)
    length = math.ceil(V / n)
    return dict(kp=kp, slices=math.ceil(V / length), slice_len=length)


@dataclass
class Workspace:
    """Scratch of one plan. `arrive` must be zero between calls (alloc_workspace zeroes it; every
    completed call leaves it zero); the rest may hold anything."""
    part_keys: torch.Tensor   # int64 [rows * slices * k'] each slice's top k' as composite keys
    part_m: torch.Tensor      # float32 [rows * slices]
    part_s: torch.Tensor      # float32 [rows * slices]
    arrive: torch.Tensor      # int32 [rows]
    slices: int
    kp: int


def _sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def alloc_workspace(logits: torch.Tensor, k: int, slices: int | None = None, sms: int | None = None) -> Workspace:
    """Scratch for `topk_logprobs(logits-like, k)`: allocate once (outside a CUDA graph) and pass
    it as `workspace=`; reusable across calls of that shape."""
    rows = rows_view(logits)[0] if logits.numel() else 0
    sms = sms if sms is not None else (_sms(logits.device) if logits.is_cuda else 1)
    p = plan(logits.shape[-1], k, rows, sms, slices)
    n, dev = max(rows * p["slices"], 1), logits.device
    return Workspace(part_keys=torch.empty(n * p["kp"], dtype=torch.int64, device=dev),
                     part_m=torch.empty(n, dtype=torch.float32, device=dev),
                     part_s=torch.empty(n, dtype=torch.float32, device=dev),
                     arrive=torch.zeros(max(rows, 1), dtype=torch.int32, device=dev),
                     slices=p["slices"], kp=p["kp"])


def make_params(logits: torch.Tensor, out: tuple[torch.Tensor, torch.Tensor], ws: Workspace) -> _Params:
    """The launch parameters for logits as `prepare_logits` returns them (checked here; the
    launcher re-checks the limits and returns cudaErrorInvalidValue)."""
    rows, n1, s0, s1 = rows_view(logits)
    if rows > 65535:     # the grid's y dimension
        raise ValueError(f"at most 65535 rows per call, got {rows}")
    V = logits.shape[-1]
    p = plan(V, ws.kp, rows, 1, ws.slices)
    if ws.arrive.numel() < rows or ws.part_m.numel() < rows * ws.slices \
            or ws.part_keys.numel() < rows * ws.slices * ws.kp:
        raise ValueError("workspace too small for these inputs (alloc_workspace with the same k)")
    lp, ids = out
    for t in (lp, ids, ws.part_keys, ws.part_m, ws.part_s, ws.arrive):
        if t.device != logits.device:
            raise ValueError(f"every tensor must be on {logits.device}, got one on {t.device}")
    c = _Params()
    c.logits, c.out_lp, c.out_ids = logits.data_ptr(), lp.data_ptr(), ids.data_ptr()
    c.part_keys, c.part_m, c.part_s = ws.part_keys.data_ptr(), ws.part_m.data_ptr(), ws.part_s.data_ptr()
    c.arrive = ws.arrive.data_ptr()
    c.rows, c.n1, c.stride0, c.stride1, c.vocab = rows, n1, s0, s1, V
    c.kp, c.slices, c.slice_len = p["kp"], p["slices"], p["slice_len"]
    c.dtype = DTYPES[logits.dtype]
    return c


def prepare_logits(logits: torch.Tensor) -> torch.Tensor:
    """Logits as the kernel reads them: float32 or bfloat16 with a contiguous last dim."""
    if logits.dim() < 1:
        raise ValueError("logits need a vocabulary dimension")
    if logits.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"logits must be float32, bf16 or fp16, got {logits.dtype}")
    x = logits if logits.dtype in DTYPES else logits.float()
    return x if x.stride(-1) == 1 or x.shape[-1] == 1 else x.contiguous()


def empty_out(logits: torch.Tensor, kp: int) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (*logits.shape[:-1], kp)
    return (torch.empty(shape, dtype=torch.float32, device=logits.device),
            torch.empty(shape, dtype=torch.int64, device=logits.device))


def topk_logprobs(logits: torch.Tensor, k: int, out: tuple[torch.Tensor, torch.Tensor] | None = None,
                  workspace: Workspace | None = None, slices: int | None = None,
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(log_probs float32 [..., k'], ids int64 [..., k']) of logits [..., V] on a CUDA device.
    Written into `out` (contiguous) when given; `workspace` from `alloc_workspace` with the same
    k (and slices). One launch, no sync."""
    if logits.device.type != "cuda":
        raise ValueError("the CUDA top-k needs CUDA tensors")
    x = prepare_logits(logits)
    ws = workspace or alloc_workspace(x, k, slices)
    shape = (*x.shape[:-1], ws.kp)
    out = out if out is not None else empty_out(x, ws.kp)
    lp, ids = out
    if (lp.shape != shape or ids.shape != shape or lp.dtype != torch.float32
            or ids.dtype != torch.int64 or not lp.is_contiguous() or not ids.is_contiguous()):
        raise ValueError(f"out must be contiguous float32 and int64 tensors of shape {shape}")
    if x.numel() == 0:
        return lp, ids
    p = make_params(x, out, ws)
    with torch.cuda.device(x.device):
        lib = _lib()
        stream = torch.cuda.current_stream(x.device).cuda_stream
        rc = lib.ttk_topk(ctypes.byref(p), ctypes.c_void_p(stream))
    if rc != 0:
        raise RuntimeError(f"CUDA top-k launch failed: {lib.ttk_error_string(rc).decode()}")
    return lp, ids
