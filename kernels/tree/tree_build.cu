// DDTree tree build (CUDA C++): the reference heap's best-first pops, by one warp, one launch.
//
// The tree is the N first nodes of the total order the heap pops in (harness/decode/tree.py,
// harness/decode/tree_gpu.py's docstring):
//     score descending (float64 sums of the clamped log-probs), then rank path ascending.
// This kernel pops them one by one exactly as the heap does, with the heap replaced by a frontier
// spread over the 32 lanes of one warp: a popped node (depth d, rank r, parent p) puts back its
// next sibling (p, d, r+1) and its first child (node, d+1, 0), so after t pops the frontier holds
// at most t+1 candidates: S = ceil(N / 32) slots per lane (N 64: 2), three registers each (the
// order-preserving bits of the score, and the links). Each pop is
//   1. the lane's own best slot (kept between pops), then the warp's best by __reduce_max_sync
//      over the key words (score high 32 bits, then the low 32 bits, then the rank path
//      inverted) one at a time, only while more than one lane is left (ties: bf16 log-probs);
//   2. the winner's candidate broadcast by shuffles; every lane computes the two it puts back
//      (scores from the log-prob table and the node scores in shared memory) and the winner's
//      slot takes one, the next free slot the other;
//   3. lane 0 records the node (parent, depth, rank, score, first child or next-sibling link),
//      lanes 0..3 a word each of its rank path (lane w writes word w of every row, so it reads
//      only its own stores; the tie step reads all lanes' after a __syncwarp).
// Rank paths are compared as 16 8-bit digits, depth 1 most significant, zero padded: among
// frontier entries (never an ancestor of one another) that is the heap's lexicographic order.
// The sums are the torch path's, in its order (parent's score + log-prob), so scores are
// bit-identical to tree_gpu's float64 ones, and so is every output: the tree is the heap's node
// for node, ties included. The other warps load the inputs and, after the pops, write the
// outputs (the ancestor bitmasks by walking each row's parents).
//
// Why this shape: the per-depth beam formulation (tree_gpu._build_torch, the Triton kernel) needs
// ~3 block-wide barriers per depth; as a CUDA kernel of 16 warps it took 59-63 us on the H200,
// issue-latency bound on one SM with 38 % of its instructions per-depth bookkeeping
// (kernels/NOTES.md). This one: 25.9 us at N 64, D 15 (graph replay, 256 threads). ncu: the pop
// loop issues ~150 warp instructions a pop (9.8k for 64 pops), one warp one dependent step at a
// time (14 cycles between two issued instructions, averaged over the CTA). Candidates carrying
// their rank path and parent score in registers (no shared memory in the loop) measured slower
// (28.0 us): more selects per slot update than the loads they save.

// Outputs (harness/decode/tree_gpu.GpuTree): tokens, depths, parents, first_child, next_sibling,
// scores, bits, visibility. Fewer candidates than N (a tiny vocabulary): the frontier runs empty
// and nodes n+1..N are padding (token 0, depth 0, parent -1, no links, score -inf, self-only
// visibility), as in the torch path. Limits: N <= 256, D <= 16.
//
// No torch headers: plain CUDA C++ with an extern "C" launcher (kernels/tree/cuda_tree_build.py calls
// it through ctypes; kernels/build.py compiles it on the GPU host). The launcher never
// synchronises and never allocates, so it can be captured in a CUDA graph. Tests compile this
// file as C++ with -DTVA_EMULATE against tests/emulator/cuda_emulation.h (threads as fibers,
// warps skewed at random between barriers).

#ifdef TVA_EMULATE
#include "cuda_emulation.h"
#define TTB_DYNAMIC_SMEM(name) uint8_t* name = emu::shared_memory()
#define TTB_LAUNCH(kernel, grid, block, smem, stream, p) emu::launch(kernel, grid, block, smem, p)
#else
#include <cuda_runtime.h>
#define TTB_DYNAMIC_SMEM(name) extern __shared__ __align__(128) uint8_t name[]
#define TTB_LAUNCH(kernel, grid, block, smem, stream, p) kernel<<<grid, block, smem, stream>>>(p)
#endif
#include <stdint.h>
#include <string.h>

#include <mutex>

namespace ttb {

// Mirrored by a ctypes structure in kernels/tree/cuda_tree_build.py: every field 8 bytes wide.
struct Params {
    const void* log_probs;      // [b, D, k] float32 / float64 / bfloat16, last dim contiguous
    const int64_t* token_ids;   // [b, D, k] int64, last dim contiguous
    int64_t* tokens;            // [b, N]
    int64_t* depths;            // [b, N]
    int64_t* parents;           // [b, N+1]
    int64_t* first_child;       // [b, N+1]
    int64_t* next_sibling;      // [b, N+1]
    float* scores;              // [b, N]
    int32_t* bits;              // [b, N+1, W]
    uint8_t* visibility;        // [b, N+1, N+1] bool
    int64_t batch, budget, depth, kp, words;
    int64_t lp_dtype;           // 0 float32, 1 float64, 2 bfloat16
    int64_t lp_sb, lp_sd, ids_sb, ids_sd;   // strides in elements
};

constexpr int MAX_BUDGET = 256;     // node indices fit 9 bits of Entry::meta, ranks 8
constexpr int MAX_DEPTH = 16;       // a rank path of 16 8-bit digits fills Entry::path
constexpr int MAX_THREADS = 256;   // (MAX_THREADS, 1): the popping warp may use 255 registers
constexpr double FLOOR = -1e30;     // = tree_gpu.LOG_PROB_FLOOR
constexpr unsigned FULL = 0xFFFFFFFFu;

// A frontier candidate (a node not popped yet whose parent has been), in three registers: the
// order-preserving bits of its score (key[0] high, key[1] low; 0, 0: an empty slot) and
// parent | previous sibling << 9 | depth << 18 | rank << 23. Its rank path, needed only when
// two scores are equal, is its parent's row of the node paths in shared memory plus its rank.
struct Cand {
    uint32_t key[2];
    uint32_t meta;
};

__device__ __forceinline__ Cand no_cand() { return Cand{{0u, 0u}, 0u}; }

// Unsigned keys ordered like the doubles (finite ones: the clamp keeps every score finite);
// +0.0 for -0.0 first, since they compare equal as doubles. Every finite key has key[0] > 0.
__device__ __forceinline__ Cand make_cand(double score, uint32_t meta) {
    const double s = score + 0.0;
    uint64_t u;
    memcpy(&u, &s, 8);
    u = (u >> 63) ? ~u : (u | 0x8000000000000000ull);
    return Cand{{static_cast<uint32_t>(u >> 32), static_cast<uint32_t>(u)}, meta};
}

__device__ __forceinline__ double score_of(uint32_t k0, uint32_t k1) {
    uint64_t u = (static_cast<uint64_t>(k0) << 32) | k1;
    u = (u >> 63) ? (u & 0x7FFFFFFFFFFFFFFFull) : ~u;
    double s;
    memcpy(&s, &u, 8);
    return s;
}

__device__ __forceinline__ uint64_t key64(const Cand& c) { return (static_cast<uint64_t>(c.key[0]) << 32) | c.key[1]; }

// Word w of a candidate's rank path (8-bit digits, depth 1 in the top byte of word 0, zero
// padded): its parent's path plus its own rank at its depth. Among frontier candidates (never
// an ancestor of one another) this orders exactly like the heap's rank-path tuples.
__device__ __forceinline__ uint32_t path_word(const Cand& c, int w, const uint32_t* paths) {
    const int par = c.meta & 511, d = (c.meta >> 18) & 31, r = c.meta >> 23;
    const uint32_t own = w == (d - 1) >> 2 ? static_cast<uint32_t>(r) << (24 - 8 * ((d - 1) & 3)) : 0u;
    return paths[par * 4 + w] + own;
}

// Whether a pops before b: higher score, or equal score and smaller rank path. Equal scores
// are rare except with bf16 log-probs; only then are the paths read.
__device__ __forceinline__ bool pops_before(const Cand& a, const Cand& b, const uint32_t* paths) {
    const uint64_t ka = key64(a), kb = key64(b);
    if (ka != kb) return ka > kb;
    if (ka == 0) return false;        // two empty slots
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        const uint32_t pa = path_word(a, w, paths), pb = path_word(b, w, paths);
        if (pa != pb) return pa < pb;
    }
    return false;
}

// dst = c ? src : dst, field by field: `if (s == i) slot[s] = x` over an unrolled s is turned
// back into slot[i] = x, and `c ? a : b` of two structs into a select of their addresses: both
// put the candidates in local memory.
__device__ __forceinline__ void assign_if(Cand& dst, bool c, const Cand& src) {
    dst.key[0] = c ? src.key[0] : dst.key[0];
    dst.key[1] = c ? src.key[1] : dst.key[1];
    dst.meta = c ? src.meta : dst.meta;
}

__device__ __forceinline__ double load_lp(const void* base, int64_t i, int dtype) {
    if (dtype == 0) return static_cast<double>(__ldg(static_cast<const float*>(base) + i));
    if (dtype == 1) return __ldg(static_cast<const double*>(base) + i);
    const uint32_t u = static_cast<uint32_t>(__ldg(static_cast<const uint16_t*>(base) + i)) << 16;
    float f;
    memcpy(&f, &u, 4);
    return static_cast<double>(f);
}

// Byte offsets of the shared-memory arrays (host and device agree through this one function).
struct Layout {
    int lp, node_score, path, par, dr, fc, ns, bits, count, total;
};

__host__ __device__ inline int take(int& at, int bytes) {
    const int here = at;
    at = (at + bytes + 15) & ~15;
    return here;
}

__host__ __device__ inline Layout layout(int N, int D, int KP, int W) {
    Layout L;
    int at = 0;
    L.lp = take(at, D * KP * 8);              // double [D][k'] clamped log-probs
    L.node_score = take(at, (N + 1) * 8);     // double [N+1] (the root: 0)
    L.path = take(at, (N + 1) * 16);          // u32 [N+1][4] rank paths (the root: 0)
    L.par = take(at, (N + 1) * 2);            // i16 [N+1] parent node
    L.dr = take(at, (N + 1) * 2);             // u16 [N+1] depth << 8 | rank
    L.fc = take(at, (N + 1) * 2);             // i16 [N+1] first child
    L.ns = take(at, (N + 1) * 2);             // i16 [N+1] next sibling
    L.bits = take(at, (N + 1) * W * 4);       // u32 [N+1][W] ancestor bitmasks
    L.count = take(at, 4);                    // int: real nodes
    L.total = at;
    return L;
}

struct Nodes {      // the popped nodes, in shared memory
    double* score;
    uint32_t* path;
    int16_t* par;
    uint16_t* dr;
    int16_t* fc;
    int16_t* ns;
};

// The pops, by the 32 lanes of one warp; S slots a lane (32 S >= N). Returns the real nodes.
template <int S>
__device__ int pop_nodes(int N, int D, int KP, const double* lp, const Nodes nodes, int lane) {
    Cand slot[S];
#pragma unroll
    for (int s = 0; s < S; ++s) slot[s] = no_cand();
    if (lane == 0) slot[0] = make_cand(0.0 + lp[0], 1u << 18);   // rank 0 of depth 1, under the root
    int size = 1;                     // frontier slots used so far, warp-wide (slot i: lane i % 32)
    int best = 0;                     // this lane's best slot, and a copy of it: never slot[best],
    Cand mine = slot[0];              // a dynamic index would put the slots in local memory

    for (int t = 0; t < N; ++t) {
        // 1. The warp's best: the high key word, then the low one and the rank path only while
        // more than one lane is left.
        const uint32_t top = __reduce_max_sync(FULL, mine.key[0]);
        if (top == 0) return t;       // the frontier is empty (warp-uniform)
        unsigned left = __ballot_sync(FULL, mine.key[0] == top);
        if (left & (left - 1)) {
            const bool in = (left >> lane) & 1u;
            const uint32_t m = __reduce_max_sync(FULL, in ? mine.key[1] : 0u);
            left &= __ballot_sync(FULL, in && mine.key[1] == m);
            if (left & (left - 1)) {  // equal scores: the smallest rank path
                __syncwarp();         // the path rows lane 0..3 wrote, visible to every lane
#pragma unroll
                for (int w = 0; w < 4; ++w) {
                    if ((left & (left - 1)) == 0) break;
                    const bool still = (left >> lane) & 1u;
                    const uint32_t inv = still ? ~path_word(mine, w, nodes.path) : 0u;
                    const uint32_t pm = __reduce_max_sync(FULL, inv);
                    left &= __ballot_sync(FULL, still && inv == pm);
                }
            }
        }
        const int winner = __ffs(static_cast<int>(left)) - 1;

        // 2. The popped node, and the two candidates it puts back: its next sibling and its
        // first child, scored as the torch path sums (the parent's score + the log-prob).
        const uint32_t k0 = __shfl_sync(FULL, mine.key[0], winner);
        const uint32_t k1 = __shfl_sync(FULL, mine.key[1], winner);
        const uint32_t meta = __shfl_sync(FULL, mine.meta, winner);
        const int par = meta & 511, prev = (meta >> 9) & 511, d = (meta >> 18) & 31, r = meta >> 23;
        const int node = t + 1;
        const double score = score_of(k0, k1);
        __syncwarp();                 // node_score[par], written by lane 0 at an earlier pop
        if (t + 1 < N) {              // the last pop puts nothing back
            const bool has_sibling = r + 1 < KP, has_child = d < D;
            const double lp_sibling = lp[has_sibling ? (d - 1) * KP + r + 1 : 0];
            const double lp_child = lp[has_child ? d * KP : 0];
            Cand sibling = make_cand(nodes.score[par] + lp_sibling,
                                     static_cast<uint32_t>(par | node << 9 | d << 18 | (r + 1) << 23));
            Cand child = make_cand(score + lp_child, static_cast<uint32_t>(node | (d + 1) << 18));
            assign_if(sibling, !has_sibling, no_cand());
            assign_if(child, !has_child, sibling);        // the popped slot's new candidate
            // The popped slot takes the child (or the sibling); a second one goes to a new slot.
            const bool append = has_child && has_sibling;
            const bool replacing = lane == winner, appending = append && lane == (size & 31);
#pragma unroll
            for (int s = 0; s < S; ++s) {
                assign_if(slot[s], replacing && s == best, child);
                assign_if(slot[s], appending && s == (size >> 5), sibling);
            }
            size += append;
        }

        // 3. The node's record: lane 0 its links and score, lanes 0..3 a word of its rank path
        // each (lane w writes word w of every row: it reads only its own stores).
        if (lane == 0) {
            nodes.score[node] = score;
            nodes.par[node] = static_cast<int16_t>(par);
            nodes.dr[node] = static_cast<uint16_t>(d << 8 | r);
            if (r == 0) nodes.fc[par] = static_cast<int16_t>(node);
            else nodes.ns[prev] = static_cast<int16_t>(node);
        }
        if (lane < 4) {
            const uint32_t own = lane == (d - 1) >> 2 ? static_cast<uint32_t>(r) << (24 - 8 * ((d - 1) & 3)) : 0u;
            nodes.path[node * 4 + lane] = nodes.path[par * 4 + lane] + own;
        }
        if (t + 1 < N) {
            if (S > 1) __syncwarp();  // the new path row, for a tie between this lane's slots
            best = 0;
            mine = slot[0];
#pragma unroll
            for (int s = 1; s < S; ++s)
                if (pops_before(slot[s], mine, nodes.path)) {
                    best = s;
                    mine = slot[s];
                }
        }
    }
    return N;
}

// One kernel per frontier size S (slots a lane), so that each gets its own register allocation:
// inlined into one kernel, the largest S set the register budget of all and spilled.
template <int S>
__global__ void __launch_bounds__(MAX_THREADS, 1) tree_build_kernel(const Params p) {
    TTB_DYNAMIC_SMEM(smem);
    const float NEG = -__builtin_inff();
    const int N = static_cast<int>(p.budget), D = static_cast<int>(p.depth), KP = static_cast<int>(p.kp);
    const int W = static_cast<int>(p.words);
    const int T = static_cast<int>(blockDim.x), tid = static_cast<int>(threadIdx.x);
    const int64_t b = blockIdx.x;
    const Layout L = layout(N, D, KP, W);
#ifdef TVA_EMULATE
    if (static_cast<size_t>(L.total) > emu::current_block()->smem_size)
        emu::die("tree_build: the layout exceeds the launch's shared memory");
#endif
    double* lp = reinterpret_cast<double*>(smem + L.lp);
    const Nodes nodes{reinterpret_cast<double*>(smem + L.node_score), reinterpret_cast<uint32_t*>(smem + L.path),
                      reinterpret_cast<int16_t*>(smem + L.par), reinterpret_cast<uint16_t*>(smem + L.dr),
                      reinterpret_cast<int16_t*>(smem + L.fc), reinterpret_cast<int16_t*>(smem + L.ns)};
    uint32_t* bits_s = reinterpret_cast<uint32_t*>(smem + L.bits);
    int* count = reinterpret_cast<int*>(smem + L.count);

    // ---- Prologue (all warps): log-probs to shared memory, clamped to -1e30 as the torch path
    // does (-inf from masked logits, and NaN); the root; empty links.
    const int lp_dtype = static_cast<int>(p.lp_dtype);
    for (int i = tid; i < D * KP; i += T) {
        const int d = i / KP, r = i - d * KP;
        const double v = load_lp(p.log_probs, b * p.lp_sb + d * p.lp_sd + r, lp_dtype);
        lp[i] = v >= FLOOR ? v : FLOOR;
    }
    for (int i = tid; i <= N; i += T) {
        nodes.fc[i] = -1;
        nodes.ns[i] = -1;
    }
    if (tid < 4) nodes.path[tid] = 0;
    if (tid == 0) {
        nodes.score[0] = 0.0;
        nodes.par[0] = -1;
    }
    __syncthreads();

    // ---- The pops (warp 0).
    if (tid < 32) {
        const int n = pop_nodes<S>(N, D, KP, lp, nodes, tid);
        if (tid == 0) *count = n;
    }
    __syncthreads();

    // ---- Epilogue (all warps): nodes 1..N in pop order, the links, the ancestor bitmasks
    // (one thread per row word walks the row's parents, depth <= D; padding rows: their own bit).
    const int n_real = *count;
    const int64_t row1 = b * (N + 1);
    for (int s = tid; s < N; s += T) {
        const int node = s + 1;
        const bool real = node <= n_real;
        const int dr = nodes.dr[node], d = dr >> 8, r = dr & 0xFF;
        p.tokens[b * N + s] = real ? __ldg(p.token_ids + b * p.ids_sb + (d - 1) * p.ids_sd + r) : 0;
        p.depths[b * N + s] = real ? d : 0;
        p.scores[b * N + s] = real ? static_cast<float>(nodes.score[node]) : NEG;
        p.parents[row1 + node] = real ? nodes.par[node] : -1;
    }
    for (int i = tid; i <= N; i += T) {
        p.first_child[row1 + i] = nodes.fc[i];
        p.next_sibling[row1 + i] = nodes.ns[i];
    }
    if (tid == 0) p.parents[row1] = -1;
    for (int item = tid; item < (N + 1) * W; item += T) {
        const int row = item / W, w = item - row * W;
        uint32_t word = 0;
        int node = row <= n_real ? row : -1;
        if (node < 0 && (row >> 5) == w) word = 1u << (row & 31);
        for (int step = 0; step <= D && node >= 0; ++step) {
            if ((node >> 5) == w) word |= 1u << (node & 31);
            node = nodes.par[node];
        }
        bits_s[item] = word;
        p.bits[row1 * W + item] = static_cast<int32_t>(word);
    }
    __syncthreads();

    // Bool visibility from the bitmasks: 16-byte stores where the row-major bytes are aligned.
    const int Tn = N + 1, total = Tn * Tn;
    uint8_t* vis = p.visibility + b * static_cast<int64_t>(total);
    const int head_raw = static_cast<int>((16 - (reinterpret_cast<uintptr_t>(vis) & 15)) & 15);
    const int head = head_raw < total ? head_raw : total;
    const int chunks = (total - head) >> 4, tail = head + chunks * 16;
    for (int i = tid; i < head + (total - tail); i += T) {
        const int f = i < head ? i : tail + (i - head);
        const int row = f / Tn, col = f - row * Tn;
        vis[f] = static_cast<uint8_t>((bits_s[row * W + (col >> 5)] >> (col & 31)) & 1u);
    }
    for (int k = tid; k < chunks; k += T) {
        const int f = head + 16 * k;
        int row = f / Tn, col = f - row * Tn;
        uint32_t out[4];
        if (col + 16 <= Tn) {       // one row: 16 bits from col, each to one byte
            const int w = col >> 5;
            const uint64_t lo = bits_s[row * W + w];
            const uint64_t hi = w + 1 < W ? bits_s[row * W + w + 1] : 0;
            const uint32_t bits16 = static_cast<uint32_t>(((hi << 32) | lo) >> (col & 31)) & 0xFFFFu;
#pragma unroll
            for (int q = 0; q < 4; ++q) out[q] = (((bits16 >> (4 * q)) & 0xFu) * 0x00204081u) & 0x01010101u;
        } else {                    // crosses a row end
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                uint32_t v = 0;
                for (int by = 0; by < 4; ++by) {
                    v |= ((bits_s[row * W + (col >> 5)] >> (col & 31)) & 1u) << (8 * by);
                    if (++col == Tn) {
                        col = 0;
                        ++row;
                    }
                }
                out[q] = v;
            }
        }
        uint4 v;
        v.x = out[0];
        v.y = out[1];
        v.z = out[2];
        v.w = out[3];
        *reinterpret_cast<uint4*>(vis + f) = v;
    }
}

// ------------------------------------------------------------------------------------------
// Host side
// ------------------------------------------------------------------------------------------

using Kernel = void (*)(Params);

// The kernel of N's frontier size, and its index among the four.
static Kernel kernel_for(int N, int& which) {
    const int S = (N + 31) / 32;
    which = S <= 1 ? 0 : S <= 2 ? 1 : S <= 4 ? 2 : 3;
    static const Kernel kernels[4] = {tree_build_kernel<1>, tree_build_kernel<2>, tree_build_kernel<4>,
                                      tree_build_kernel<8>};
    return kernels[which];
}

// Raise a kernel's dynamic shared-memory limit once per (kernel, device) (a host-side attribute:
// no stream work, so also fine during graph capture). Keyed by kernel too: every instance has the
// same type, and a memo by type alone let the first kernel prepared mark all the others done.
static cudaError_t prepare(Kernel kernel, int which, int smem) {
    static int done[4][64] = {{0}};       // largest size set per kernel and device
    static std::mutex lock;               // ctypes drops the GIL
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    std::lock_guard<std::mutex> guard(lock);
    if (device >= 0 && device < 64 && done[which][device] >= smem) return cudaSuccess;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err == cudaSuccess && device >= 0 && device < 64) done[which][device] = smem;
    return err;
}

static bool valid(const Params& p, int threads) {
    return p.budget >= 1 && p.budget <= MAX_BUDGET && p.depth >= 1 && p.depth <= MAX_DEPTH && p.kp >= 1 &&
           p.kp <= p.budget && p.words == (p.budget + 32) / 32 && p.lp_dtype >= 0 && p.lp_dtype <= 2 &&
           threads >= 32 && threads <= MAX_THREADS && threads % 32 == 0 && p.batch >= 0 && p.batch <= 0x7FFFFFFF;
}

}  // namespace ttb

extern "C" {

// Dynamic shared memory of one launch (bytes).
int ttb_smem_bytes(int budget, int depth, int kp) {
    return ttb::layout(budget, depth, kp, (budget + 32) / 32).total;
}

// Returns a cudaError_t (0 = success). Asynchronous on `stream`; one CTA of `threads` per sequence.
int ttb_build_tree(const ttb::Params* params, int threads, void* stream) {
    const ttb::Params& p = *params;
    if (!ttb::valid(p, threads)) return static_cast<int>(cudaErrorInvalidValue);
    if (p.batch == 0) return 0;
    const int smem = ttb_smem_bytes(static_cast<int>(p.budget), static_cast<int>(p.depth), static_cast<int>(p.kp));
    int which = 0;
    const ttb::Kernel kernel = ttb::kernel_for(static_cast<int>(p.budget), which);
    cudaError_t err = ttb::prepare(kernel, which, smem);
    if (err != cudaSuccess) return static_cast<int>(err);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    TTB_LAUNCH(kernel, dim3(static_cast<unsigned>(p.batch)), dim3(threads), smem, s, p);
    err = cudaGetLastError();
#if defined(TVA_DEBUG) && !defined(TVA_EMULATE)
    if (err == cudaSuccess) err = cudaStreamSynchronize(s);
#else
    (void)s;
#endif
    return static_cast<int>(err);
}

const char* ttb_error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

int ttb_struct_size() { return static_cast<int>(sizeof(ttb::Params)); }

}  // extern "C"
