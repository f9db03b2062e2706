// The verify forward's weight GEMMs on Hopper: y = x W^T for 17-72 token rows, stream-K on wgmma.
//
// The tree-verify forward multiplies 65 token rows (the tree's 64 nodes and its root) by each
// weight matrix of the target: q/k/v, o, gate/up, down, 8-1200 MB each. That is weight streaming
// (65 rows make ~65 flops a weight byte, a tenth of the H200's balance point), and cuBLAS does it
// at ~79 % of the copy bandwidth on an H200 (kernels/NOTES.md, "Skinny linear"), with a plain
// kernel boundary before and after each GEMM that programmatic dependent launch cannot overlap,
// and a second kernel (split-K's reduce) after two of the four.
//
// This kernel computes y^T = W x^T: W's rows are the MMA's M side (128 of them a consumer
// warpgroup, two m64 row blocks; one or two warpgroups a tile), the token rows its N side (72:
// the 65 rows zero-padded by the tensor copy, which reads nothing past the tensor). Both
// operands arrive by tensor copies (TMA) into a ring of shared-memory stages of 64 K columns
// (128-byte swizzled rows, the layout the wgmma descriptors read); one producer thread issues
// them, the consumers run the MMAs with two groups in flight.
//
// Work is split stream-K: the (tile, 64-column K step) iterations, tile-major, are divided
// evenly among one persistent CTA a multiprocessor, so every multiprocessor streams the same
// number of weight bytes whatever the shape. A tile that one CTA covers whole is written
// directly; a tile cut between CTAs is summed by its owner, the CTA of its first k steps (the
// last segment of that CTA's range), from the others' fp32 partials in CTA order, so the result
// never depends on which CTA finished first; the counter it waits on is reset by it, so one
// workspace serves every later call and graph replay. The end of a range reuses the then idle
// ring: the owner's parts arrive there by bulk copies, all in one round trip, and the last
// tile's y leaves from there by one tensor store.
//
// Weights are never written by a kernel, so the producer issues the first stages' weight copies
// before waiting for the kernel ahead of it on the stream (griddepcontrol.wait): the GEMM's
// ramp (the first weight bytes arriving ~1 µs after issue) overlaps that kernel's tail. The
// activations x, the partials and y are touched only after the wait.
//
// Measured on the H200 (kernels/NOTES.md, "The verify's weight GEMMs on wgmma"): the main loop
// streams at or above cuBLAS's pace, but the fix-up and y's stores cost ~8-10 µs a call, so at
// Qwen3-8B's shapes the kernel took 1.1-1.5x cuBLAS's time; with the range's end on bulk copies
// and a tensor store (session 27) one layer's four GEMMs take 1.05-1.07x (q/k/v and o 1.17-1.19x,
// gate/up and down 1.03-1.05x, the lm_head 1.02x faster) and the loop makes 0.96-0.97x the
// tokens/s at 0.2-0.4 % idle, so the decode loop runs it only where a cell asks (linear_impl:
// wgmma). A second kernel beside it (whole tiles dealt to thread-block clusters, summed through
// distributed shared memory) took 1.6-2.6x cuBLAS's time in session 27 and was removed
// (kernels/NOTES.md).
//
// No torch headers: plain CUDA C++ with an extern "C" launcher (kernels/linear/stream_linear.py
// calls it through ctypes; kernels/build.py compiles it on the GPU host for sm_90a). The launcher
// never synchronises and never allocates, so it can be captured in a CUDA graph. Tests compile
// this file as C++ with -DTVA_EMULATE against tests/kernels/emulator/cuda_emulation.h.

#ifdef TVA_EMULATE
#include "cuda_emulation.h"
#define TSL_DYNAMIC_SMEM(name) uint8_t* name = emu::shared_memory()
#define TSL_LAUNCH(kernel, grid, block, smem, stream, p) emu::launch(kernel, grid, block, smem, p)
#else
#include <cuda.h>               // CUtensorMap
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#define TSL_DYNAMIC_SMEM(name) extern __shared__ __align__(128) uint8_t name[]
#define TSL_LAUNCH(kernel, grid, block, smem, stream, p) pdl_launch(kernel, grid, block, smem, stream, p, p.a.pdl != 0)
#endif
#include <stdint.h>

#include <mutex>

#include "../sm90.cuh"          // PDL launches, mbarriers, tensor copies, wgmma bookkeeping

namespace tsl {

constexpr int BK = 64;                 // K columns a stage: one 128-byte swizzled row of bf16
constexpr int GROUP_ROWS = 128;        // weight rows a consumer warpgroup: two m64 row blocks
constexpr int NT = 72;                 // token rows an MMA reads (the n of m64n72k16)
constexpr int MAX_ROWS = NT;
constexpr int MAX_GROUPS = 2;          // consumer warpgroups a CTA (a tile: 128 rows each)
constexpr int MAX_THREADS = MAX_GROUPS * 128 + 64;   // and a warp whose lane 0 issues the copies, and a signal warp
constexpr uint32_t GROUP_W_BYTES = GROUP_ROWS * BK * 2, X_BYTES = NT * BK * 2;
constexpr int ACC = 2 * NT / 2;        // fp32 accumulators a consumer thread: two m64 x n72 halves
constexpr int MAX_SMEM = 232448;       // an H200 CTA's dynamic shared memory at most
static_assert(GROUP_W_BYTES % 1024 == 0 && X_BYTES % 1024 == 0, "stages keep the swizzle's 1024-byte alignment");
static_assert(ACC % 4 == 0, "partials move as float4");

// A launch's shape: `groups` consumer warpgroups share each stage's token tile (more weight rows a
// tile: fewer token bytes read from L2 a weight byte), a ring of `stages` stages (at least 3: two
// are held by MMAs in flight while the producer fills a third).
struct Shape {
    int groups, stages;
    __host__ __device__ int consumers() const { return 128 * groups; }
    __host__ __device__ int threads() const { return consumers() + 64; }
    __host__ __device__ int tile_rows() const { return GROUP_ROWS * groups; }
    __host__ __device__ uint32_t w_bytes() const { return GROUP_W_BYTES * groups; }
    __host__ __device__ uint32_t stage_bytes() const { return w_bytes() + X_BYTES; }
    __host__ __device__ int smem() const { return 1024 + stages * static_cast<int>(stage_bytes()) + 1024; }
};

// Mirrored by a ctypes structure in stream_linear.py (every field 8 bytes wide).
struct Args {
    const void* x;            // bf16 [M, K], rows x_stride elements apart, last dim contiguous
    const void* w;            // bf16 [N, K], rows w_stride elements apart
    void* y;                  // bf16 [M, N], rows y_stride elements apart
    float* partials;          // fp32 [ctas, ACC, consumers]: each CTA's part of a tile another owns
    int32_t* counters;        // [ceil(N / tile rows)], zero; every call leaves them zero
    int64_t M, N, K, x_stride, w_stride, y_stride;
    int64_t ctas;             // the persistent grid: one CTA a multiprocessor
    int64_t groups, stages;   // the Shape
    int64_t pdl;              // 1: launched with programmatic dependent launch (sm_90+; 0 for A/B timings)
};

// The tensor maps first: a CUtensorMap is 64-byte aligned (the emulator's 128).
struct Params {
    CUtensorMap map_x, map_w;
    CUtensorMap map_y;        // y as boxes of a tile's rows by NT tokens, for the tensor store
    Args a;
    int32_t y_by_copy;        // 1: map_y is valid (y 16-byte aligned, rows a multiple of 16 bytes apart)
};

// The ring once a CTA's last MMAs have retired: no stage holds anything a thread still reads, so
// the end of the range reuses its shared memory (the parts a tile's owner adds, y's tile on its
// way out), with one more mbarrier for those copies.
struct Idle {
    uint8_t* ptr;             // the ring (generic address)
    uint32_t addr, bytes;     // its shared address and size
    uint32_t bar, phase;
};

// ------------------------------------------------------------------------------------------
// PTX helpers (the emulation header defines the same functions for TVA_EMULATE builds)
// ------------------------------------------------------------------------------------------
#ifndef TVA_EMULATE
__device__ __forceinline__ uint16_t bf16_bits(float v) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

// d[64 x 72] (+)= A[64 x 16] x B[16 x 72], bf16 -> fp32, both operands K-major through
// shared-memory descriptors; d per warp w: rows 16w + lane/4 (+8), n-tile j columns
// 8j + 2(lane%4) (+1), as d[j][2h + c].
__device__ __forceinline__ void wgmma_m64n72k16_ss(float (&d)[9][4], uint64_t desc_a, uint64_t desc_b,
                                                   int accumulate) {
#ifdef TVA_WGMMA
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %38, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n72k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
        "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35}, "
        "%36, %37, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
          "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
          "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
          "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
#else
    __trap();
#endif
}
#else   // TVA_EMULATE
inline uint16_t bf16_bits(float v) { return emu_f2bf(v); }
inline void wgmma_m64n72k16_ss(float (&d)[9][4], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    emu_wgmma_issue(emu::Wgmma::kSmemA, 72, &d[0][0], desc_a, desc_b, nullptr, accumulate);
}
#endif  // TVA_EMULATE

// ------------------------------------------------------------------------------------------
// The stream-K partition: CTA c takes iterations [first_iter(c), first_iter(c + 1)) of the
// tiles x k_steps iterations, tile-major.
// ------------------------------------------------------------------------------------------
__host__ __device__ __forceinline__ int64_t first_iter(int64_t c, int64_t iters, int64_t ctas) {
    return c * iters / ctas;
}
// The CTA whose range holds iteration `it` (the largest c with first_iter(c) <= it).
__host__ __device__ __forceinline__ int64_t cta_of(int64_t it, int64_t iters, int64_t ctas) {
    return ((it + 1) * ctas - 1) / iters;
}

// CTA c's fp32 partial (of its first segment: the only one it can hand to another CTA): ACC
// float4-interleaved rows of the consumers, so thread t's accumulators are written and read back
// by thread t, coalesced.
__device__ __forceinline__ float* partial_slot(const Args& a, int consumers, int64_t c) {
    return a.partials + c * static_cast<int64_t>(ACC) * consumers;
}

// y[token, row] for the consumer thread's accumulators acc[half][j][2h + c] of tile `tile`
// (consumer thread tid: warpgroup tid / 128's 128 rows, warp (tid / 32) % 4's 16 of each half).
__device__ __forceinline__ void store_tile(const Args& a, const Shape& sh, int64_t tile, const float (&acc)[2][9][4],
                                           int tid) {
    uint16_t* y = static_cast<uint16_t*>(a.y);
    const int g = tid >> 7, w = (tid >> 5) & 3, lane = tid & 31;
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int64_t row = tile * sh.tile_rows() + g * GROUP_ROWS + half * 64 + 16 * w + lane / 4 + 8 * h;
            if (row >= a.N) continue;
#pragma unroll
            for (int j = 0; j < 9; ++j)
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const int token = 8 * j + 2 * (lane % 4) + c;
                    if (token < a.M) y[token * a.y_stride + row] = bf16_bits(acc[half][j][2 * h + c]);
                }
        }
}

__device__ __forceinline__ void write_partial(const Args& a, int consumers, int64_t c, const float (&acc)[2][9][4],
                                              int tid) {
    float4* slot = reinterpret_cast<float4*>(partial_slot(a, consumers, c));
    const float* v = &acc[0][0][0];
#pragma unroll
    for (int q = 0; q < ACC / 4; ++q)
        slot[q * consumers + tid] = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
}

// y's tile through the idle ring: each thread puts its accumulators as bf16 at [token][row] of
// a tile-wide box, and one tensor store writes the box (the tokens past M and the rows past N
// are dropped by the copy). That is one instruction where store_tile's threads issue 72 2-byte
// stores each (1.6-3.8 µs a call on the H200: kernels/NOTES.md).
__device__ __forceinline__ void store_tile_by_copy(const Params& p, const Shape& sh, int64_t tile,
                                                   const float (&acc)[2][9][4], int tid, const Idle& idle) {
    uint16_t* box = reinterpret_cast<uint16_t*>(idle.ptr);
    const int g = tid >> 7, w = (tid >> 5) & 3, lane = tid & 31, tile_rows = sh.tile_rows();
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = g * GROUP_ROWS + half * 64 + 16 * w + lane / 4 + 8 * h;
#pragma unroll
            for (int j = 0; j < 9; ++j)
#pragma unroll
                for (int c = 0; c < 2; ++c)
                    box[(8 * j + 2 * (lane % 4) + c) * tile_rows + row] = bf16_bits(acc[half][j][2 * h + c]);
        }
    fence_proxy_async();                               // this thread's writes, for the copy's reads
    named_barrier_sync(1, sh.consumers());
    if (tid == 0) {
        const int32_t xy[2] = {static_cast<int32_t>(tile * tile_rows), 0};
        tma_store(&p.map_y, xy, idle.addr);
        bulk_commit();
        bulk_wait_read<0>();                           // the ring is freed when the CTA exits
    }
}

// Until `count` CTAs have counted themselves in at `counter` (acquire: their partials are
// visible after it).
#ifdef TVA_EMULATE
// Blocks run one after another here, so a wait for a block that has not run would never end:
// the tests launch them last to first (emu_reverse_blocks), which runs every part before its owner.
inline void wait_for_parts(const int32_t* counter, int count) {
    if (*counter < count) emu::die("stream_linear: a tile's owner waits for a CTA that has not run");
}
#else
__device__ __forceinline__ void wait_for_parts(const int32_t* counter, int count) {
    int v;
    do {
        asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(counter) : "memory");
    } while (v < count);
}
#endif

// acc += the other parts of the tile CTA c owns, CTAs c + 1 .. c_last, in CTA order (the same
// bits whoever finished first). Thread 0 waits for their count, then copies the parts into the
// idle ring by bulk copies, as many as it holds a round: one round trip for all of them, where
// loads from every thread took one a part (4-6 µs a call on the H200: kernels/NOTES.md).
__device__ void add_parts(const Args& a, const Shape& sh, int64_t c, int64_t c_last, int64_t tile,
                          float (&acc)[2][9][4], int tid, Idle& idle) {
    const int consumers = sh.consumers();
    const uint32_t part_bytes = static_cast<uint32_t>(ACC * consumers * 4);
    const int64_t per_round = idle.bytes / part_bytes;  // >= 1: three stages hold a part
    if (tid == 0) {
        wait_for_parts(&a.counters[tile], static_cast<int>(c_last - c));
        a.counters[tile] = 0;                          // for the next call: every part is in
        fence_proxy_async_global();                    // the acquired stores, before the copies read them
    }
    float* v = &acc[0][0][0];
    for (int64_t c0 = c + 1; c0 <= c_last; c0 += per_round) {
        const int n = static_cast<int>(c_last - c0 + 1 < per_round ? c_last - c0 + 1 : per_round);
        if (tid == 0) {
            mbar_arrive_expect_tx(idle.bar, static_cast<uint32_t>(n) * part_bytes);
            for (int u = 0; u < n; ++u)
                bulk_load(idle.addr + static_cast<uint32_t>(u) * part_bytes, partial_slot(a, consumers, c0 + u),
                          part_bytes, idle.bar);
        }
        mbar_wait(idle.bar, idle.phase);
        idle.phase ^= 1;
        for (int u = 0; u < n; ++u) {
            const float4* part = reinterpret_cast<const float4*>(idle.ptr + static_cast<size_t>(u) * part_bytes);
#pragma unroll
            for (int q = 0; q < ACC / 4; ++q) {
                const float4 x = part[q * consumers + tid];
                v[4 * q] += x.x, v[4 * q + 1] += x.y, v[4 * q + 2] += x.z, v[4 * q + 3] += x.w;
            }
        }
        named_barrier_sync(1, consumers);              // every thread has read the round before the ring is reused
    }
}

// A segment's result: tile `tile`'s k steps [k0, k1) of `k_steps`, by CTA c; `last`: the range's
// last segment, after which the ring is idle. A tile cut between CTAs is summed by its owner,
// the CTA that computes its first k steps: that is the last segment of the owner's range, so the
// other CTAs' parts (the first segments of theirs) are usually done by then. They write their
// partials and arrive at a barrier without waiting; the CTA's signal warp, waiting there, counts
// the part in (a fence and an atomic, which would otherwise stall a warpgroup's next MMAs for an
// L2 round trip); the owner waits for the count, adds the partials and writes y.
// Waiting on other CTAs needs them resident: the launcher keeps the grid to one CTA a
// multiprocessor. y is written through the idle ring by one tensor store at the range's end,
// by each thread's stores for a whole tile before it (the ring is busy then).
__device__ void finish_segment(const Params& p, const Shape& sh, int64_t c, int64_t tile, int k0, int k1, int k_steps,
                               int64_t iters, float (&acc)[2][9][4], int tid, bool last, Idle& idle) {
    const Args& a = p.a;
    if (k0 > 0) {                                      // a part of another CTA's tile: the signal warp counts it in
        write_partial(a, sh.consumers(), c, acc, tid);
        named_barrier_arrive(2, sh.consumers() + 32);
        return;
    }
    const bool owned = k1 < k_steps;                   // only the range's last segment can be
    if (!last || (!owned && !p.y_by_copy)) {
        store_tile(a, sh, tile, acc, tid);
        return;
    }
    named_barrier_sync(1, sh.consumers());             // every warpgroup's MMAs retired: the ring is idle
    if (owned) add_parts(a, sh, c, cta_of((tile + 1) * k_steps - 1, iters, a.ctas), tile, acc, tid, idle);
    if (p.y_by_copy) store_tile_by_copy(p, sh, tile, acc, tid, idle);
    else store_tile(a, sh, tile, acc, tid);
}

// The ring's position: stage s of the ring, and the parity of the phase its barriers are in.
struct Ring {
    int s = 0, stages;
    uint32_t phase = 0;
    __device__ __forceinline__ explicit Ring(int n) : stages(n) {}
    __device__ __forceinline__ void next() {
        if (++s == stages) s = 0, phase ^= 1;
    }
};
// A (tile, k step) iteration, advanced by one without a division: stream-K's, tile-major.
struct Iter {
    int tile, k, k_steps;
    __device__ __forceinline__ void next() {
        if (++k == k_steps) k = 0, ++tile;
    }
};

// The ring in shared memory: `stages` stages (a tile's weights, then the token tile) and their
// full and empty barriers.
struct RingMem {
    uint32_t ring, full, empty, stage_bytes, w_bytes;
    int stages;
};

// The producer thread: the weight and token tiles of n iterations from `first` on, into the ring.
// Weights first, before the wait for the kernel ahead: no kernel writes them.
__device__ __forceinline__ void produce(const Params& p, const RingMem& m, Iter first, int n, int tile_rows) {
    const auto copy_w_tile = [&](const Iter& at, uint32_t stage, uint32_t bar) {
        const int32_t xy[2] = {at.k * BK, at.tile * tile_rows};
        tma_load(stage, &p.map_w, xy, bar);
    };
    Iter at = first;
    const int ahead = n < m.stages ? n : m.stages;
    for (int i = 0; i < ahead; ++i, at.next()) {
        mbar_arrive_expect_tx(m.full + 8 * i, m.stage_bytes);
        copy_w_tile(at, m.ring + static_cast<uint32_t>(i) * m.stage_bytes, m.full + 8 * i);
    }
    griddep_wait();
    griddep_launch_dependents();
    at = first;
    Ring r(m.stages);
    for (int i = 0; i < n; ++i, at.next(), r.next()) {
        const uint32_t stage = m.ring + static_cast<uint32_t>(r.s) * m.stage_bytes, bar = m.full + 8 * r.s;
        if (i >= m.stages) {
            mbar_wait(m.empty + 8 * r.s, r.phase ^ 1);           // released in the ring's last round
            mbar_arrive_expect_tx(bar, m.stage_bytes);
            copy_w_tile(at, stage, bar);
        }
        const int32_t xy[2] = {at.k * BK, 0};
        tma_load(stage + m.w_bytes, &p.map_x, xy, bar);
    }
}

// A consumer warpgroup's MMAs over the ring, group g multiplying the tile's rows [128 g, 128 g +
// 128). Two MMA groups stay in flight (the ring's stage two iterations back is released): 1-3 %
// faster than one on the H200 (kernels/NOTES.md).
struct Mma {
    const RingMem& m;
    uint32_t rows;                      // the group's weight rows in a stage
    int tid;
    Ring r;
    int released = -1, released2 = -1;  // the stages of the two iterations before, not yet released
    __device__ __forceinline__ Mma(const RingMem& ring, int t)
        : m(ring), rows(static_cast<uint32_t>(t >> 7) * GROUP_W_BYTES), tid(t), r(ring.stages) {}

    // acc (+)= the next stage's weights x tokens (acc = when `first`).
    __device__ __forceinline__ void step(float (&acc)[2][9][4], bool first) {
        const uint32_t stage = m.ring + static_cast<uint32_t>(r.s) * m.stage_bytes;
        mbar_wait(m.full + 8 * r.s, r.phase);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            const int accumulate = !first || kk > 0;
            const uint64_t dx = desc_kmajor_sw128(stage + m.w_bytes + 32 * kk);
            wgmma_m64n72k16_ss(acc[0], desc_kmajor_sw128(stage + rows + 32 * kk), dx, accumulate);
            wgmma_m64n72k16_ss(acc[1], desc_kmajor_sw128(stage + rows + 64 * 128 + 32 * kk), dx, accumulate);
        }
        wgmma_commit();
        wgmma_wait<2>();                    // the stage two before this one is read: release it
        if (released2 >= 0) {
            __syncwarp();                   // every lane's wait, then lane 0 for the warp
            if ((tid & 31) == 0) mbar_arrive(m.empty + 8 * released2);
        }
        released2 = released;
        released = r.s;
        r.next();
    }
    // Every MMA retired (acc final) and its stages released.
    __device__ __forceinline__ void drain() {
        wgmma_wait<0>();
        __syncwarp();
        if ((tid & 31) == 0) {
            if (released2 >= 0) mbar_arrive(m.empty + 8 * released2);
            if (released >= 0) mbar_arrive(m.empty + 8 * released);
        }
        released = released2 = -1;
    }
};

__global__ void __launch_bounds__(MAX_THREADS, 1) stream_linear_kernel(const __grid_constant__ Params p) {
    const Args& a = p.a;
    const Shape sh{static_cast<int>(a.groups), static_cast<int>(a.stages)};
    const int stages = sh.stages, consumers = sh.consumers(), tile_rows = sh.tile_rows();
    TSL_DYNAMIC_SMEM(smem);
    const uint32_t ring = (smem_addr(smem) + 1023u) & ~1023u;
    const RingMem m{ring, ring + static_cast<uint32_t>(stages) * sh.stage_bytes(),
                    ring + static_cast<uint32_t>(stages) * sh.stage_bytes() + 8 * stages, sh.stage_bytes(),
                    sh.w_bytes(), stages};
    Idle idle{smem + (ring - smem_addr(smem)), ring, static_cast<uint32_t>(stages) * sh.stage_bytes(),
              m.empty + 8 * stages, 0};
    const int tid = static_cast<int>(threadIdx.x);
    const int64_t c = blockIdx.x;
    const int k_steps = static_cast<int>((a.K + BK - 1) / BK);
    const int64_t iters = static_cast<int64_t>((a.N + tile_rows - 1) / tile_rows) * k_steps;
    const int64_t it0 = first_iter(c, iters, a.ctas);
    const int n = static_cast<int>(first_iter(c + 1, iters, a.ctas) - it0);
    const Iter first{static_cast<int>(it0 / k_steps), static_cast<int>(it0 % k_steps), k_steps};

    if (tid == consumers) {
        for (int s = 0; s < stages; ++s) {
            mbar_init(m.full + 8 * s, 1);
            mbar_init(m.empty + 8 * s, consumers / 32);     // a warp's lane 0 releases for it
        }
        mbar_init(idle.bar, 1);                             // the parts an owner adds, landed
        fence_mbarrier_init();
    }
    __syncthreads();

    if (tid >= consumers + 32) {                                 // the signal warp
        griddep_wait();                                          // the counters: the kernel before may use them
        griddep_launch_dependents();
        if (first.k > 0) {                                       // the CTA's first segment is another's part
            named_barrier_sync(2, consumers + 32);               // its partial written (finish_segment)
            if (tid == consumers + 32) {
                __threadfence();                                 // cumulative: the partial, then the count
                atomicAdd(&a.counters[first.tile], 1);
            }
        }
        return;
    }
    if (tid >= consumers) {                                      // the producer warp
        if (tid == consumers) produce(p, m, first, n, tile_rows);
        return;
    }

    // The consumer warpgroups.
    griddep_wait();            // before the epilogue's stores (y, partials, counters)
    griddep_launch_dependents();
    float acc[2][9][4];
    Mma mma(m, tid);
    Iter at = first;
    for (int i = 0; i < n;) {
        const int tile = at.tile, k0 = at.k;
        const int k1 = k0 + (n - i) < k_steps ? k0 + (n - i) : k_steps;
        for (int k = k0; k < k1; ++k, ++i, at.next()) mma.step(acc, k == k0);
        mma.drain();
        finish_segment(p, sh, c, tile, k0, k1, k_steps, iters, acc, tid, i == n, idle);
    }
}

// A bf16 matrix [rows, cols] (rows `stride` elements apart) as boxes of box_cols x box_rows: the
// MMAs' operands 128-byte swizzled (rows and columns past the matrix read as zeros), y plain.
static CUresult encode(CUtensorMap* map, const void* base, int64_t cols, int64_t rows, int64_t stride,
                       uint32_t box_cols, uint32_t box_rows, bool operand) {
    const EncodeTiled fn = encode_tiled();
    if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(stride * 2)};
    const cuuint32_t box[2] = {box_cols, box_rows}, unit[2] = {1, 1};
    return fn(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides, box, unit,
              CU_TENSOR_MAP_INTERLEAVE_NONE, operand ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
              operand ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B : CU_TENSOR_MAP_L2_PROMOTION_NONE,
              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

static bool valid(const Args& a) {
    const auto aligned16 = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
    const Shape sh{static_cast<int>(a.groups), static_cast<int>(a.stages)};
    return a.groups >= 1 && a.groups <= MAX_GROUPS && a.stages >= 3 && a.stages <= 16 && sh.smem() <= MAX_SMEM &&
           a.M >= 1 && a.M <= MAX_ROWS && a.N >= 1 && a.K >= 1 && a.ctas >= 1 && a.ctas <= 65535 &&
           a.x_stride >= a.K && a.w_stride >= a.K && a.y_stride >= a.N && a.x_stride % 8 == 0 &&
           a.w_stride % 8 == 0 && aligned16(a.x) && aligned16(a.w) && aligned16(a.partials) &&
           a.y != nullptr && a.counters != nullptr;
}

// Once per device: the kernel's shared-memory limit raised (the attribute is per device), and
// the CTAs of each shape that can be resident at once (a tile's owner waits for the CTAs of its
// other parts, so the grid may not exceed it), asked of the runtime once, not at every call.
// `resident` stays 0 where the runtime cannot say (the emulator runs blocks one at a time).
static cudaError_t prepare(const Shape& sh, int64_t& resident) {
    static bool done[64] = {false};
    static int64_t fits[64][MAX_GROUPS + 1][17] = {};
    static std::mutex lock;               // ctypes drops the GIL
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    std::lock_guard<std::mutex> guard(lock);
    const bool cached = device >= 0 && device < 64;
    if (!cached || !done[device]) {
        err = cudaFuncSetAttribute(stream_linear_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, MAX_SMEM);
        if (err != cudaSuccess) return err;
        if (cached) done[device] = true;
    }
    resident = cached ? fits[device][sh.groups][sh.stages] : 0;
#ifndef TVA_EMULATE
    if (resident == 0) {
        int sms = 0, per_sm = 0;
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, stream_linear_kernel, sh.threads(), sh.smem());
        resident = static_cast<int64_t>(sms) * per_sm;
        if (cached) fits[device][sh.groups][sh.stages] = resident;
    }
#endif
    return cudaSuccess;
}

}  // namespace tsl

extern "C" {

// Rows the kernel takes at most; workspace floats (partials) a persistent grid of `ctas` needs.
int tsl_max_rows() { return tsl::MAX_ROWS; }
int64_t tsl_partial_floats(int64_t ctas, int64_t groups) { return ctas * tsl::ACC * 128 * groups; }

// y = x W^T. Returns a cudaError_t (0 = success), or minus the driver's CUresult where it refuses
// a tensor map. Asynchronous on `stream`.
int tsl_linear(const tsl::Args* args, void* stream) {
    const tsl::Args& a = *args;
    if (!tsl::valid(a)) return static_cast<int>(cudaErrorInvalidValue);
    const tsl::Shape sh{static_cast<int>(a.groups), static_cast<int>(a.stages)};
    int64_t resident = 0;
    cudaError_t err = tsl::prepare(sh, resident);
    if (err != cudaSuccess) return static_cast<int>(err);
    tsl::Params p;
    p.a = a;
    // Every CTA gets at least one iteration, so every CTA a tile's owner counts on computes a
    // part; and all are resident at once, so the owner's wait for them ends.
    const int64_t iters = ((a.N + sh.tile_rows() - 1) / sh.tile_rows()) * ((a.K + tsl::BK - 1) / tsl::BK);
    if (p.a.ctas > iters) p.a.ctas = iters;
    if (resident > 0 && p.a.ctas > resident) p.a.ctas = resident;
    const uint32_t tile_rows = static_cast<uint32_t>(sh.tile_rows());
    CUresult rc = tsl::encode(&p.map_x, a.x, a.K, a.M, a.x_stride, tsl::BK, tsl::NT, true);
    if (rc == CUDA_SUCCESS) rc = tsl::encode(&p.map_w, a.w, a.K, a.N, a.w_stride, tsl::BK, tile_rows, true);
    // The tensor store needs y 16-byte aligned with rows a multiple of 16 bytes apart; otherwise
    // the threads store y themselves.
    p.y_by_copy = reinterpret_cast<uintptr_t>(a.y) % 16 == 0 && a.y_stride % 8 == 0;
    if (rc == CUDA_SUCCESS && p.y_by_copy) rc = tsl::encode(&p.map_y, a.y, a.N, a.M, a.y_stride, tile_rows, tsl::NT, false);
    if (rc != CUDA_SUCCESS) return -static_cast<int>(rc);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    TSL_LAUNCH(tsl::stream_linear_kernel, dim3(static_cast<unsigned>(p.a.ctas)), dim3(sh.threads()), sh.smem(), s, p);
    return static_cast<int>(launch_status(s));
}

const char* tsl_error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

int tsl_struct_size() { return static_cast<int>(sizeof(tsl::Args)); }

}  // extern "C"
