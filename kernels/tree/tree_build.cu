// DDTree tree build (CUDA C++): the reference heap's best-first pops, by one warp, one launch.
//
// The tree is the N first nodes of the total order the heap pops in (harness/decode/tree.py,
// harness/decode/tree_gpu.py's docstring):
//     score descending (float64 sums of the clamped log-probs), then rank path ascending.
// This kernel pops them one by one exactly as the heap does, with the heap replaced by a frontier
// kept sorted across the 32 lanes of one warp (pop_nodes): a popped node (depth d, rank r,
// parent p) puts back its next sibling (p, d, r+1) and its first child (node, d+1, 0), and the
// next pop is always the array's first entry, so a pop needs no warp-wide search: the two new
// candidates' places are counted by ballots and every entry moves by at most one place (one
// shuffle up, one down). Every lane holds copies of the first two entries, so the chain from one
// pop to the next has no shuffle in it. Ties (equal float64 scores: bf16 log-probs) are broken by
// the rank path, compared as 16 8-bit digits, depth 1 most significant, zero padded: among
// frontier entries (never an ancestor of one another) that is the heap's lexicographic order.
// The sums are the torch path's, in its order (parent's score + log-prob), so scores are
// bit-identical to tree_gpu's float64 ones, and so is every output: the tree is the heap's node
// for node, ties included. The other warps load the inputs and, after the pops, write the
// outputs (the ancestor bitmasks by walking each row's parents).
//
// Why this shape: the per-depth beam formulation (tree_gpu._build_torch, the Triton kernel) needs
// ~3 block-wide barriers per depth; as a CUDA kernel of 16 warps it took 59-63 us on the H200,
// issue-latency bound on one SM with 38 % of its instructions per-depth bookkeeping
// (kernels/NOTES.md). Popping from an unsorted frontier (each pop a __reduce_max_sync over the
// lanes' best, then a broadcast of the winner) took 25.9 us at N 64, D 15 (graph replay, 256
// threads): ~150 warp instructions a pop, each waiting on the one before. The sorted frontier
// takes the search and the broadcast off that chain: 21.95 us (kernels/NOTES.md, session 10).
// Where a popped node's first child pops next, a round pops the run of rank-0 descendants that
// do (run_round) and merges its candidates into the frontier at once, so the loop's peaked
// trees (runs of single children) take about half the rounds.

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
// Programmatic dependent launch on sm_90+ (sm90.cuh): the build may be scheduled while the
// kernel before it (the Triton top-k's last, which lets its dependents launch first thing)
// finishes; the kernel waits for it first thing (wait_for_previous_kernel).
#define TTB_LAUNCH(kernel, grid, block, smem, stream, p) pdl_launch(kernel, grid, block, smem, stream, p)
#endif
#include <stdint.h>
#include <string.h>

#include <mutex>

#include "../sm90.cuh"          // PDL launches

namespace ttb {

// First thing in the kernel: wait until the kernel before it on the stream has finished and its
// writes are visible (a no-op unless launched with PDL), then let the next kernel launch early.
__device__ __forceinline__ void wait_for_previous_kernel() {
    griddep_wait();
    griddep_launch_dependents();
}

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

// A frontier candidate (a node not popped yet whose parent has been): its score (the torch
// path's float64 sum, never -0.0: the root's is +0.0 and a sum is -0.0 only when both terms are;
// -inf: an empty slot, which sorts after every real one: the clamp keeps every real score finite) and parent | previous sibling << 9 | depth << 18 | rank << 23 (0:
// empty; a real candidate has depth >= 1). Its rank path, needed only when two scores are
// equal, is its parent's row of the node paths in shared memory plus its rank.
struct Cand {
    double score;
    uint32_t meta;
};

__device__ __forceinline__ Cand no_cand() { return Cand{-__builtin_inf(), 0u}; }

// Word w of a candidate's rank path (8-bit digits, depth 1 in the top byte of word 0, zero
// padded): its parent's path plus its own rank at its depth. Among frontier candidates (never
// an ancestor of one another) this orders exactly like the heap's rank-path tuples; a node and
// its rank-0 child have the same padded words, so a popped node is never compared this way.
__device__ __forceinline__ uint32_t path_word(const Cand& c, int w, const uint32_t* paths) {
    const int par = c.meta & 511, d = (c.meta >> 18) & 31, r = c.meta >> 23;
    const uint32_t own = w == (d - 1) >> 2 ? static_cast<uint32_t>(r) << (24 - 8 * ((d - 1) & 3)) : 0u;
    return paths[par * 4 + w] + own;
}

// Whether a pops before b: higher score, or equal score and smaller rank path (two empty slots:
// neither). Equal scores are rare except with bf16 log-probs; only then are the paths read.
__device__ __forceinline__ bool pops_before(const Cand& a, const Cand& b, const uint32_t* paths) {
    if (a.score != b.score) return a.score > b.score;
    if (a.meta == 0u) return false;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        const uint32_t pa = path_word(a, w, paths), pb = path_word(b, w, paths);
        if (pa != pb) return pa < pb;
    }
    return false;
}

__device__ __forceinline__ Cand shfl_cand(const Cand& c, int src) {
    return Cand{__shfl_sync(FULL, c.score, src), __shfl_sync(FULL, c.meta, src)};
}

// dst = c ? src : dst, field by field: `if (s == i) slot[s] = x` over an unrolled s is turned
// back into slot[i] = x, and `c ? a : b` of two structs into a select of their addresses: both
// put the candidates in local memory.
__device__ __forceinline__ void assign_if(Cand& dst, bool c, const Cand& src) {
    dst.score = c ? src.score : dst.score;
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
    int lp, node_score, path, par, dr, fc, ns, bits, count, front_score, front_meta, total;
};

__host__ __device__ inline int take(int& at, int bytes) {
    const int here = at;
    at = (at + bytes + 15) & ~15;
    return here;
}

// Frontier slots a lane for a budget of N nodes: 32 S >= floor((N + 1) / 2) (pop_nodes), S one
// of the three kernels' 1, 2, 4.
__host__ __device__ inline int frontier_slots(int N) {
    const int S = ((N + 1) / 2 + 31) / 32;
    return S <= 1 ? 1 : S <= 2 ? 2 : 4;
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
    const int F = 32 * frontier_slots(N);
    L.front_score = take(at, F * 8);          // double [32 S] the frontier, after a run round
    L.front_meta = take(at, F * 4);           // u32 [32 S]
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
    double* front_score;    // the frontier's 32 S entries, rewritten by a run round (pop_nodes)
    uint32_t* front_meta;
};

// The most nodes a round pops after its first (a run of rank-0 descendants, pop_nodes). Each
// run round's merge costs RUN + 2 candidates however short its run; on the H200 at N 64 runs of
// at most 4 measured best of 2-6 (kernels/NOTES.md, "The tree build's pops in runs").
constexpr int RUN = 4;

// A run round (pop_nodes): node `node` (x, at depth d, its rank path `row`) has just popped and
// its first child c pops before every other candidate. Pop c and, while each does so too, its
// rank-0 descendants (at most RUN after x): a node's rank-0 child has its parent's padded path
// and the sum the heap would make (its parent's score + the log-prob), and it pops next exactly
// when its score beats the best of the rest (h1, x's sibling s and the siblings the run put
// back), which one running max tracks. Strictly: an equal score ends the run, and the general
// merge below decides it with the rank paths. The round's candidates (s, each run node's next
// sibling, the last node's first child) then go into the frontier at once: each lane counts
// where its entries move (the candidates before them) and lane i where candidate i lands (the
// entries before it by one ballot each, the candidates before it), all write the merged order
// to shared memory, and read their slots and the first two entries back. Every lane computes
// the run itself (it holds every candidate), so the merge needs no shuffle. On the loop's
// peaked distribution (the drafter's logits x 32) a round pops ~3 nodes where it pops more than
// one (a CPU replay of the heap: 64 nodes in ~31 rounds at RUN 4 instead of 64).
// Returns the nodes popped so far (N: done).
template <int S>
__device__ int run_round(int N, int D, int KP, const double* lp, const Nodes nodes, int lane, int node, int d,
                         const uint4 row, Cand c, const Cand& s, Cand (&slot)[S], Cand& h0, Cand& h1) {
    constexpr int PUT = RUN + 2;          // s, the run nodes' siblings, the last one's child
    constexpr int CAP = 32 * S;
    Cand put[PUT];
    put[0] = s;
    double best = fmax(h1.score, s.score);
    int cur = node, cd = d;
    double cur_score = h0.score;
    bool go = true;
#pragma unroll
    for (int j = 1; j <= RUN; ++j) {
        put[j] = no_cand();
        if (go) {                          // the same in every lane
            const int popped = node + j;   // c pops as node `popped`, under `cur`
            reinterpret_cast<uint4*>(nodes.path)[popped] = row;
            nodes.score[popped] = c.score;
            if (lane == 0) {
                nodes.par[popped] = static_cast<int16_t>(cur);
                nodes.dr[popped] = static_cast<uint16_t>((cd + 1) << 8);
                nodes.fc[cur] = static_cast<int16_t>(popped);
            }
            if (popped == N) return N;
            const bool has_sibling = 1 < KP, has_child = cd + 1 < D;
            const double lp_sibling = lp[has_sibling ? cd * KP + 1 : 0];
            const double lp_child = lp[has_child ? (cd + 1) * KP : 0];
            Cand sib{cur_score + lp_sibling, static_cast<uint32_t>(cur | popped << 9 | (cd + 1) << 18 | 1 << 23)};
            Cand next{c.score + lp_child, static_cast<uint32_t>(popped | (cd + 2) << 18)};
            assign_if(sib, !has_sibling, no_cand());
            assign_if(next, !has_child, no_cand());
            put[j] = sib;
            best = fmax(best, sib.score);
            cur = popped;
            cur_score = c.score;
            ++cd;
            c = next;
            go = j < RUN && c.meta != 0u && c.score > best;
        }
    }
    put[PUT - 1] = c;                      // the last run node's first child (or none)

    Cand mine = no_cand();                 // lane i places candidate i
#pragma unroll
    for (int i = 0; i < PUT; ++i) assign_if(mine, lane == i, put[i]);
    int dest[S], at = 0;
    const auto merge = [&](auto before) {
#pragma unroll
        for (int k = 0; k < S; ++k) {
            int moved = lane * S + k - 1;
#pragma unroll
            for (int i = 0; i < PUT; ++i) moved += before(put[i], slot[k]);
            dest[k] = moved;
        }
        at = 0;
#pragma unroll
        for (int i = 0; i < PUT; ++i) {
            int olds = 0;
#pragma unroll
            for (int k = 0; k < S; ++k)
                olds += __popc(__ballot_sync(FULL, (lane != 0 || k != 0) && before(slot[k], put[i])));
            at += lane == i ? olds : 0;
            at += before(put[i], mine);     // a strict order: never before itself
        }
    };
    merge([](const Cand& a, const Cand& b) { return a.score > b.score; });
    // Equal scores among the compared pairs (a candidate and an entry, two candidates): decided
    // again with the rank paths, as pop_nodes does.
    bool tie = false;
#pragma unroll
    for (int i = 0; i < PUT; ++i) {
#pragma unroll
        for (int k = 0; k < S; ++k)
            tie |= (lane != 0 || k != 0) && put[i].meta != 0u && slot[k].meta != 0u && put[i].score == slot[k].score;
        tie |= lane != i && mine.meta != 0u && put[i].meta != 0u && put[i].score == mine.score;
    }
    if (__any_sync(FULL, tie)) merge([&](const Cand& a, const Cand& b) { return pops_before(a, b, nodes.path); });

    __syncwarp();                          // the last run round's reads are done
#pragma unroll
    for (int k = 0; k < S; ++k)
        if ((lane != 0 || k != 0) && dest[k] < CAP) {
            nodes.front_score[dest[k]] = slot[k].score;
            nodes.front_meta[dest[k]] = slot[k].meta;
        }
    if (mine.meta != 0u && at < CAP) {
        nodes.front_score[at] = mine.score;
        nodes.front_meta[at] = mine.meta;
    }
    // The merged order fills entries 0 .. CAP - 1 whenever a candidate is real. None is only
    // with k' = 1 (no siblings) at the depth limit, where x was the frontier's one entry: the
    // frontier is empty (entry 0 written empty) and the loop ends before reading more.
    __syncwarp();
#pragma unroll
    for (int k = 0; k < S; ++k) slot[k] = Cand{nodes.front_score[lane * S + k], nodes.front_meta[lane * S + k]};
    h0 = Cand{nodes.front_score[0], nodes.front_meta[0]};
    h1 = Cand{nodes.front_score[1], nodes.front_meta[1]};
    return cur;                            // the run's last node: the nodes popped so far
}

// The pops, by the 32 lanes of one warp. The frontier is kept sorted in pop order across the
// lanes, S slots a lane, lane-major (entry i: lane i / S, slot i % S), so the next pop is always
// entry 0 and no pop needs a warp-wide search for the best. Every lane also holds copies of
// entries 0 and 1 (h0, h1). A pop takes h0 = x and puts back its first child and next sibling
// (f, g: the earlier of the two first); the new entries 0 and 1 follow from h1, entry 2 (one
// shuffle, issued before it is needed) and f, g by four comparisons, with no shuffle on the
// chain from one pop to the next. Off that chain, each entry moves at most one place:
//     new entry j = f or g where they land, else old entry j + 1 - (f, g landed before j),
// the landing places counted by one ballot per slot and candidate, the neighbours read by one
// shuffle up and one down. Only the N - t - 1 best entries after pop t can still be popped, and
// the frontier then holds at most t + 2, so 32 S >= floor((N + 1) / 2) entries suffice: the
// worst entry falls off when the array is full, never one that would pop.
// Returns the real nodes (fewer than N when the frontier runs empty: a tiny vocabulary).
template <int S>
__device__ int pop_nodes(int N, int D, int KP, const double* lp, const Nodes nodes, int lane) {
    Cand slot[S];
#pragma unroll
    for (int s = 0; s < S; ++s) slot[s] = no_cand();
    Cand h0{0.0 + lp[0], 1u << 18}, h1 = no_cand();   // rank 0 of depth 1, under the root
    if (lane == 0) slot[0] = h0;

    for (int t = 0; t < N;) {
        if (h0.meta == 0u) return t;  // the frontier is empty (h0 is the same in every lane)
        const uint32_t meta = h0.meta;
        const int par = meta & 511, prev = (meta >> 9) & 511, d = (meta >> 18) & 31, r = meta >> 23;
        const int node = t + 1;

        // The node's record. Every lane writes the same score and rank path (so each reads back
        // its own stores, with no __syncwarp); lane 0 the links, read only after the pops.
        uint4 row = reinterpret_cast<const uint4*>(nodes.path)[par];
        const uint32_t own = static_cast<uint32_t>(r) << (24 - 8 * ((d - 1) & 3));
        const int word = (d - 1) >> 2;
        row.x += word == 0 ? own : 0u;
        row.y += word == 1 ? own : 0u;
        row.z += word == 2 ? own : 0u;
        row.w += word == 3 ? own : 0u;
        reinterpret_cast<uint4*>(nodes.path)[node] = row;
        nodes.score[node] = h0.score;
        if (lane == 0) {
            nodes.par[node] = static_cast<int16_t>(par);
            nodes.dr[node] = static_cast<uint16_t>(d << 8 | r);
            if (r == 0) nodes.fc[par] = static_cast<int16_t>(node);
            else nodes.ns[prev] = static_cast<int16_t>(node);
        }
        if (node == N) break;         // the last pop puts nothing back

        // Entry 2 and each slot's neighbours: they do not depend on this pop.
        const Cand e2 = shfl_cand(slot[2 % S], 2 / S);
        Cand up = Cand{__shfl_up_sync(FULL, slot[S - 1].score, 1), __shfl_up_sync(FULL, slot[S - 1].meta, 1)};
        Cand down = Cand{__shfl_down_sync(FULL, slot[0].score, 1), __shfl_down_sync(FULL, slot[0].meta, 1)};
        assign_if(down, lane == 31, no_cand());

        // The two candidates, scored as the torch path sums (the parent's score + the log-prob).
        const bool has_sibling = r + 1 < KP, has_child = d < D;
        const double lp_sibling = lp[has_sibling ? (d - 1) * KP + r + 1 : 0];
        const double lp_child = lp[has_child ? d * KP : 0];
        Cand c{h0.score + lp_child, static_cast<uint32_t>(node | (d + 1) << 18)};
        Cand s{nodes.score[par] + lp_sibling, static_cast<uint32_t>(par | node << 9 | d << 18 | (r + 1) << 23)};
        assign_if(c, !has_child, no_cand());
        assign_if(s, !has_sibling, no_cand());
        // The first child pops next (before h1, the best of the rest, and the sibling, strictly
        // by score): a run round pops it and its rank-0 descendants while they keep doing so.
        if (c.meta != 0u && c.score > h1.score && c.score > s.score) {
            t = run_round<S>(N, D, KP, lp, nodes, lane, node, d, row, c, s, slot, h0, h1);
            continue;
        }
        // The order, decided by the scores alone; where two of the compared scores are equal
        // (rare: bf16 log-probs, a log-prob of 0) the whole pop is decided again with the rank
        // paths, so the common pop runs no path comparison and no branch per comparison.
        // Entry 0 is x itself and is skipped (a rank-0 child's padded path equals its parent's).
        // g lands after f.
        bool c_first, f_first, g_second, f_second;
        Cand f, g;
        int before_f, before_g;
        // One decision under an order `before(a, b)`: f, g, their places among the slots (entry
        // 0 excluded), and f, g against h1 and entry 2 for the new entries 0 and 1.
        const auto decide = [&](auto before) {
            c_first = before(c, s);
            f = s;
            g = c;
            assign_if(f, c_first, c);
            assign_if(g, c_first, s);
            before_f = before_g = 0;
#pragma unroll
            for (int k = 0; k < S; ++k) {
                const bool other = lane != 0 || k != 0;
                before_f += __popc(__ballot_sync(FULL, other && before(slot[k], f)));
                before_g += __popc(__ballot_sync(FULL, other && before(slot[k], g)));
            }
            f_first = before(f, h1);
            g_second = before(g, h1);
            f_second = before(f, e2);
        };
        decide([](const Cand& a, const Cand& b) { return a.score > b.score; });
        // A tie among the compared pairs: c and s, or f or g and a slot (entries 1 and 2, which
        // f and g meet again for the new entries 0 and 1, are among the slots).
        bool tie = s.meta != 0u && c.score == s.score;
#pragma unroll
        for (int k = 0; k < S; ++k)
            tie |= (lane != 0 || k != 0) &&
                   ((f.meta != 0u && slot[k].score == f.score) || (g.meta != 0u && slot[k].score == g.score));
        if (__any_sync(FULL, tie))
            decide([&](const Cand& a, const Cand& b) { return pops_before(a, b, nodes.path); });
        constexpr int NOWHERE = 1 << 20;
        const int at_f = f.meta ? before_f : NOWHERE, at_g = g.meta ? before_g + 1 : NOWHERE;
        Cand moved[S];
#pragma unroll
        for (int k = 0; k < S; ++k) {
            const int j = lane * S + k;
            const int shift = (at_f < j) + (at_g < j);      // 0: from j + 1, 1: stays, 2: from j - 1
            moved[k] = down;
            if (k + 1 < S) moved[k] = slot[k + 1 < S ? k + 1 : 0];
            assign_if(moved[k], shift == 1, slot[k]);
            if (k > 0) assign_if(moved[k], shift == 2, slot[k > 0 ? k - 1 : 0]);
            else assign_if(moved[k], shift == 2, up);
            assign_if(moved[k], j == at_f, f);
            assign_if(moved[k], j == at_g, g);
        }
#pragma unroll
        for (int k = 0; k < S; ++k) slot[k] = moved[k];

        // The new entries 0 and 1, the same in every lane: the first two of the merge of
        // (h1, e2, ...) with (f, g).
        Cand n0 = h1, n1 = e2;
        assign_if(n0, f_first, f);
        assign_if(n1, !f_first && f_second, f);
        assign_if(n1, f_first, h1);
        assign_if(n1, f_first && g_second, g);
        h0 = n0;
        h1 = n1;
        t = node;
    }
    return N;
}

// One kernel per frontier size S (slots a lane), so that each gets its own register allocation:
// inlined into one kernel, the largest S set the register budget of all and spilled.
template <int S>
__global__ void __launch_bounds__(MAX_THREADS, 1) tree_build_kernel(const Params p) {
    wait_for_previous_kernel();
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
                      reinterpret_cast<int16_t*>(smem + L.fc), reinterpret_cast<int16_t*>(smem + L.ns),
                      reinterpret_cast<double*>(smem + L.front_score), reinterpret_cast<uint32_t*>(smem + L.front_meta)};
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

// The kernel of N's frontier size, and its index among the three.
static Kernel kernel_for(int N, int& which) {
    const int S = frontier_slots(N);
    which = S == 1 ? 0 : S == 2 ? 1 : 2;
    static const Kernel kernels[3] = {tree_build_kernel<1>, tree_build_kernel<2>, tree_build_kernel<4>};
    return kernels[which];
}

// Raise a kernel's dynamic shared-memory limit once per (kernel, device) (a host-side attribute:
// no stream work, so also fine during graph capture). Keyed by kernel too: every instance has the
// same type, and a memo by type alone let the first kernel prepared mark all the others done.
static cudaError_t prepare(Kernel kernel, int which, int smem) {
    static int done[3][64] = {{0}};       // largest size set per kernel and device
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
    return static_cast<int>(launch_status(s));
}

const char* ttb_error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

int ttb_struct_size() { return static_cast<int>(sizeof(ttb::Params)); }

}  // extern "C"
