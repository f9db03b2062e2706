// Top-k log-probs of the drafter's logits (CUDA C++): topk(x, k) - logsumexp(x) per row, one launch.
//
// Same contract as kernels/tree/triton_topk.py (rows sorted by value descending, ties by the lower
// id, log-probs (x - M) - log(sum exp(x - M)) in float32, M the row's max): one CTA per slice of a
// row (grid: slices x rows). Each CTA
//   1. reads its slice once into shared memory as order-preserving 32-bit keys, with the slice's
//      max and sum of exp(x - max) for the logsumexp;
//   2. finds a threshold t with at least k' elements >= t: the k'-th largest of ~2k' group maxima
//      (k' groups each hold an element >= it), so typically ~1.3 k' elements pass;
//   3. compacts the passing elements (a ballot per warp, one shared atomic per warp) and sorts them
//      by (value desc, id asc) as 64-bit composite keys; the first k' are the slice's own top k';
//   4. publishes them and its (max, sum), and draws a ticket: the row's last CTA merges the row's
//      slices (a sort of slices x k' keys, every list already sorted), writes the outputs and
//      resets the ticket, so a CUDA graph replays the launch as is.
// A slice whose threshold lets more than CAP elements through (all-equal or heavily tied rows) takes
// an exact radix select over its keys instead (4 passes of 8 bits, then an ordered compaction of
// the keys equal to the k'-th, lowest ids first): slower, never wrong.
//
// Why this shape: the Triton kernel's three launches (stats, a gather reading the row again from
// L2, a finish ranking ~1.3 k' candidates per row by all-pairs counting) took ~15 us at the loop's
// shape on the H200, bound by their serial parts and launches, not by the 9.1 MB they read (~2.3
// us at the copy rate; kernels/NOTES.md). Here the row is read once and the only serial part is
// the last CTA's merge of a few hundred sorted keys.
//
// Keys: a float's bits with the sign bit flipped (positives) or all bits flipped (negatives), so
// unsigned order is float order; -0.0 is read as +0.0 (torch treats them as equal). A composite key
// is key << 32 | ~id: descending composite order is value descending, then id ascending. NaN logits
// are not supported (as in the Triton kernel). Logits float32 or bfloat16 (kernels/tree/cuda_topk.py
// converts others).
//
// No torch headers: plain CUDA C++ with an extern "C" launcher (kernels/tree/cuda_topk.py calls it
// through ctypes; kernels/build.py compiles it on the GPU host). The launcher never synchronises and
// never allocates, so it can be captured in a CUDA graph. Tests compile this file as C++ with
// -DTVA_EMULATE against tests/kernels/emulator/cuda_emulation.h.

#ifdef TVA_EMULATE
#include "cuda_emulation.h"
#define TTK_DYNAMIC_SMEM(name) uint8_t* name = emu::shared_memory()
#define TTK_LAUNCH(kernel, grid, block, smem, stream, p) emu::launch(kernel, grid, block, smem, p)
#else
#include <cuda_runtime.h>
#define TTK_DYNAMIC_SMEM(name) extern __shared__ __align__(16) uint8_t name[]
#define TTK_LAUNCH(kernel, grid, block, smem, stream, p) ttk_launch(kernel, grid, block, smem, stream, p)

// Programmatic dependent launch on sm_90+ (kernels/pdl.py): the kernel may be scheduled while the
// one before it (the drafter's last, which produced the logits) finishes; it waits for it first
// thing. Elsewhere a plain launch. As tree_build.cu's ttb_launch.
template <typename Kernel, typename Params>
static void ttk_launch(Kernel kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       const Params& p) {
    int device = 0, major = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaLaunchAttribute pdl;
    pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    pdl.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = &pdl;
    cfg.numAttrs = major >= 9 ? 1 : 0;
    cudaLaunchKernelEx(&cfg, kernel, p);      // its error is the runtime's last error
}
#endif
#include <stdint.h>
#include <string.h>

#include <mutex>

namespace ttk {

__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Mirrored by a ctypes structure in kernels/tree/cuda_topk.py: every field 8 bytes wide.
struct Params {
    const void* logits;      // row r starts at (r / n1) * stride0 + (r % n1) * stride1 elements
    float* out_lp;           // [rows, kp]
    int64_t* out_ids;        // [rows, kp]
    uint64_t* part_keys;     // [rows, slices, kp] each slice's top kp composite keys, descending
    float* part_m;           // [rows, slices] slice max
    float* part_s;           // [rows, slices] slice sum of exp(x - max)
    int32_t* arrive;         // [rows] slices finished: zero between calls
    int64_t rows, n1, stride0, stride1, vocab, kp, slices, slice_len;
    int64_t dtype;           // 0 float32, 1 bfloat16
};

constexpr int THREADS = 512;
constexpr int WARPS = THREADS / 32;
constexpr int MAX_KP = 256;
constexpr int MAX_SLICE = 24576;      // keys a CTA holds: 96 KB, two CTAs a multiprocessor
constexpr int CAP = 2048;             // candidates a slice sorts; past it, the exact select
constexpr int MAX_MERGE = 4096;       // slices x kp the last CTA sorts
constexpr int MAX_GROUPS = 2 * MAX_KP;
constexpr unsigned FULL = 0xFFFFFFFFu;

__host__ __device__ constexpr int pow2_at_least(int n) {
    int p = 1;
    while (p < n) p <<= 1;
    return p;
}

// Byte offsets of the shared-memory arrays (host and device agree through this one function).
struct Layout {
    int keys, cand, groups, hist, red, misc, total;
};

__host__ __device__ inline Layout layout(int slice_len, int slices, int kp) {
    Layout L;
    int at = 0;
    const auto take = [&at](int bytes) {
        const int here = at;
        at = (at + bytes + 15) & ~15;
        return here;
    };
    const int merge = pow2_at_least(slices * kp);
    L.keys = take(slice_len * 4);                            // u32 [slice_len] the slice's keys
    L.cand = take((merge > CAP ? merge : CAP) * 8);          // u64 candidates, then the merge
    L.groups = take(MAX_GROUPS * 4);                         // u32 group maxima
    L.hist = take(256 * 4);                                  // int radix histogram (exact select)
    L.red = take(WARPS * 4);                                 // block reductions, per-warp counts
    L.misc = take(8 * 4);                                    // counters and broadcasts
    L.total = at;
    return L;
}

__device__ __forceinline__ uint32_t float_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

__device__ __forceinline__ float bits_float(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

__device__ __forceinline__ uint32_t to_key(float x) {
    const uint32_t u = float_bits(x == 0.f ? 0.f : x);     // -0.0 as +0.0
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float from_key(uint32_t k) {
    return bits_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}

__device__ __forceinline__ uint64_t compose(uint32_t key, int64_t id) {
    return static_cast<uint64_t>(key) << 32 | static_cast<uint32_t>(~static_cast<uint32_t>(id));
}

__device__ __forceinline__ int64_t composite_id(uint64_t c) {
    return static_cast<int64_t>(~static_cast<uint32_t>(c));
}

__device__ __forceinline__ float composite_value(uint64_t c) {
    return from_key(static_cast<uint32_t>(c >> 32));
}

__device__ __forceinline__ float load_logit(const void* row, int64_t i, int dtype) {
    if (dtype == 0) return __ldg(static_cast<const float*>(row) + i);
    return bits_float(static_cast<uint32_t>(__ldg(static_cast<const uint16_t*>(row) + i)) << 16);
}

// Block-wide max / sum, every thread gets the result (red: WARPS words of shared memory).
__device__ uint32_t block_max(uint32_t v, uint32_t* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const uint32_t w = __shfl_xor_sync(FULL, v, o);
        v = w > v ? w : v;
    }
    __syncthreads();                 // red may still be read by an earlier reduction
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = red[lane < WARPS ? lane : 0];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const uint32_t w = __shfl_xor_sync(FULL, v, o);
        v = w > v ? w : v;
    }
    return v;
}

__device__ float block_sum(float v, uint32_t* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    __syncthreads();
    if (lane == 0) red[warp] = float_bits(v);
    __syncthreads();
    v = lane < WARPS ? bits_float(red[lane]) : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    return v;
}

// Sort a[0, n) descending (n a power of two), every thread of the block: a bitonic network, one
// barrier a stage. The composite keys are distinct (padding zeros aside), so the order is total.
__device__ void sort_desc(uint64_t* a, int n) {
    for (int k = 2; k <= n; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < n / 2; i += THREADS) {
                const int lo = 2 * i - (i & (j - 1)), hi = lo + j;
                const bool desc = (lo & k) == 0;
                const uint64_t x = a[lo], y = a[hi];
                if ((x < y) == desc) {
                    a[lo] = y;
                    a[hi] = x;
                }
            }
            __syncthreads();
        }
    }
}

// Append the slice's elements with key >= t (positions [0, ..) by a shared counter, in no
// particular order) as composite keys while they fit in CAP; returns how many passed.
__device__ int compact_at_least(const uint32_t* keys, int n, int64_t first_id, uint32_t t, uint64_t* cand,
                                int* counter) {
    const int lane = threadIdx.x & 31;
    if (threadIdx.x == 0) *counter = 0;
    __syncthreads();
    for (int base = 0; base < n; base += THREADS) {          // whole warps: the ballot needs them
        const int i = base + static_cast<int>(threadIdx.x);
        const bool pass = i < n && keys[i] >= t;
        const unsigned ballot = __ballot_sync(FULL, pass);
        int at = 0;
        if (lane == 0 && ballot) at = atomicAdd(counter, __popc(ballot));
        at = __shfl_sync(FULL, at, 0);
        const int pos = at + __popc(ballot & ((1u << lane) - 1u));
        if (pass && pos < CAP) cand[pos] = compose(keys[i], first_id + i);
    }
    __syncthreads();
    return *counter;
}

// The exact top kp of the slice into cand[0, kp) (unordered), for slices whose threshold passed
// more than CAP elements: the kp-th largest key T by a radix select (8 bits a pass, MSB first),
// then every key > T and the (kp - #above) keys == T with the lowest ids, in index order.
__device__ void exact_select(const uint32_t* keys, int n, int64_t first_id, int kp, uint64_t* cand, int* hist,
                             uint32_t* red, int* misc) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint32_t prefix = 0, mask = 0;
    int remaining = kp;                 // of the kp, how many lie in the bucket still open
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int d = threadIdx.x; d < 256; d += THREADS) hist[d] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += THREADS)
            if ((keys[i] & mask) == prefix) atomicAdd(&hist[(keys[i] >> shift) & 255], 1);
        __syncthreads();
        if (threadIdx.x == 0) {         // the digit whose bucket holds the remaining-th largest
            int above = 0, d = 255;
            while (above + hist[d] < remaining) above += hist[d--];
            misc[0] = d;
            misc[1] = remaining - above;
        }
        __syncthreads();
        prefix |= static_cast<uint32_t>(misc[0]) << shift;
        mask |= 255u << shift;
        remaining = misc[1];
        __syncthreads();                // misc is rewritten by the next pass
    }
    const uint32_t T = prefix;
    const int need_eq = remaining, above_total = kp - need_eq;
    // Keys > T: exactly above_total of them, any order.
    if (threadIdx.x == 0) misc[2] = 0;
    __syncthreads();
    for (int base = 0; base < n; base += THREADS) {
        const int i = base + static_cast<int>(threadIdx.x);
        const bool pass = i < n && keys[i] > T;
        const unsigned ballot = __ballot_sync(FULL, pass);
        int at = 0;
        if (lane == 0 && ballot) at = atomicAdd(&misc[2], __popc(ballot));
        at = __shfl_sync(FULL, at, 0);
        if (pass) cand[at + __popc(ballot & ((1u << lane) - 1u))] = compose(keys[i], first_id + i);
    }
    // Keys == T: the first need_eq in index order (a block-wide exclusive scan per round).
    int seen = 0;
    for (int base = 0; base < n && seen < need_eq; base += THREADS) {
        const int i = base + static_cast<int>(threadIdx.x);
        const bool eq = i < n && keys[i] == T;
        const unsigned ballot = __ballot_sync(FULL, eq);
        __syncthreads();                // red's previous round has been read
        if (lane == 0) red[warp] = __popc(ballot);
        __syncthreads();
        int before = seen, round = 0;
        for (int w = 0; w < WARPS; ++w) {
            before += w < warp ? static_cast<int>(red[w]) : 0;
            round += static_cast<int>(red[w]);
        }
        const int rank = before + __popc(ballot & ((1u << lane) - 1u));
        if (eq && rank < need_eq) cand[above_total + rank] = compose(keys[i], first_id + i);
        seen += round;
    }
    __syncthreads();
}

__global__ void __launch_bounds__(THREADS, 2) topk_kernel(const Params p) {
    wait_for_previous_kernel();
    TTK_DYNAMIC_SMEM(smem);
    const int kp = static_cast<int>(p.kp), slices = static_cast<int>(p.slices);
    const Layout L = layout(static_cast<int>(p.slice_len), slices, kp);
#ifdef TVA_EMULATE
    if (static_cast<size_t>(L.total) > emu::current_block()->smem_size)
        emu::die("topk: the layout exceeds the launch's shared memory");
#endif
    uint32_t* keys = reinterpret_cast<uint32_t*>(smem + L.keys);
    uint64_t* cand = reinterpret_cast<uint64_t*>(smem + L.cand);
    uint32_t* groups = reinterpret_cast<uint32_t*>(smem + L.groups);
    int* hist = reinterpret_cast<int*>(smem + L.hist);
    uint32_t* red = reinterpret_cast<uint32_t*>(smem + L.red);
    int* misc = reinterpret_cast<int*>(smem + L.misc);
    const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
    const int64_t row = blockIdx.y, slice = blockIdx.x;
    const int64_t first = slice * p.slice_len;
    const int n = static_cast<int>(p.vocab - first < p.slice_len ? p.vocab - first : p.slice_len);
    const int dtype = static_cast<int>(p.dtype);
    const int64_t elt = dtype == 0 ? 4 : 2;
    const void* x_row = static_cast<const uint8_t*>(p.logits) +
                        ((row / p.n1) * p.stride0 + (row % p.n1) * p.stride1 + first) * elt;

    // 1. The slice as keys, its max and its sum of exp(x - max).
    uint32_t kmax = 0;
    for (int i = tid; i < n; i += THREADS) {
        const uint32_t k = to_key(load_logit(x_row, i, dtype));
        keys[i] = k;
        kmax = k > kmax ? k : kmax;
    }
    kmax = block_max(kmax, red);       // (its barriers also publish the keys)
    const float m = from_key(kmax);
    const float m_safe = m == -__builtin_inff() ? 0.f : m;    // an all -inf slice: sum 0, not NaN
    float s = 0.f;
    for (int i = tid; i < n; i += THREADS) s += expf(from_key(keys[i]) - m_safe);
    s = block_sum(s, red);

    // 2. The threshold: the kp-th largest of G group maxima (G >= kp non-empty groups of gs
    // consecutive elements), or nothing when the slice has at most kp elements.
    uint32_t t = 0;
    if (n > kp) {
        const int G = 2 * kp < n ? 2 * kp : n;
        const int gs = (n + G - 1) / G, ng = (n + gs - 1) / gs;      // ng >= kp
        for (int g = warp; g < ng; g += WARPS) {
            uint32_t gm = 0;
            const int end = (g + 1) * gs < n ? (g + 1) * gs : n;
            for (int i = g * gs + lane; i < end; i += 32) gm = keys[i] > gm ? keys[i] : gm;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                const uint32_t w = __shfl_xor_sync(FULL, gm, o);
                gm = w > gm ? w : gm;
            }
            if (lane == 0) groups[g] = gm;
        }
        __syncthreads();
        for (int g = tid; g < ng; g += THREADS) {     // rank by counting; ties by group index
            const uint32_t v = groups[g];
            int rank = 0;
            for (int j = 0; j < ng; ++j) rank += groups[j] > v || (groups[j] == v && j < g);
            if (rank == kp - 1) misc[3] = static_cast<int>(v);
        }
        __syncthreads();
        t = static_cast<uint32_t>(misc[3]);
    }

    // 3. The candidates, sorted: the slice's top kp come first.
    int count = compact_at_least(keys, n, first, t, cand, &misc[0]);
    if (count > CAP) {
        exact_select(keys, n, first, kp, cand, hist, red, misc);
        count = kp;
    }
    int np = pow2_at_least(count);
    for (int i = count + tid; i < np; i += THREADS) cand[i] = 0;
    __syncthreads();
    sort_desc(cand, np);

    float M = m, S = s;
    if (slices > 1) {
        // 4. Publish, draw a ticket; the row's last slice merges.
        const int64_t at = (row * slices + slice) * kp;
        for (int j = tid; j < kp; j += THREADS) p.part_keys[at + j] = j < count ? cand[j] : 0;
        if (tid == 0) {
            p.part_m[row * slices + slice] = m;
            p.part_s[row * slices + slice] = s;
        }
        __syncthreads();               // every thread's stores, before thread 0's release
        if (tid == 0) {
            __threadfence();
            misc[4] = atomicAdd(&p.arrive[row], 1) == slices - 1;
        }
        __syncthreads();
        if (!misc[4]) return;
        __threadfence();               // the other slices' stores, read past L1 below
        np = pow2_at_least(slices * kp);
        const unsigned long long* part = reinterpret_cast<const unsigned long long*>(p.part_keys + row * slices * kp);
        for (int i = tid; i < np; i += THREADS) cand[i] = i < slices * kp ? __ldcg(part + i) : 0;
        M = -__builtin_inff();
        for (int j = 0; j < slices; ++j) {
            const float mj = __ldcg(p.part_m + row * slices + j);
            M = mj > M ? mj : M;
        }
        const float M_safe = M == -__builtin_inff() ? 0.f : M;
        S = 0.f;
        for (int j = 0; j < slices; ++j)
            S += __ldcg(p.part_s + row * slices + j) * expf(__ldcg(p.part_m + row * slices + j) - M_safe);
        __syncthreads();
        sort_desc(cand, np);
        if (tid == 0) p.arrive[row] = 0;     // ready for the next call / graph replay
    }

    // 5. The row's top kp: log-probs and ids.
    const float log_s = logf(S);
    for (int j = tid; j < kp; j += THREADS) {
        const uint64_t c = cand[j];
        p.out_lp[row * kp + j] = (composite_value(c) - M) - log_s;
        p.out_ids[row * kp + j] = composite_id(c);
    }
}

// ------------------------------------------------------------------------------------------
// Host side
// ------------------------------------------------------------------------------------------

static bool valid(const Params& p) {
    return p.kp >= 1 && p.kp <= MAX_KP && p.kp <= p.vocab && p.vocab <= 0x7FFFFFFF && p.slices >= 1 &&
           p.slice_len >= 1 && p.slice_len <= MAX_SLICE && p.slices * p.slice_len >= p.vocab &&
           (p.slices - 1) * p.slice_len < p.vocab && p.slices * p.kp <= MAX_MERGE && p.rows >= 0 &&
           p.rows <= 65535 && p.n1 >= 1 && p.slices <= 0x7FFFFFFF && (p.dtype == 0 || p.dtype == 1);
}

static cudaError_t prepare(int smem) {
    static int done[64] = {0};          // largest size set per device
    static std::mutex lock;             // ctypes drops the GIL
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    std::lock_guard<std::mutex> guard(lock);
    if (device >= 0 && device < 64 && done[device] >= smem) return cudaSuccess;
    err = cudaFuncSetAttribute(topk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err == cudaSuccess && device >= 0 && device < 64) done[device] = smem;
    return err;
}

}  // namespace ttk

extern "C" {

// Dynamic shared memory of one launch (bytes).
int ttk_smem_bytes(int slice_len, int slices, int kp) { return ttk::layout(slice_len, slices, kp).total; }

int ttk_threads() { return ttk::THREADS; }

// Returns a cudaError_t (0 = success). Asynchronous on `stream`; grid (slices, rows).
int ttk_topk(const ttk::Params* params, void* stream) {
    const ttk::Params& p = *params;
    if (!ttk::valid(p)) return static_cast<int>(cudaErrorInvalidValue);
    if (p.rows == 0) return 0;
    const int smem = ttk_smem_bytes(static_cast<int>(p.slice_len), static_cast<int>(p.slices), static_cast<int>(p.kp));
    cudaError_t err = ttk::prepare(smem);
    if (err != cudaSuccess) return static_cast<int>(err);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    TTK_LAUNCH(ttk::topk_kernel, dim3(static_cast<unsigned>(p.slices), static_cast<unsigned>(p.rows)),
               dim3(ttk::THREADS), smem, s, p);
    err = cudaGetLastError();
#if defined(TVA_DEBUG) && !defined(TVA_EMULATE)
    if (err == cudaSuccess) err = cudaStreamSynchronize(s);
#else
    (void)s;
#endif
    return static_cast<int>(err);
}

const char* ttk_error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

int ttk_struct_size() { return static_cast<int>(sizeof(ttk::Params)); }

}  // extern "C"
