"""Tree-verify attention: the Triton kernel (under the Triton interpreter, on CPU) and the flex
path, against a float64 dense-softmax reference.

Every case draws fresh random inputs (seeded from the case, so runs repeat), poisons the output
and the split workspace with NaN before the call, and fills the KV cache past each sequence's
lengths[b] + T with NaN, so a kernel that skips a row, reads a stale split or reads keys it must
not read fails. The interpreter mishandles bf16 (docs/ARCHITECTURE.md): bf16 is checked on the GPU by
test_triton_verify_gpu.py (`pytest -m gpu`).
"""

from __future__ import annotations

import subprocess
import sys
import zlib

import pytest
import torch

from harness.decode.attention import visibility_bits

pytest.importorskip("triton", reason="Triton is needed (Linux wheels only)")
from harness.kernels.verify import triton_verify  # noqa: E402  (not interpreted here: see conftest.interp)

TOL = {torch.float32: 1e-4, torch.float16: 1e-2}




def call(pool, fn, *args, **kwargs):
    return pool.apply(fn, args, kwargs)


# ---------------------------------------------------------------------------------------------
# Inputs and the float64 reference


def gen_for(*case) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(case).encode()))


def random_tree(b: int, T: int, g: torch.Generator, shape: str = "random") -> torch.Tensor:
    """[b, T, T] bool ancestors-and-self visibility of a tree whose node 0 is the root and whose
    parents precede their children (the DDTree order)."""
    vis = torch.zeros(b, T, T, dtype=torch.bool)
    for i in range(b):
        if shape == "random":
            parent = [-1] + [int(torch.randint(0, j, (1,), generator=g)) for j in range(1, T)]
        elif shape == "chain":
            parent = [j - 1 for j in range(T)]
        elif shape == "star":
            parent = [-1] + [0] * (T - 1)
        for j in range(T):
            a = j
            while a >= 0:
                vis[i, j, a] = True
                a = parent[a]
    return vis


def make_inputs(b, hq, hkv, d, T, lengths, dtype, g, pad=16):
    """q as the model passes it (a transposed view); k, v as views [:, :, :S] of a bigger cache
    whose slots at and past lengths[b] + T hold NaN."""
    S = max(lengths) + T + 3
    q = torch.randn(b, T, hq, d, generator=g).to(dtype).transpose(1, 2)
    k_buf = torch.randn(b, hkv, S + pad, d, generator=g).to(dtype)
    v_buf = torch.randn(b, hkv, S + pad, d, generator=g).to(dtype)
    for i, L in enumerate(lengths):
        k_buf[i, :, L + T:] = float("nan")
        v_buf[i, :, L + T:] = float("nan")
    return q, k_buf[:, :, :S], v_buf[:, :, :S], torch.tensor(lengths, dtype=torch.int32)


def reference(q, k, v, lengths, vis, scale=None):
    """Dense float64 softmax over prefix + tree, per sequence, reading only its L + T keys."""
    b, hq, T, d = q.shape
    group = hq // k.shape[1]
    scale = d ** -0.5 if scale is None else scale
    out = torch.empty(b, hq, T, d, dtype=torch.float64)
    for i in range(b):
        L = int(lengths[i])
        kk = k[i, :, :L + T].double().repeat_interleave(group, 0)
        vv = v[i, :, :L + T].double().repeat_interleave(group, 0)
        visible = torch.cat([torch.ones(T, L, dtype=torch.bool), vis[i]], 1)
        s = (q[i].double() @ kk.transpose(1, 2) * scale).masked_fill(~visible, float("-inf"))
        out[i] = s.softmax(-1) @ vv
    return out


def run_poisoned(interp, q, k, v, lengths, vis, num_splits=None, config=None):
    """Run the kernel into NaN-filled output and workspace; check every element was written."""
    b, hq, T, d = q.shape
    out = torch.full((b, hq, T, d), float("nan"), dtype=q.dtype)
    ws = triton_verify.alloc_workspace(q, k, num_splits, config)
    for w in ws:
        w.fill_(float("nan"))
    res = call(interp, triton_verify.tree_verify_attention, q, k, v, lengths, visibility_bits(vis),
               num_splits=num_splits, out=out, workspace=ws, config=config)
    assert res.shape == out.shape and res.dtype == q.dtype
    assert torch.isfinite(res).all(), f"{(~torch.isfinite(res)).sum()} output values not written"
    return res


def rel_err(out, ref) -> float:
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


# ---------------------------------------------------------------------------------------------
# The Triton kernel


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("T", [1, 5, 17, 33])
@pytest.mark.parametrize("d", [32, 64])
@pytest.mark.parametrize("hq,hkv", [(4, 2), (8, 1)])
def test_matches_reference(interp, hq, hkv, d, T, dtype):
    g = gen_for(hq, hkv, d, T, dtype)
    lengths = [5, 37]
    q, k, v, L = make_inputs(2, hq, hkv, d, T, lengths, dtype, g)
    vis = random_tree(2, T, g)
    out = run_poisoned(interp, q, k, v, L, vis)
    assert rel_err(out, reference(q, k, v, L, vis)) <= TOL[dtype]


@pytest.mark.parametrize("num_splits", [1, 3, 4, 16])
def test_split_prefix(interp, num_splits):
    # 300 and 130 keys are 10 and 5 tiles of 32 (fp32): 3 and 4 splits leave uneven chunks, 16
    # leaves splits with nothing to do; the tree chunk crosses a 32-bit word (T = 40).
    g = gen_for("split", num_splits)
    q, k, v, L = make_inputs(2, 4, 2, 32, 40, [300, 130], torch.float32, g)
    vis = random_tree(2, 40, g)
    out = run_poisoned(interp, q, k, v, L, vis, num_splits=num_splits)
    assert rel_err(out, reference(q, k, v, L, vis)) <= 1e-4


def test_default_splits_on_long_prefix(interp):
    # The host heuristic (S = 712: three splits of at least MIN_CHUNK keys): the long sequence
    # uses all three, the short one only the first; the combine must skip the idle splits'
    # stale (NaN) slots.
    g = gen_for("heuristic")
    q, k, v, L = make_inputs(2, 4, 2, 32, 9, [700, 200], torch.float16, g)
    assert triton_verify.plan(q, k)["num_splits"] == 3
    vis = random_tree(2, 9, g)
    out = run_poisoned(interp, q, k, v, L, vis)
    assert rel_err(out, reference(q, k, v, L, vis)) <= 1e-2


def test_plain_decoding_takes_longer_tiles_and_fewer_splits():
    # One query row per head (M = G = 4): 128-key tiles and about three programs for every four
    # multiprocessors; the tree shapes (M = 64, 260) keep 64-key tiles.
    k = torch.empty(1, 8, 8192, 128, dtype=torch.float16)
    plans = {T: triton_verify.plan(torch.empty(1, 32, T, 128, dtype=torch.float16), k) for T in (1, 16, 65)}
    assert plans[1]["BLOCK_N"] == 128 and plans[16]["BLOCK_N"] == plans[65]["BLOCK_N"] == 64
    sm = triton_verify._sm_count(k.device)
    assert plans[1]["num_splits"] == max(1, 3 * sm // 4 // 8)
    # fp32 (the lossless checks) keeps its narrow tiles
    assert triton_verify.plan(torch.empty(1, 32, 1, 128), k.float())["BLOCK_N"] == 32


def test_split_count_fills_whole_waves(monkeypatch):
    # 65 tree tokens, b 1, an H200's 132 multiprocessors at two programs each: five row blocks of
    # 64 rows a KV head, 40 programs a split. 4096 keys keep 5 (6 measured 11 % slower); longer
    # prefixes take a count whose programs fill their last wave (8 at 65536 keys, a second wave a
    # fifth full, measured 44 % slower than 6), never the old rule's 5 (one wave three quarters full).
    cdiv = lambda a, b: -(-a // b)
    pick = {keys: triton_verify.splits_by_waves(cdiv(keys, 64), 2, 40, 264, min(cdiv(keys, 256), 256), 4)
            for keys in (4096, 16384, 65536, 131072)}
    assert pick[4096] == 5
    for keys in (16384, 65536, 131072):
        used = cdiv(cdiv(keys, 64), cdiv(cdiv(keys, 64), pick[keys]))
        assert pick[keys] != 5 and used * 40 / (cdiv(used * 40, 264) * 264) >= 0.9, (keys, pick[keys])
    # plan() takes it for 65 tree tokens. One row block (T 16): two programs a multiprocessor
    # (32 splits) where each streams 32 tiles (65536 keys), about three for every two (24) where
    # that would leave 8 (16384), and fewer where the keys are short (4096: MIN_CHUNK)
    monkeypatch.setattr(triton_verify, "_sm_count", lambda device: 132)
    k = torch.empty(1, 8, 65536, 128, dtype=torch.float16)
    t16 = torch.empty(1, 32, 16, 128, dtype=torch.float16)
    assert triton_verify.plan(torch.empty(1, 32, 65, 128, dtype=torch.float16), k)["num_splits"] == pick[65536]
    assert [triton_verify.plan(t16, k[:, :, :n])["num_splits"] for n in (65536, 16384, 4096)] == [32, 24, 16]


@pytest.mark.parametrize("shape", ["chain", "star"])
def test_tree_shapes(interp, shape):
    # chain: token i sees tree keys 0..i; star: only the root and itself.
    g = gen_for("shape", shape)
    q, k, v, L = make_inputs(2, 8, 2, 32, 33, [11, 64], torch.float32, g)
    vis = random_tree(2, 33, g, shape)
    out = run_poisoned(interp, q, k, v, L, vis)
    assert rel_err(out, reference(q, k, v, L, vis)) <= 1e-4


def test_tree_keys_outside_the_ancestors_do_not_leak(interp):
    # Huge values on tree keys that token 3 of a star may not see: any leak dominates its row.
    g = gen_for("leak")
    T = 6
    q, k, v, L = make_inputs(1, 4, 2, 32, T, [20], torch.float32, g)
    vis = random_tree(1, T, g, "star")
    v[0, :, 20 + 4:20 + T] = 1e4            # tree keys 4, 5: siblings of token 3
    out = run_poisoned(interp, q, k, v, L, vis)
    ref = reference(q, k, v, L, vis)
    assert rel_err(out[:, :, 3], ref[:, :, 3]) <= 1e-4
    assert out[:, :, 3].abs().max() < 100


@pytest.mark.parametrize("lengths", [[0, 0], [0, 9]])
def test_empty_prefix(interp, lengths):
    g = gen_for("empty", lengths)
    q, k, v, L = make_inputs(2, 4, 2, 32, 5, lengths, torch.float16, g)
    vis = random_tree(2, 5, g)
    out = run_poisoned(interp, q, k, v, L, vis)
    assert rel_err(out, reference(q, k, v, L, vis)) <= 1e-2


def test_one_combine_row_per_program(interp):
    # The GPU combine layout (one output row per program) with several active splits.
    g = gen_for("rows1")
    q, k, v, L = make_inputs(2, 4, 2, 32, 5, [130, 70], torch.float32, g)
    vis = random_tree(2, 5, g)
    out = run_poisoned(interp, q, k, v, L, vis, num_splits=3, config={"COMBINE_ROWS": 1})
    assert rel_err(out, reference(q, k, v, L, vis)) <= 1e-4


def test_sm_scale_and_int64_lengths(interp):
    g = gen_for("scale")
    q, k, v, L = make_inputs(2, 4, 2, 32, 5, [5, 37], torch.float32, g)
    vis = random_tree(2, 5, g)
    out = call(interp, triton_verify.tree_verify_attention, q, k, v, L.long(), visibility_bits(vis),
               sm_scale=0.05)
    assert rel_err(out, reference(q, k, v, L, vis, scale=0.05)) <= 1e-4


def test_rejects_bad_inputs(interp):
    g = gen_for("bad")
    q, k, v, L = make_inputs(2, 4, 2, 32, 5, [5, 7], torch.float32, g)
    bits = visibility_bits(random_tree(2, 5, g))
    fn = triton_verify.tree_verify_attention
    with pytest.raises(ValueError, match="tree_bits"):
        call(interp, fn, q, k, v, L, bits.long())
    with pytest.raises(ValueError, match="query heads"):
        call(interp, fn, q[:, :3], k, v, L, bits)
    with pytest.raises(ValueError, match="workspace too small"):
        call(interp, fn, q, k, v, L, bits, workspace=(torch.empty(1), torch.empty(1)))
    # Here (not interpreted) CPU tensors cannot run: a clear error, not a Triton crash.
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        fn(q, k, v, L, bits)


@pytest.mark.parametrize("T", [5, 32, 33, 65])
def test_visibility_bits_round_trip(T):
    vis = random_tree(2, T, gen_for("bits", T))
    bits = visibility_bits(vis)
    assert bits.shape == (2, T, (T + 31) // 32) and bits.dtype == torch.int32
    j = torch.arange(T)
    unpacked = ((bits[:, :, j // 32] >> (j % 32)) & 1).bool()
    assert torch.equal(unpacked, vis)


# ---------------------------------------------------------------------------------------------
# flex_attention (eager on CPU)


@pytest.mark.filterwarnings("ignore:.*without torch.compile")   # eager flex on CPU: tests only
@pytest.mark.parametrize("tree_as", ["bits", "bool"])
@pytest.mark.parametrize("hq,hkv,T", [(4, 2, 5), (8, 1, 33)])
def test_flex_matches_reference(hq, hkv, T, tree_as):
    from harness.decode.flex_verify import flex_tree_verify
    g = gen_for("flex", hq, hkv, T, tree_as)
    q, k, v, L = make_inputs(2, hq, hkv, 32, T, [5, 37], torch.float32, g)
    vis = random_tree(2, T, g)
    # flex reads whole blocks, masking afterwards: NaN in unread slots would poison it. The
    # Triton tests cover "never reads past L + T"; here the stale slots hold finite values.
    k, v = torch.nan_to_num(k, nan=7.0), torch.nan_to_num(v, nan=7.0)
    out = flex_tree_verify(q, k, v, L, visibility_bits(vis) if tree_as == "bits" else vis)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert rel_err(out, reference(q, k, v, L, vis)) <= 1e-4


def test_flex_failure_is_a_clear_error(monkeypatch):
    from harness.decode import flex_verify
    import torch.nn.attention.flex_attention as fa

    def broken(*args, **kwargs):
        raise AssertionError("LoweringException: something deep inside inductor\nmore lines")

    monkeypatch.setattr(fa, "flex_attention", broken)
    g = gen_for("flexfail")
    q, k, v, L = make_inputs(1, 4, 2, 32, 5, [8], torch.float32, g)
    k, v = torch.nan_to_num(k), torch.nan_to_num(v)
    vis = random_tree(1, 5, g)
    with pytest.raises(flex_verify.FlexVerifyError, match=r"T=5 tree tokens, d=32.*LoweringException"):
        flex_verify.flex_tree_verify(q, k, v, L, vis, compiled=False)


# ---------------------------------------------------------------------------------------------


def test_cpu_decode_path_does_not_import_triton():
    code = ("import sys, harness.decode.attention, harness.decode.loop, harness.decode.flex_verify, "
            "harness.worker.workloads.decode; print('triton' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"
