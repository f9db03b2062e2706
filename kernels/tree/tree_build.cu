// DDTree tree build (CUDA C++): one CTA per sequence, all state in shared memory, one launch.
//
// The algorithm, its exactness argument and the output layout are those of
// harness/decode/tree_gpu.py (read its docstring first); this is the same computation as
// kernels/tree/triton_tree_build.py, with bit-identical outputs (tokens, depths, parents,
// first_child, next_sibling, scores, bits, visibility), the same tie rule (pop order = score
// descending, then lexicographic rank path ascending) and float64 score sums. The Triton kernel
// passes every intermediate through a global workspace in [RBLK, QB] tiles; here everything lives
// in shared memory and each step is a few shared-memory loops between __syncthreads.
//
// Per sequence, N = budget (<= 256), D drafted positions (<= 16), k' = min(k, N) ranks, P pairs
// (j, r) with (j+1)(r+1) <= N from the pair table (tree_gpu.candidate_pairs, rows of j in order):
//
//   prologue  log-probs (clamped to -1e30 as the torch path does; NaN too), as float64, token
//             ids and the pair table to shared memory; depth 1 = the k' ranks of position 1
//             (slots >= k' are padding, -inf).
//   depth d = 2..D, three phases separated by __syncthreads:
//     S1  candidates: each warp takes a contiguous chunk of the pair table; c = beam[j] + lp[r],
//         kept if c >= tau (the best corner bound of the previous phase: any a x b rectangle of
//         extensions with ab >= N holds N values >= its corner). Survivors (typically 1.2-1.6 N)
//         are appended with a ballot + one shared atomicAdd per warp: their order in the list
//         does not matter, every later step counts. Meanwhile the last 2N threads merge the
//         previous depth's beam into the running N-first list: both are sorted, so the number of
//         entries of the other list that precede an entry is a prefix length, found with
//         ~2 sqrt(N) probes (a coarse pass every sqrt(N) entries, then one segment).
//     S2  rank: survivor s goes to beam slot #{q : q precedes s} (keys are unique, so slots
//         are distinct); G = 1..8 threads per survivor each loop over 1/G of the list (16-byte
//         records read by broadcast), then add up with shuffles. Slot < N: the new beam.
//     S3  lexicographic rank of each beam slot among the beam (its key = parent's lex rank * k'
//         + rank), its ancestors' lex ranks (the parent's row of 16 bytes, copied), the beam
//         slot of its next sibling (pair p+1, if in the beam), and the corner bound of the next
//         depth (warp max by shuffles, then the per-warp maxima in shared memory).
//   epilogue  the last merge; nodes in pop order: tokens, depths, scores, a (depth, slot) -> node
//             map, parents, first child (rank 0), next sibling (rank r+1 of the same parent if it
//             is a node), ancestor bitmasks by walking parents (one thread per row word), and the
//             bool visibility expanded from the bitmasks 16 bytes per store.
//
// Latency estimate (H200, ~1.98 GHz, N = 64, D = 15, k' = 64, 512 threads = 16 warps, b = 2 CTAs
// on two SMs; shared-memory load ~30 cycles, __syncthreads ~40 cycles; instruction counts from
// the sm_90 SASS):
//   S1  tau (2 loads), pair -> beam score / lex byte -> add, compare (3 dependent loads ~100),
//       ballot, atomicAdd, shuffle, store (~150); meanwhile the merge on warps 12-15: 8 + 7 probes
//       of ~10 instructions in two rounds of independent loads (~250)                ~300 cycles
//   S2  M ~ 1.3-1.6 N = 85-100 survivors, G = 4 threads each, ~25 iterations of (LDS.128,
//       DSETP.NEU, ISETP, DSETP.LT, select, add, address) = 7 instructions: issue-bound at
//       M^2 * 7 / (32 lanes * 4 schedulers) ~ 400-550 cycles, + 2 shuffles and the stores
//                                                                                    ~600 cycles
//   S3  lex rank (8 threads per slot: 8 iterations + 3 shuffles ~150), parent row copy (~60),
//       corner bound (5 double shuffles ~150, overlapping)                          ~300 cycles
//   + 3 barriers                                                                    ~120 cycles
//   => ~1300 cycles ~ 0.65-0.7 us per depth, 14 depths ~ 9.5 us. Prologue: one round of global
//   loads (L2 hits: the top-k was just written) + init ~1 us; epilogue: 4 barriers, the parent
//   walks (D + 1 dependent loads ~500 cycles) and the output stores ~1 us. Total ~11-12 us for
//   b = 2 (vs 217 us for the Triton kernel), inside the ~15 us budget. S2 is the largest part; it
//   grows as M^2: N = 256 (M ~ 400, ~9k cycles per depth) ~ 70 us.
//   Measured on the H200 (2026-12-01, kernels/NOTES.md): 59-63 us, 5x the estimate. ncu: the
//   kernel issues 183k warp instructions at IPC 1.5 on its SM, and 38 % of them were setup that
//   every warp ran at every depth (integer divisions by the group sizes, small loops), which
//   the estimate above did not count; those are now hoisted and shifts.
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
    const int64_t* pair_j;      // [P] int64 (tree_gpu.candidate_pairs: rows of j in order, r ascending)
    const int64_t* pair_r;      // [P] int64
    int64_t* tokens;            // [b, N]
    int64_t* depths;            // [b, N]
    int64_t* parents;           // [b, N+1]
    int64_t* first_child;       // [b, N+1]
    int64_t* next_sibling;      // [b, N+1]
    float* scores;              // [b, N]
    int32_t* bits;              // [b, N+1, W]
    uint8_t* visibility;        // [b, N+1, N+1] bool
    int64_t batch, budget, depth, kp, pairs, words;
    int64_t lp_dtype;           // 0 float32, 1 float64, 2 bfloat16
    int64_t lp_sb, lp_sd, ids_sb, ids_sd;   // strides in elements
};

constexpr int MAX_BUDGET = 256;     // slots, ranks and lex ranks are stored in 8 bits
constexpr int MAX_DEPTH = 16;       // a node's ancestors' lex ranks fill one 16-byte row
constexpr int MAX_THREADS = 512;
constexpr int MAX_PAIR_ITERS = 8;   // pairs per lane in S1: P <= 8 * threads
constexpr uint16_t NONE = 0xFFFF;
constexpr double FLOOR = -1e30;     // = tree_gpu.LOG_PROB_FLOOR
constexpr unsigned FULL = 0xFFFFFFFFu;

struct alignas(16) Cand {   // a surviving extension
    double score;
    uint32_t key;           // lex rank of the parent * k' + rank: unique, orders like the rank path
    uint32_t pair;          // index in the pair table
};
struct alignas(16) Entry {  // a member of the running N-first list
    double score;
    uint32_t info;          // beam slot | depth index << 8 | lex rank at that depth << 12
    uint32_t pad;
};

// Byte offsets of the shared-memory arrays (host and device agree through this one function).
struct Layout {
    int lp, ids, pairs, pos_of, cand, beam_score, beam_key, beam_pair, slot_info, next_slot,
        node_of, lexrow, list, tau, counters, par, fc, bits, total;
};

__host__ __device__ inline int take(int& at, int bytes) {
    const int here = at;
    at = (at + bytes + 15) & ~15;
    return here;
}

__host__ __device__ inline Layout layout(int N, int D, int KP, int P, int W, int warps) {
    Layout L;
    int at = 0;
    L.lp = take(at, D * KP * 8);          // double [D][k'] clamped log-probs
    L.ids = take(at, D * KP * 8);         // int64 [D][k'] token ids
    L.pairs = take(at, P * 2);            // u16 [P] j | r << 8
    L.pos_of = take(at, P * 2);           // u16 [P] this depth's beam slot of pair p, or NONE
    L.cand = take(at, P * 16);            // Cand [<= P] survivors
    L.beam_score = take(at, 2 * N * 8);   // double [2][N] beam scores (by depth parity), pop order
    L.beam_key = take(at, N * 4);         // u32 [N] keys of the current beam
    L.beam_pair = take(at, N * 2);        // u16 [N] pair index of each current beam slot
    L.slot_info = take(at, D * N * 2);    // u16 [D][N] parent slot | rank << 8
    L.next_slot = take(at, D * N * 2);    // u16 [D][N] beam slot of the next sibling, or NONE
    L.node_of = take(at, D * N * 2);      // u16 [D][N] node index (0: not a node)
    L.lexrow = take(at, 2 * N * 16);      // u8 [2][N][16] lex rank of the ancestor at each depth
    L.list = take(at, 2 * N * 16);        // Entry [2][N] running N-first list (double-buffered)
    L.tau = take(at, warps * 8);          // double [warps] corner bound, per-warp maxima
    L.counters = take(at, 2 * 4);         // int [2] survivor counts (by depth parity)
    L.par = take(at, (N + 1) * 2);        // i16 [N+1] parent node
    L.fc = take(at, (N + 1) * 2);         // i16 [N+1] first child
    L.bits = take(at, (N + 1) * W * 4);   // u32 [N+1][W] ancestor bitmasks
    L.total = at;
    return L;
}

__device__ __forceinline__ double load_lp(const void* base, int64_t i, int dtype) {
    if (dtype == 0) return static_cast<double>(__ldg(static_cast<const float*>(base) + i));
    if (dtype == 1) return __ldg(static_cast<const double*>(base) + i);
    const uint32_t u = static_cast<uint32_t>(__ldg(static_cast<const uint16_t*>(base) + i)) << 16;
    float f;
    memcpy(&f, &u, 4);
    return static_cast<double>(f);
}

// max that keeps a NaN: shared memory read before it was written (the emulator poisons it with
// NaN bytes) then spoils the bound visibly instead of being ignored. Inputs are NaN-free.
__device__ __forceinline__ double nan_max(double a, double b) { return (a > b || a != a) ? a : b; }

__device__ __forceinline__ int byte_of(const uint4& row, int i) {
    const uint32_t w = i < 8 ? (i < 4 ? row.x : row.y) : (i < 12 ? row.z : row.w);
    return static_cast<int>((w >> ((i & 3) * 8)) & 0xFFu);
}

// Length of the true prefix of a monotone predicate over [0, n) (true for t < answer, false
// after): a coarse pass at every `step`-th index, then the one segment that holds the boundary.
// Both passes are independent loads, so this costs two load latencies, not log2(n).
template <typename Pred>
__device__ __forceinline__ int prefix_length(int n, int step, Pred pred) {
    const int coarse_n = n / step;
    int coarse = 0;
#pragma unroll 4
    for (int k = 1; k <= coarse_n; ++k) coarse += pred(k * step - 1);
    const int lo = coarse * step;
    const int hi = lo + step - 1 < n ? lo + step - 1 : n;
    int fine = 0;
#pragma unroll 4
    for (int t = lo; t < hi; ++t) fine += pred(t);
    return lo + fine;
}

// The corner bound of depth d (index): per-warp maxima over slots s of beam[s] + lp[d][ceil(N/(s+1)) - 1].
__device__ __forceinline__ void corner_bound(int d, int N, int KP, int T, int tid, const double* beam,
                                             const double* lp, double* tau_w) {
    const double NEG = -__builtin_inf();
    double best = NEG;
    for (int s = tid; s < N; s += T) {
        const int b = (N + s) / (s + 1);
        if (b <= KP) {
            best = nan_max(best, beam[s] + lp[d * KP + b - 1]);
        }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        best = nan_max(best, __shfl_xor_sync(FULL, best, off));
    }
    if ((tid & 31) == 0) tau_w[tid >> 5] = best;
}

// Merge beam `m` (sorted) into the running list (sorted, depths < m); keep the N first.
// Beam entry t precedes list entry i iff its score is higher, or equal with its ancestor at i's
// depth lex-smaller than i (equal: i is that ancestor and goes first); -inf precedes nothing.
// `step`: the coarse probe stride of prefix_length, the least power of two with step^2 >= N
// (computed once by the caller: every warp ran its loop at every depth).
__device__ __forceinline__ void merge(int m, int N, int T, int tid, int step, const double* beam,
                                      const uint8_t* lexrow, const Entry* old_list, Entry* new_list) {
    const double NEG = -__builtin_inf();
    // The last 2N threads when there are that many: S1's pair chunks sit on the first warps.
    const int first = T >= 2 * N ? tid - (T - 2 * N) : tid;
    for (int e = first; e < 2 * N; e += T) {
        if (e < 0) continue;
        if (e < N) {
            const Entry me = old_list[e];
            const double gs = me.score;
            const int ge = (me.info >> 8) & 15, glex = me.info >> 12;
            const int before = prefix_length(N, step, [&](int t) {
                const double s = beam[t];
                const int alex = lexrow[t * 16 + ge];
                return static_cast<int>((s > NEG) & ((gs == NEG) | (s > gs) | ((s == gs) & (alex < glex))));
            });
            if (e + before < N) new_list[e + before] = me;
        } else {
            const int t = e - N;
            const double s = beam[t];
            const uint4 row = reinterpret_cast<const uint4*>(lexrow)[t];
            const int before = prefix_length(N, step, [&](int i) {
                const Entry o = old_list[i];
                const int ge = (o.info >> 8) & 15, glex = o.info >> 12;
                const int alex = byte_of(row, ge);
                return static_cast<int>(!((s > NEG) & ((o.score == NEG) | (s > o.score) |
                                                       ((s == o.score) & (alex < glex)))));
            });
            if (t + before < N) {
                Entry out;
                out.score = s;
                out.info = static_cast<uint32_t>(t | (m << 8) | (byte_of(row, m) << 12));
                out.pad = 0;
                new_list[t + before] = out;
            }
        }
    }
}

// (MAX_THREADS, 1): up to 128 registers a thread. With the minimum CTA count left out, nvcc 13
// caps this kernel at 64 registers and spills (tests/kernels/test_kernels_compile.py checks for spills).
__global__ void __launch_bounds__(MAX_THREADS, 1) tree_build_kernel(const Params p) {
    TTB_DYNAMIC_SMEM(smem);
    const double NEG = -__builtin_inf();
    const int N = static_cast<int>(p.budget), D = static_cast<int>(p.depth), KP = static_cast<int>(p.kp);
    const int P = static_cast<int>(p.pairs), W = static_cast<int>(p.words);
    const int T = static_cast<int>(blockDim.x), tid = static_cast<int>(threadIdx.x);
    const int lane = tid & 31, warp = tid >> 5, warps = T >> 5;
    const int64_t b = blockIdx.x;
    const Layout L = layout(N, D, KP, P, W, warps);
#ifdef TVA_EMULATE
    if (static_cast<size_t>(L.total) > emu::current_block()->smem_size)
        emu::die("tree_build: the layout exceeds the launch's shared memory");
#endif
    double* lp = reinterpret_cast<double*>(smem + L.lp);
    int64_t* ids = reinterpret_cast<int64_t*>(smem + L.ids);
    uint16_t* pairs = reinterpret_cast<uint16_t*>(smem + L.pairs);
    uint16_t* pos_of = reinterpret_cast<uint16_t*>(smem + L.pos_of);
    Cand* cand = reinterpret_cast<Cand*>(smem + L.cand);
    double* beam_score = reinterpret_cast<double*>(smem + L.beam_score);
    uint32_t* beam_key = reinterpret_cast<uint32_t*>(smem + L.beam_key);
    uint16_t* beam_pair = reinterpret_cast<uint16_t*>(smem + L.beam_pair);
    uint16_t* slot_info = reinterpret_cast<uint16_t*>(smem + L.slot_info);
    uint16_t* next_slot = reinterpret_cast<uint16_t*>(smem + L.next_slot);
    uint16_t* node_of = reinterpret_cast<uint16_t*>(smem + L.node_of);
    uint8_t* lexrow = smem + L.lexrow;
    Entry* list = reinterpret_cast<Entry*>(smem + L.list);
    double* tau_w = reinterpret_cast<double*>(smem + L.tau);
    int* counters = reinterpret_cast<int*>(smem + L.counters);
    int16_t* par_s = reinterpret_cast<int16_t*>(smem + L.par);
    int16_t* fc_s = reinterpret_cast<int16_t*>(smem + L.fc);
    uint32_t* bits_s = reinterpret_cast<uint32_t*>(smem + L.bits);

    // ---- Prologue: inputs to shared memory (one round of independent global loads).
    // One loop, so that the loads of all three arrays are in flight together.
    const int lp_dtype = static_cast<int>(p.lp_dtype);
    const int n_load = D * KP > P ? D * KP : P;
    for (int i = tid; i < n_load; i += T) {
        if (i < D * KP) {
            const int d = i / KP, r = i - d * KP;
            const double v = load_lp(p.log_probs, b * p.lp_sb + d * p.lp_sd + r, lp_dtype);
            lp[i] = v >= FLOOR ? v : FLOOR;       // -inf (masked logits) and NaN -> -1e30
            ids[i] = __ldg(p.token_ids + b * p.ids_sb + d * p.ids_sd + r);
        }
        if (i < P) pairs[i] = static_cast<uint16_t>(__ldg(p.pair_j + i) | (__ldg(p.pair_r + i) << 8));
    }
    for (int i = tid; i < D * N; i += T) node_of[i] = 0;
    for (int i = tid; i <= N; i += T) fc_s[i] = -1;
    if (tid == 0) {
        counters[0] = 0;
        counters[1] = 0;
        par_s[0] = -1;
    }
    __syncthreads();

    // Depth 1: the k' ranks of position 1, already in pop order; slots >= k' are padding.
    for (int s = tid; s < N; s += T) {
        const double sc = s < KP ? lp[s] : NEG;
        beam_score[s] = sc;
        slot_info[s] = static_cast<uint16_t>((s < KP ? s : KP - 1) << 8);
        next_slot[s] = s + 1 < KP ? static_cast<uint16_t>(s + 1) : NONE;
        lexrow[s * 16] = static_cast<uint8_t>(s);
        Entry e;
        e.score = sc;
        e.info = static_cast<uint32_t>(s | (s << 12));
        e.pad = 0;
        list[s] = e;
    }
    // (corner_bound reads beam_score[s] for the slots s this same thread just wrote)
    if (D > 1) corner_bound(1, N, KP, T, tid, beam_score, lp, tau_w);
    __syncthreads();

    const int tau_warps = (N + 31) / 32 < warps ? (N + 31) / 32 : warps;   // warps that saw corners
    const int chunk = (P + 32 * warps - 1) / (32 * warps) * 32;           // pairs per warp in S1
    // Per-kernel constants, hoisted out of the depth loop and kept as shifts: ncu counted 314
    // instructions that every warp ran at every depth (38 % of the kernel's), mostly the integer
    // divisions by the group sizes and these loops.
    int merge_step = 1;
    while (merge_step * merge_step < N) merge_step <<= 1;
    int lex_shift = 0;                                                    // 2^lex_shift threads per slot in S3
    while (lex_shift < 3 && (2 << lex_shift) * N <= T) ++lex_shift;
    const int lex_group = 1 << lex_shift, lex_sub = tid & (lex_group - 1), lex_grp = tid >> lex_shift;
    const int lex_per_pass = T >> lex_shift, lex_iters = (N - lex_sub + lex_group - 1) >> lex_shift;

    for (int d = 1; d < D; ++d) {
        const int cur = d & 1, prv = cur ^ 1;
        const double* beam_prev = beam_score + prv * N;
        double* beam_cur = beam_score + cur * N;
        const uint8_t* lex_prev = lexrow + prv * N * 16;
        uint8_t* lex_cur = lexrow + cur * N * 16;

        // ---- S1: candidates of depth d (+ the merge of depth d-1 into the list).
        {
            double tau = NEG;
            for (int w = 0; w < tau_warps; ++w) tau = nan_max(tau, tau_w[w]);
            const int first = warp * chunk;
            const unsigned lower = (1u << lane) - 1u;
            double c[MAX_PAIR_ITERS];
            uint32_t key[MAX_PAIR_ITERS];
            unsigned live_mask[MAX_PAIR_ITERS];
            int count = 0;
#pragma unroll
            for (int it = 0; it < MAX_PAIR_ITERS; ++it) {
                live_mask[it] = 0;
                if (it * 32 < chunk) {                        // uniform across the warp
                    const int q = first + it * 32 + lane;
                    bool live = false;
                    c[it] = NEG;
                    key[it] = 0;
                    if (q < P) {
                        const int jr = pairs[q], j = jr & 0xFF, r = jr >> 8;
                        c[it] = beam_prev[j] + lp[d * KP + r];
                        key[it] = static_cast<uint32_t>(lex_prev[j * 16 + d - 1] * KP + r);
                        live = c[it] >= tau;
                        if (!live) pos_of[q] = NONE;
                    }
                    live_mask[it] = __ballot_sync(FULL, live);
                    count += __popc(live_mask[it]);
                }
            }
            int base = 0;
            if (lane == 0 && count > 0) base = atomicAdd(&counters[cur], count);
            base = __shfl_sync(FULL, base, 0);
#pragma unroll
            for (int it = 0; it < MAX_PAIR_ITERS; ++it) {
                if (it * 32 < chunk) {
                    if ((live_mask[it] >> lane) & 1u) {
                        Cand x;
                        x.score = c[it];
                        x.key = key[it];
                        x.pair = static_cast<uint32_t>(first + it * 32 + lane);
                        cand[base + __popc(live_mask[it] & lower)] = x;
                    }
                    base += __popc(live_mask[it]);
                }
            }
        }
        if (d >= 2) merge(d - 1, N, T, tid, merge_step, beam_prev, lex_prev, list + (d & 1) * N, list + prv * N);
        __syncthreads();

        // ---- S2: rank every survivor in pop order; the N first form the beam of depth d.
        {
            const int M = counters[cur];
            int shift = 0;                                     // G = 2^shift threads per survivor
            while (shift < 3 && (2 << shift) * M <= T) ++shift;
            const int G = 1 << shift, per_pass = T >> shift, sub = tid & (G - 1), grp = tid >> shift;
            const int iters = (M - sub + G - 1) >> shift;      // q = sub, sub + G, ... < M
            for (int start = 0; start < M; start += per_pass) {
                const int s = start + grp;
                int before = 0;
                Cand me;
                me.score = 0;
                me.key = 0;
                me.pair = 0;
                if (s < M) {
                    me = cand[s];
                    // One 16-byte load per survivor (score, key): ~7 instructions per compare.
#pragma unroll 4
                    for (int i = 0; i < iters; ++i) {
                        const uint4 o = reinterpret_cast<const uint4*>(cand)[sub + (i << shift)];
                        const uint64_t o_bits = (static_cast<uint64_t>(o.y) << 32) | o.x;
                        double o_score;
                        memcpy(&o_score, &o_bits, 8);
                        before += (o_score > me.score) | ((o_score == me.score) & (o.z < me.key));
                    }
                }
                for (int off = 1; off < G; off <<= 1) before += __shfl_xor_sync(FULL, before, off);
                if (s < M && sub == 0) {
                    if (before < N) {
                        beam_cur[before] = me.score;
                        beam_key[before] = me.key;
                        beam_pair[before] = static_cast<uint16_t>(me.pair);
                        slot_info[d * N + before] = pairs[me.pair];
                        pos_of[me.pair] = static_cast<uint16_t>(before);
                    } else {
                        pos_of[me.pair] = NONE;
                    }
                }
            }
        }
        __syncthreads();

        // ---- S3: lex ranks, ancestor rows, next siblings, the next depth's bound.
        {
            for (int start = 0; start < N; start += lex_per_pass) {
                const int s = start + lex_grp;
                int smaller = 0;
                if (s < N) {
                    const uint32_t k = beam_key[s];
#pragma unroll 4
                    for (int i = 0; i < lex_iters; ++i) smaller += beam_key[lex_sub + (i << lex_shift)] < k;
                }
                for (int off = 1; off < lex_group; off <<= 1) smaller += __shfl_xor_sync(FULL, smaller, off);
                if (s < N && lex_sub == 0) {
                    const int js = slot_info[d * N + s] & 0xFF;
                    reinterpret_cast<uint4*>(lex_cur)[s] = reinterpret_cast<const uint4*>(lex_prev)[js];
                    lex_cur[s * 16 + d] = static_cast<uint8_t>(smaller);
                }
            }
            for (int s = tid; s < N; s += T) {
                const int q = beam_pair[s], nx = q + 1;
                next_slot[d * N + s] = nx < P && (pairs[nx] & 0xFF) == (pairs[q] & 0xFF) ? pos_of[nx] : NONE;
            }
            if (d + 1 < D) corner_bound(d + 1, N, KP, T, tid, beam_cur, lp, tau_w);
            if (tid == 0) counters[prv] = 0;                  // the survivor count of depth d+1
        }
        __syncthreads();
    }
    if (D > 1) {
        const int m = D - 1;
        merge(m, N, T, tid, merge_step, beam_score + (m & 1) * N, lexrow + (m & 1) * N * 16, list + ((m - 1) & 1) * N,
              list + (m & 1) * N);
        __syncthreads();
    }

    // ---- Epilogue: nodes 1..N in pop order.
    const Entry* fin = list + ((D - 1) & 1) * N;
    const int64_t row1 = b * (N + 1);
    for (int s = tid; s < N; s += T) {
        const Entry e = fin[s];
        const bool real = e.score > NEG;
        const int slot = e.info & 0xFF, d0 = (e.info >> 8) & 15;
        const int r = slot_info[d0 * N + slot] >> 8;
        p.tokens[b * N + s] = real ? ids[d0 * KP + r] : 0;
        p.depths[b * N + s] = real ? d0 + 1 : 0;
        p.scores[b * N + s] = static_cast<float>(e.score);
        if (real) node_of[d0 * N + slot] = static_cast<uint16_t>(s + 1);
    }
    if (tid == 0) {
        p.parents[row1] = -1;
        p.next_sibling[row1] = -1;
    }
    __syncthreads();
    for (int s = tid; s < N; s += T) {
        const Entry e = fin[s];
        const bool real = e.score > NEG;
        const int slot = e.info & 0xFF, d0 = (e.info >> 8) & 15;
        const int info = slot_info[d0 * N + slot], js = info & 0xFF, r = info >> 8;
        const int par = real ? (d0 > 0 ? node_of[(d0 - 1) * N + js] : 0) : -1;
        par_s[s + 1] = static_cast<int16_t>(par);
        p.parents[row1 + s + 1] = par;
        if (real && r == 0) fc_s[par] = static_cast<int16_t>(s + 1);
        int next = -1;
        if (real) {
            const int ns = next_slot[d0 * N + slot];
            if (ns != NONE && node_of[d0 * N + ns] != 0) next = node_of[d0 * N + ns];
        }
        p.next_sibling[row1 + s + 1] = next;
    }
    __syncthreads();
    for (int i = tid; i <= N; i += T) p.first_child[row1 + i] = fc_s[i];
    // Ancestor bitmasks: one thread per (row, word) walks the row's parents (depth <= D).
    for (int item = tid; item < (N + 1) * W; item += T) {
        const int row = item / W, w = item - row * W;
        uint32_t word = 0;
        int node = row;
        for (int step = 0; step <= D && node >= 0; ++step) {
            if ((node >> 5) == w) word |= 1u << (node & 31);
            node = par_s[node];
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

// Raise the kernel's dynamic shared-memory limit once per device (a host-side attribute: no
// stream work, so also fine during graph capture).
static cudaError_t prepare(int smem) {
    static int done[64] = {0};            // largest size set per device
    static std::mutex lock;               // ctypes drops the GIL
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    std::lock_guard<std::mutex> guard(lock);
    if (device >= 0 && device < 64 && done[device] >= smem) return cudaSuccess;
    err = cudaFuncSetAttribute(tree_build_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err == cudaSuccess && device >= 0 && device < 64) done[device] = smem;
    return err;
}

static bool valid(const Params& p, int threads) {
    return p.budget >= 1 && p.budget <= MAX_BUDGET && p.depth >= 1 && p.depth <= MAX_DEPTH && p.kp >= 1 &&
           p.kp <= p.budget && p.pairs >= p.budget && p.pairs <= static_cast<int64_t>(MAX_PAIR_ITERS) * threads &&
           p.pairs < NONE && p.words == (p.budget + 32) / 32 && p.lp_dtype >= 0 && p.lp_dtype <= 2 &&
           threads >= 32 && threads <= MAX_THREADS && threads % 32 == 0 && p.batch >= 0 && p.batch <= 0x7FFFFFFF;
}

}  // namespace ttb

extern "C" {

// Dynamic shared memory of one launch (bytes).
int ttb_smem_bytes(int budget, int depth, int kp, int pairs, int threads) {
    return ttb::layout(budget, depth, kp, pairs, (budget + 32) / 32, threads / 32).total;
}

// Returns a cudaError_t (0 = success). Asynchronous on `stream`; one CTA of `threads` per sequence.
int ttb_build_tree(const ttb::Params* params, int threads, void* stream) {
    const ttb::Params& p = *params;
    if (!ttb::valid(p, threads)) return static_cast<int>(cudaErrorInvalidValue);
    if (p.batch == 0) return 0;
    const int smem = ttb_smem_bytes(static_cast<int>(p.budget), static_cast<int>(p.depth), static_cast<int>(p.kp),
                                    static_cast<int>(p.pairs), threads);
    cudaError_t err = ttb::prepare(smem);
    if (err != cudaSuccess) return static_cast<int>(err);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    TTB_LAUNCH(ttb::tree_build_kernel, dim3(static_cast<unsigned>(p.batch)), dim3(threads), smem, s, p);
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
