// Tree-verify attention for speculative decoding (CUDA C++, tensor cores through mma.sync).
//
// One verify forward attends the T = 1 + N tree tokens of each sequence b to
//   - the committed prefix, keys [0, L_b), visible to every tree token, and
//   - the tree itself, keys L_b + j (j < T), visible to query i iff bit j of row i of the
//     ancestor bitmask `tree_bits[b, i, :]` is set.
//
// Design (flash-decoding, bandwidth first):
//   - All G query heads sharing one KV head and all T tree tokens are the M rows of one tile
//     (row r = g * T + t), so every KV byte is read once per KV head (a second row block, when
//     M does not fit one CTA, re-reads it from L2 at the same moment).
//   - The keys [0, L_b + T) are cut into `num_splits` chunks on the device (no host sync): grid
//     (row blocks, splits, b * Hkv). Each CTA streams its chunk through shared memory in tiles of
//     64 keys with cp.async, several stages deep, computes S = Q K^T and O += P V with
//     mma.sync.m16n8k16 (bf16 in, fp32 accumulate), and keeps an fp32 online softmax in the
//     log2 domain. Partials (O normalised by its own l, and lse = m + log2 l) go to a workspace;
//     a second small kernel merges them with a log-sum-exp rescale. With one split the main
//     kernel writes the output itself.
//   - Shared-memory tiles are stored in 16-byte chunks, chunk c of row r at c ^ (r & 7), so
//     cp.async writes and ldmatrix reads are free of bank conflicts.
//   - GQA: head dim 64 or 128, 2, 4 or 8 warps per CTA (16 rows each), contiguous or paged
//     cache (page table [b, max_pages], any page size). MLA latent: one KV head of 576 values
//     for keys (512 latent + 64 rope) whose first 512 are the values; 64 rows per CTA over 8
//     warps, S split by keys across warp pairs, P shared through shared memory, each warp owning
//     64 of the 512 value columns (mla_pv_kernel, both products on wgmma: S on one warpgroup
//     while the other copies, each owning 256 value columns of P V; mla_tma_kernel, impl
//     wgmma_tma: the same with its tiles by tensor copies).
//
// No torch headers: this file is plain CUDA C++ with extern "C" launchers, loaded through ctypes
// (kernels/verify/custom_verify.py) and compiled in CI with nvcc alone. Launchers never synchronise
// and never allocate, so calls can be captured in a CUDA graph.
//
// Tests also compile this file as plain C++ with -DTVA_EMULATE: tests/emulator/cuda_emulation.h
// then stands in for the CUDA builtins and for the PTX helpers below (threads as fibers, the
// warp-wide ldmatrix / mma / shuffle semantics of the PTX ISA, cp.async completing as late as
// the wait_group rules allow), so the kernels' indexing runs on a machine without a GPU.

#ifdef TVA_EMULATE
#include "cuda_emulation.h"
#define TVA_DYNAMIC_SMEM(name) uint8_t* name = emu::shared_memory()
#define TVA_LAUNCH(kernel, grid, block, smem, stream, p) emu::launch(kernel, grid, block, smem, p)
#else
#include <cuda.h>               // CUtensorMap (the tensor copies of gqa_tma_kernel)
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#define TVA_DYNAMIC_SMEM(name) extern __shared__ __align__(128) uint8_t name[]
#define TVA_LAUNCH(kernel, grid, block, smem, stream, p) pdl_launch(kernel, grid, block, smem, stream, p)
#endif
#include <stdint.h>
#include <string.h>

#include "../sm90.cuh"          // PDL launches, mbarriers, tensor copies, wgmma bookkeeping
#include "../trace.cuh"         // per-CTA timestamps (-DTVA_TRACE builds only)

#include <mutex>
#include <type_traits>

namespace tva {

// First thing in every kernel of this file: wait until the kernel before it on the stream has
// finished and its writes are visible (a no-op unless launched with PDL), then let the next
// kernel launch early.
__device__ __forceinline__ void wait_for_previous_kernel() {
    griddep_wait();
    griddep_launch_dependents();
}

// Kernel ids and stamps of a trace build (kernels/trace.cuh; kernels/verify/anatomy.py reads
// them): 0 start, 1 past the wait for the kernel before, 2 the prologue's first tiles landed,
// 3 the first tile's softmax done (the loop starts), 4 the loop done, 5 the end.
enum TraceKernel : uint32_t { TRACE_PIPELINED = 1, TRACE_COMBINE = 2 };
enum TraceStamp : int { STAMP_WAITED = 1, STAMP_LANDED = 2, STAMP_FIRST_TILE = 3, STAMP_LOOP = 4, STAMP_END = 5 };

// ------------------------------------------------------------------------------------------
// Parameters (mirrored by ctypes structures in custom_verify.py: every field 8 bytes wide)
// ------------------------------------------------------------------------------------------

struct AttnParams {
    const void* q;            // bf16 [b, Hq, T, Dk], last dim contiguous
    const void* k;            // bf16 keys: contiguous [b, Hkv, S, Dk] or pages [P, Hkv, ps, Dk]
    const void* v;            // bf16 values, same layout as k (MLA: ignored, values = k[..., :Dv])
    void* out;                // bf16 [b, Hq, T, Dv]
    const void* lengths;      // [b] int32 or int64
    const int32_t* tree_bits; // [b, T, W] int32
    const int32_t* page_table;// [b, max_pages] int32 (paged layout only)
    float* ws_o;              // [splits, b, Hq, T, Dv] fp32 (splits > 1 only)
    float* ws_lse;            // [splits, b, Hq, T] fp32, log2 domain
    int64_t lengths_int64;    // 1: lengths are int64
    int64_t batch, heads_q, heads_kv, tokens, num_splits, page_size;
    int64_t q_sb, q_sh, q_st;           // strides in elements
    int64_t k_sb, k_sh, k_st;           // contiguous: batch, head, token; paged: page, head, slot
    int64_t v_sb, v_sh, v_st;
    int64_t o_sb, o_sh, o_st;
    int64_t bits_sb, bits_st;
    int64_t pt_sb;
    double sm_scale;
    int64_t kv_rows;          // contiguous: the cache's rows per (b, head) (the tensor copies' extent)
};

constexpr int BN = 64;               // keys per tile
constexpr float LOG2E = 1.4426950408889634f;

// ------------------------------------------------------------------------------------------
// PTX helpers (the emulation header defines the same functions for TVA_EMULATE builds)
// ------------------------------------------------------------------------------------------

#ifndef TVA_EMULATE
// 16-byte global -> shared copy; `valid` false writes zeros and reads nothing.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

__device__ __forceinline__ void ldsm_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, uint32_t a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a) : "memory");
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, uint32_t a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a) : "memory");
}

// D += A B, A 16x16 bf16 (row), B 16x8 bf16 (col), D 16x8 fp32.
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ void st_shared_b32(uint32_t a, uint32_t v) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a), "r"(v) : "memory");
}

// Hopper warpgroup MMA (sm_90a only, TVA_WGMMA from sm90.cuh; elsewhere these trap and are
// never launched: the Python side selects impl "wgmma" only on compute capability 9.0 with a
// 9.0a build).

// d[64 x 64] (+)= A[64 x 16] x B[16 x 64], bf16 -> fp32, issued by the 4 warps of a warpgroup.
// A in registers: warp w of the group holds rows 16w..16w+15 in the mma.m16n8k16 A layout.
// B through a shared-memory descriptor. d: per warp the mma C layout of 8 n-tiles of 8.
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc,
                                                int accumulate) {
#ifdef TVA_WGMMA
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
          "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
          "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
          "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate));
#else
    __trap();
#endif
}

// d[64 x 32] (+)= A[64 x 16] x B[16 x 32], both operands through shared-memory descriptors.
__device__ __forceinline__ void wgmma_m64n32k16_ss(float (&d)[4][4], uint64_t desc_a, uint64_t desc_b,
                                                   int accumulate) {
#ifdef TVA_WGMMA
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "%16, %17, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
          "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
#else
    __trap();
#endif
}

// d[64 x 64] (+)= A[64 x 16] x B[16 x 64], both operands through shared-memory descriptors.
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b,
                                                   int accumulate) {
#ifdef TVA_WGMMA
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
#else
    __trap();
#endif
}

// d[64 x N] += A[64 x 16] x B[16 x N] with B N-major (imm-trans-b 1): the P V product, P from
// registers (the mma.m16n8k16 A layout per warp, as for S) and V through an MN-major descriptor.
__device__ __forceinline__ void wgmma_m64n128k16_tb(float (&d)[16][4], const uint32_t (&a)[4], uint64_t desc) {
#ifdef TVA_WGMMA
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(1));
#else
    __trap();
#endif
}

// d[64 x 256] += A[64 x 16] x B[16 x 256], A K-major and B MN-major (imm-trans-b 1), both through
// shared-memory descriptors: the MLA kernel's P V (P from shared memory, V the latent tile's
// first 512 columns, one half a warpgroup).
__device__ __forceinline__ void wgmma_m64n256k16_ss_tb(float (&d)[32][4], uint64_t desc_a, uint64_t desc_b) {
#ifdef TVA_WGMMA
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "%128, %129, p, 1, 1, 0, 1;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]), "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]), "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]), "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]), "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]), "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]), "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]), "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]), "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]), "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3])
        : "l"(desc_a), "l"(desc_b), "n"(1));
#else
    __trap();
#endif
}

// d[64 x 8] (+)= A[64 x 16] x B[16 x 8], both operands K-major through shared-memory descriptors:
// the tail row's S^T = K_tile Q_tail^T (A the K tile itself, B the tail's Q rows).
__device__ __forceinline__ void wgmma_m64n8k16_ss(float (&d)[1][4], uint64_t desc_a, uint64_t desc_b, int accumulate) {
#ifdef TVA_WGMMA
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
#else
    __trap();
#endif
}

// d[64 x 8] += A[64 x 16] x B[16 x 8] with A MN-major (imm-trans-a 1), both through shared-memory
// descriptors: the tail row's O^T += V_tile^T P^T (A the V tile as it is stored, B P^T).
__device__ __forceinline__ void wgmma_m64n8k16_ss_ta(float (&d)[1][4], uint64_t desc_a, uint64_t desc_b) {
#ifdef TVA_WGMMA
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 1, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3])
        : "l"(desc_a), "l"(desc_b), "n"(1));
#else
    __trap();
#endif
}

#endif  // TVA_EMULATE

// The MN-major twin of sm90.cuh's desc_kmajor_sw128 for an operand (B of P V: V tiles stored
// as K tiles are, 64-column blocks of 128-byte rows, one row per key): the leading byte offset
// is the stride between 64-column blocks along N (BN rows x 128 bytes), the stride byte offset
// the stride between groups of 8 rows along K (1024 bytes).
__host__ __device__ __forceinline__ uint64_t desc_mnmajor_sw128(uint32_t smem_byte_addr) {
    return static_cast<uint64_t>((smem_byte_addr & 0x3FFFF) >> 4) |
           (static_cast<uint64_t>((BN * 128) >> 4) << 16) | (static_cast<uint64_t>(1024 >> 4) << 32) |
           (static_cast<uint64_t>(1) << 62);
}

// The descriptor of `d`'s operand `bytes` further on (a multiple of 16): only the start-address
// field moves, and it cannot carry out of its 14 bits below 256 KB of shared memory, so one
// 32-bit add replaces building the descriptor again (ptxas spent five dependent uniform
// instructions per wgmma on that, in front of every S and P V product of the pipelined loop).
__host__ __device__ __forceinline__ uint64_t desc_advance(uint64_t d, uint32_t bytes) {
    return (d & 0xFFFFFFFF00000000ull) | static_cast<uint32_t>(static_cast<uint32_t>(d) + (bytes >> 4));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);   // .x (low 16 bits) = lo
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
}

// An empty asm that "reads and writes" r (CUTLASS's warpgroup_fence_operand). A wgmma reads
// and writes its register operands asynchronously, until the wait_group that retires it, but to
// the compiler the wait is an asm that touches no registers: placed right after the wait, this
// pins r there, so no read of an accumulator moves above the wait and no other value takes an
// operand's registers early. Without it ptxas finds such a move and serialises every wgmma of
// the kernel (advisory C7513).
template <int N, int K>
__device__ __forceinline__ void keep_live(float (&r)[N][K]) {
#ifndef TVA_EMULATE
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int j = 0; j < K; ++j) asm volatile("" : "+f"(r[i][j])::"memory");
#endif
}

// Byte offset of 16-byte chunk `c` of row `r` in a swizzled tile with CH chunks per row.
template <int CH>
__device__ __forceinline__ uint32_t swz(int r, int c) {
    return static_cast<uint32_t>((r * CH + (c ^ (r & 7))) * 16);
}

__device__ __forceinline__ int read_length(const AttnParams& p, int b) {
    return p.lengths_int64 ? static_cast<int>(static_cast<const int64_t*>(p.lengths)[b])
                           : static_cast<const int32_t*>(p.lengths)[b];
}

// Keys [k_begin, k_end) of this split: chunks of ceil(n / splits) keys rounded up to whole tiles.
struct SplitRange {
    int begin, end, tiles;
};
__device__ __forceinline__ SplitRange split_range(int n_keys, int splits, int split) {
    int chunk = (n_keys + splits - 1) / splits;
    chunk = (chunk + BN - 1) / BN * BN;
    SplitRange s;
    s.begin = split * chunk;
    s.end = min(n_keys, s.begin + chunk);
    s.tiles = s.end > s.begin ? (s.end - s.begin + BN - 1) / BN : 0;
    return s;
}

// n / d and n % d for a divisor fixed per launch (the page size), n < 2^31, by a multiply-high
// (the round-up method, as torch's IntDivider): a 32-bit division is a ~20-instruction
// sequence on the GPU, and the paged copies did one per row of every tile.
struct IntDiv {
    uint32_t d, magic, shift;
    __device__ __forceinline__ explicit IntDiv(uint32_t divisor) : d(divisor), magic(0), shift(0) {
        while ((1u << shift) < d) ++shift;
        magic = static_cast<uint32_t>(((uint64_t(1) << 32) * ((uint64_t(1) << shift) - d)) / d + 1);
    }
    __device__ __forceinline__ uint32_t div(uint32_t n) const {
        return (static_cast<uint32_t>((static_cast<uint64_t>(n) * magic) >> 32) + n) >> shift;
    }
    __device__ __forceinline__ uint32_t mod(uint32_t n) const { return n - div(n) * d; }
};

// The page of each of this thread's rows of a tile (rows lrow0, lrow0 + RS, ...; past the split's
// end, the split's first key's page), read from the page table ahead of the copies they feed.
template <int RS>
__device__ __forceinline__ void fetch_tile_pages(const AttnParams& p, const IntDiv& page_size, int b, const SplitRange& sr,
                                                 int tile, int lrow0, int32_t (&pages)[BN / RS]) {
    const int kb = sr.begin + tile * BN;
#pragma unroll
    for (int i = 0; i < BN / RS; ++i) {
        const int key = kb + lrow0 + i * RS, kk = key < sr.end ? key : sr.begin;
        pages[i] = __ldg(p.page_table + b * p.pt_sb + page_size.div(kk));
    }
}

// Element offset (without the head term) of key `key` of sequence b.
template <bool PAGED>
__device__ __forceinline__ int64_t key_offset(const AttnParams& p, int b, int key, int64_t sb, int64_t st) {
    if constexpr (PAGED) {
        const int page = __ldg(p.page_table + b * p.pt_sb + key / p.page_size);
        return static_cast<int64_t>(page) * sb + static_cast<int64_t>(key % p.page_size) * st;
    } else {
        return static_cast<int64_t>(b) * sb + static_cast<int64_t>(key) * st;
    }
}

// Max or sum over one row half of a score tile in the mma C layout (fragments (nt, 2 hf) and
// (nt, 2 hf + 1): this thread's 2 NT8 scores of row hf) as a balanced tree: a running fmaxf or
// add over them is 2 NT8 dependent instructions, the tree log2(2 NT8) deep. ncu on the H200 found
// the pipelined kernel's warps stalled mostly on fixed-latency dependencies (kernels/NOTES.md).
template <int NT8, typename Op>
__device__ __forceinline__ float row_reduce(const float (&x)[NT8][4], int hf, Op op) {
    static_assert((NT8 & (NT8 - 1)) == 0, "a power of two");
    float v[NT8];
#pragma unroll
    for (int nt = 0; nt < NT8; ++nt) v[nt] = op(x[nt][2 * hf], x[nt][2 * hf + 1]);
#pragma unroll
    for (int w = NT8 / 2; w > 0; w /= 2)
#pragma unroll
        for (int i = 0; i < w; ++i) v[i] = op(v[i], v[i + w]);
    return v[0];
}

template <int NT8>
__device__ __forceinline__ float row_max(const float (&x)[NT8][4], int hf) {
    return row_reduce(x, hf, [](float a, float b) { return fmaxf(a, b); });
}

template <int NT8>
__device__ __forceinline__ float row_sum(const float (&x)[NT8][4], int hf) {
    return row_reduce(x, hf, [](float a, float b) { return a + b; });
}

// The max to subtract before an exp2: 0 while nothing is visible (-inf - -inf would be NaN).
__device__ __forceinline__ float max_ref(float m) { return m == -INFINITY ? 0.f : m; }

// The pipelined kernel's lazy rescale: the reference max of a row moves only once a tile's max
// exceeds it by more than this (log2 units), so P stays <= 2^8 (bf16 and the fp32 sums hold it
// with room to spare) and most tiles skip rescaling O.
constexpr float RESCALE_LOG2 = 8.f;

// May a query whose tree-mask row is `bits_row` see key `key` (of this split, which ends at k_end)?
__device__ __forceinline__ bool key_visible(const int32_t* bits_row, int key, int L, int k_end) {
    if (key < L) return true;
    if (key >= k_end) return false;
    const int j = key - L;
    return (__ldg(bits_row + (j >> 5)) >> (j & 31)) & 1;
}

// A row's sum over the four lanes (tig 0-3) that hold its columns in the mma C layout.
__device__ __forceinline__ float quad_sum(float l) {
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    return l + __shfl_xor_sync(0xffffffffu, l, 2);
}

// A row's log2-sum-exp from its reference max and sum (-inf where it saw nothing): what a split
// leaves for the merge of splits.
__device__ __forceinline__ float row_lse(float m, float l) { return l > 0.f ? m + __log2f(l) : -INFINITY; }

// Epilogue of a GQA CTA: normalise this thread's two rows (r0, r0 + 8: the mma C layout) and
// write the output (one split) or the partial and its log2-sum-exp. l is still per thread.
template <int D>
__device__ __forceinline__ void write_rows(const AttnParams& p, const float (&o)[D / 8][4], const float (&m_run)[2],
                                           const float (&l_run)[2], int r0, int b, int h, int split, int tig) {
    const int T = p.tokens, G = p.heads_q / p.heads_kv, M = G * T;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        const float l = quad_sum(l_run[hf]);
        const int r = r0 + 8 * hf;
        if (r >= M) continue;
        const int g = r / T, t = r % T, hq = h * G + g;
        const float inv = l > 0.f ? 1.f / l : 0.f;
        if (p.num_splits == 1) {
            __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out) + b * p.o_sb + hq * p.o_sh + t * p.o_st;
#pragma unroll
            for (int dt = 0; dt < D / 8; ++dt)
                *reinterpret_cast<uint32_t*>(out + dt * 8 + 2 * tig) =
                    pack_bf16(o[dt][2 * hf] * inv, o[dt][2 * hf + 1] * inv);
        } else {
            const int64_t row = ((static_cast<int64_t>(split) * p.batch + b) * p.heads_q + hq) * T + t;
            float* wo = p.ws_o + row * D;
#pragma unroll
            for (int dt = 0; dt < D / 8; ++dt)
                *reinterpret_cast<float2*>(wo + dt * 8 + 2 * tig) = make_float2(o[dt][2 * hf] * inv, o[dt][2 * hf + 1] * inv);
            if (tig == 0) p.ws_lse[row] = row_lse(m_run[hf], l);
        }
    }
}

// Rows of the tree-verify mask for this thread's two rows r0 and r0 + 8 (the mma C layout); row
// r of a KV head's M = G T rows is tree token r % T (rows past M: token 0, never written).
__device__ __forceinline__ void tree_mask_rows(const AttnParams& p, int b, int r0, int M, const int32_t* (&rows)[2]) {
    const int T = static_cast<int>(p.tokens);
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        const int r = r0 + 8 * hf;
        const int t = r < M ? r % T : 0;
        rows[hf] = p.tree_bits + b * p.bits_sb + t * p.bits_st;
    }
}

// Which of the NK (<= 64) keys kb .. kb + NK - 1 a query whose tree-mask row is `bits_row` may
// see, as bit i for key kb + i: key_visible's answer for the whole tile at once. The prefix keys
// (before L) are all visible, the keys from k_end none, and the tree's keys between come from the
// row's bitmask a word at a time, at most three loads. (key_visible a score at a time loaded a
// word and spent ~10 instructions on each of a thread's 32 scores: on a split's last tiles the
// session-33 trace found those two tiles ~2 µs slower each than a tile with nothing masked, which
// made the last split the call's slowest CTAs.)
template <int NK>
__device__ __forceinline__ uint64_t visible_keys(const int32_t* bits_row, int kb, int L, int k_end) {
    static_assert(NK <= 64, "a tile's keys in one 64-bit mask");
    const int j0 = kb - L;                              // the tile's first key's tree index
    const int first = j0 > 0 ? j0 : 0;                  // the tile's tree keys: indices [first, last)
    const int last = (kb + NK < k_end ? kb + NK : k_end) - L;
    uint64_t m = j0 < 0 ? (j0 <= -64 ? ~0ull : (1ull << -j0) - 1) : 0ull;
    if (last > first) {
        // The row's mask from tree index `first` on (the 96 bits from word w, shifted), cut at `last`.
        const int w = first >> 5, sh = first & 31;
        uint64_t v = static_cast<uint32_t>(__ldg(bits_row + w));
        if (32 * (w + 1) < last) v |= static_cast<uint64_t>(static_cast<uint32_t>(__ldg(bits_row + w + 1))) << 32;
        v >>= sh;
        if (sh && 32 * (w + 2) < last) v |= static_cast<uint64_t>(static_cast<uint32_t>(__ldg(bits_row + w + 2))) << (64 - sh);
        const int n = last - first;
        if (n < 64) v &= (1ull << n) - 1;
        m |= v << (first - j0);
    }
    return m;
}

// -inf where a score of a tile of NK keys from kb is not visible to its row: fragment (nt, e) is
// key kb + 8 nt + 2 tig + (e & 1) of row e >> 1 (the mma C layout). Only a tile that reaches the
// tree part or the split's end (kb + NK > L) has any.
template <int NK, int NT8>
__device__ __forceinline__ void mask_tile(float (&s)[NT8][4], int kb, int L, int k_end, const int32_t* const (&rows)[2],
                                          int tig) {
    static_assert(NT8 * 8 == NK, "a fragment per 8 keys");
    if (kb + NK <= L) return;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        const uint64_t vis = visible_keys<NK>(rows[hf], kb, L, k_end) >> (2 * tig);
#pragma unroll
        for (int nt = 0; nt < NT8; ++nt)
#pragma unroll
            for (int j = 0; j < 2; ++j)
                if (!((vis >> (8 * nt + j)) & 1u)) s[nt][2 * hf + j] = -INFINITY;
    }
}

// mask_tile a key at a time (key_visible for each score), for the mma.sync kernel (gqa_kernel):
// its 2-warp paged instance at head dim 128 has no registers left for visible_keys' mask (8
// bytes of spill), and it is not the kernel the loop runs.
template <int NK, int NT8>
__device__ __forceinline__ void mask_tile_by_key(float (&s)[NT8][4], int kb, int L, int k_end,
                                                 const int32_t* const (&rows)[2], int tig) {
    if (kb + NK <= L) return;
#pragma unroll
    for (int nt = 0; nt < NT8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int key = kb + nt * 8 + 2 * tig + (e & 1);
            if (!key_visible(rows[e >> 1], key, L, k_end)) s[nt][e] = -INFINITY;
        }
}

// The first half of the pipelined kernels' softmax: x = S with the mask applied (S itself stays
// untouched: it is a wgmma accumulator, and ordinary writes to one make ptxas serialise every
// wgmma of the kernel, C7513) and each of this thread's two rows' tile maximum, scaled to log2
// units (scale > 0, so the max commutes with it; -inf where the tile shows the row nothing).
template <int NK>
__device__ __forceinline__ void masked_tile_max(const float (&s)[NK / 8][4], int kb, int L, int k_end,
                                                const int32_t* const (&rows)[2], int tig, float scale,
                                                float (&x)[NK / 8][4], float (&m_tile)[2]) {
#pragma unroll
    for (int nt = 0; nt < NK / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) x[nt][e] = s[nt][e];
    mask_tile<NK>(x, kb, L, k_end, rows, tig);
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        float mx = row_max(x, hf);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        m_tile[hf] = mx * scale;
    }
}

// The pipelined kernels' softmax of one tile's S (raw scores; the scale is folded into the
// exponent): P = 2^(S scale - m) in fp32 into x, and the running sum l. The reference max m
// moves lazily (FlashAttention-4's rescale threshold): only when some row of the warp sees a tile
// max above m + RESCALE_LOG2 does the warp move every row's m to its true running max and return
// `true`, with `alpha` the factor O must be rescaled by; otherwise m stays, P <= 2^RESCALE_LOG2,
// and O needs no rescale (its 64 multiplies a tile are skipped). Exact either way: O and l share
// the reference max, and the final lse is m + log2(l). Max and sum are balanced trees (row_max,
// row_sum), not 16-deep dependent chains. The caller packs P to bf16 (pack_p) into the A
// registers P_j V_j is not reading: packed into the ones it reads, ptxas serialises every wgmma
// of the kernel (C7513).
template <int NK>
__device__ __forceinline__ bool online_softmax(const float (&s)[NK / 8][4], int kb, int L, int k_end,
                                               const int32_t* const (&bits_row)[2], int tig, float scale,
                                               float (&m_run)[2], float (&l_run)[2], float (&x)[NK / 8][4],
                                               float (&alpha)[2]) {
    float m_tile[2];        // the tree part and the keys past this split masked
    masked_tile_max<NK>(s, kb, L, k_end, bits_row, tig, scale, x, m_tile);
    const bool rescale = __any_sync(0xffffffffu, m_tile[0] > m_run[0] + RESCALE_LOG2 ||
                                                 m_tile[1] > m_run[1] + RESCALE_LOG2);
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        alpha[hf] = 1.f;
        if (rescale) {
            const float m_new = fmaxf(m_run[hf], m_tile[hf]);
            alpha[hf] = fast_exp2(m_run[hf] - max_ref(m_new));
            m_run[hf] = m_new;
        }
        const float m_use = max_ref(m_run[hf]);
#pragma unroll
        for (int nt = 0; nt < NK / 8; ++nt) {
            x[nt][2 * hf] = fast_exp2(fmaf(x[nt][2 * hf], scale, -m_use));
            x[nt][2 * hf + 1] = fast_exp2(fmaf(x[nt][2 * hf + 1], scale, -m_use));
        }
        l_run[hf] = l_run[hf] * alpha[hf] + row_sum(x, hf);
    }
    return rescale;
}

// The sum-checked softmax (`custom_impl: wgmma_sumcheck`): online_softmax's results, bit for bit,
// without its tile max on most tiles. The max tree and its two shuffles are ~40 of the ~360
// instructions a warp issues a tile, all on the chain between S and P (ncu: the kernel issues an
// instruction a warp every ~5 cycles, most of it fixed-latency waits). So P is first computed
// against the reference max as it stands, and each row's partial sums decide: a sum of
// non-negative terms bounds each of them, so sums <= 2^(RESCALE_LOG2 - 1) in every lane mean no
// score passed m + RESCALE_LOG2 - 1, online_softmax would not have moved m, and its P and sums are
// these. Otherwise (a sum past the bound, an inf or NaN among the terms, or a row that has seen
// nothing yet: m is -inf there, and P against 0 may underflow to zeros) online_softmax runs from
// S as it would have. Random and real scores leave the sums far below the bound once a split's
// first tile has set m (kernels/NOTES.md), so the exact path runs on few tiles.
constexpr float SUMCHECK_BOUND = static_cast<float>(1 << (static_cast<int>(RESCALE_LOG2) - 1));

template <int NK>
__device__ __forceinline__ bool sumchecked_softmax(const float (&s)[NK / 8][4], int kb, int L, int k_end,
                                                   const int32_t* const (&bits_row)[2], int tig, float scale,
                                                   float (&m_run)[2], float (&l_run)[2], float (&x)[NK / 8][4],
                                                   float (&alpha)[2]) {
    // P from S itself where the tile has no masked key (most tiles): a masked copy of S, live
    // beside S (which the exact path reads again), would cost a move a score.
    const auto exps = [&](const float (&from)[NK / 8][4]) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            const float m_use = max_ref(m_run[hf]);
#pragma unroll
            for (int nt = 0; nt < NK / 8; ++nt) {
                x[nt][2 * hf] = fast_exp2(fmaf(from[nt][2 * hf], scale, -m_use));
                x[nt][2 * hf + 1] = fast_exp2(fmaf(from[nt][2 * hf + 1], scale, -m_use));
            }
        }
    };
    if (kb + NK <= L) {
        exps(s);
    } else {
        float masked[NK / 8][4];
#pragma unroll
        for (int nt = 0; nt < NK / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) masked[nt][e] = s[nt][e];
        mask_tile<NK>(masked, kb, L, k_end, bits_row, tig);
        exps(masked);
    }
    const float sum[2] = {row_sum(x, 0), row_sum(x, 1)};
    // `<=` is false for NaN: a NaN term sends the tile to the exact path too.
    const bool within = sum[0] <= SUMCHECK_BOUND && sum[1] <= SUMCHECK_BOUND && m_run[0] != -INFINITY &&
                        m_run[1] != -INFINITY;
    if (__any_sync(0xffffffffu, !within))
        return online_softmax<NK>(s, kb, L, k_end, bits_row, tig, scale, m_run, l_run, x, alpha);
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        alpha[hf] = 1.f;
        l_run[hf] = l_run[hf] * alpha[hf] + sum[hf];    // online_softmax's update at alpha 1
    }
    return false;
}

// O's two rows of this thread (the C layout) times their factors.
template <int D>
__device__ __forceinline__ void rescale_rows(float (&o)[D / 8][4], const float (&alpha)[2]) {
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
        o[dt][0] *= alpha[0];
        o[dt][1] *= alpha[0];
        o[dt][2] *= alpha[1];
        o[dt][3] *= alpha[1];
    }
}

// P (fp32, the C layout of S) as bf16 A fragments of P V, one per 16 keys.
template <int NK>
__device__ __forceinline__ void pack_p(const float (&x)[NK / 8][4], uint32_t (&pk)[NK / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < NK / 16; ++kk) {
        pk[kk][0] = pack_bf16(x[2 * kk][0], x[2 * kk][1]);
        pk[kk][1] = pack_bf16(x[2 * kk][2], x[2 * kk][3]);
        pk[kk][2] = pack_bf16(x[2 * kk + 1][0], x[2 * kk + 1][1]);
        pk[kk][3] = pack_bf16(x[2 * kk + 1][2], x[2 * kk + 1][3]);
    }
}

// The pipelined loop's work under P_tile V_tile once S_{tile+1} has retired: its softmax (the
// kernel's `softmax(s, tile, x, alpha)`), O rescaled only when the reference max moved (rarely,
// with the lazy rescale), and only then a wait for P_tile V_tile: otherwise that product keeps
// running under the softmax, the packing of P_{tile+1} into the other registers and the next
// tile's waits, and P_{tile+1} V_{tile+1} accumulates behind it. (An unconditional wait_group 0
// is scheduled by ptxas first thing after the wait_group 1, ahead of the softmax it was meant to
// overlap: SASS of an earlier kernel.)
template <int D, int NK, typename Softmax>
__device__ __forceinline__ void softmax_rescale_pack(const float (&s)[NK / 8][4], int tile, Softmax& softmax,
                                                     float (&o)[D / 8][4], uint32_t (&pk)[NK / 16][4]) {
    float x[NK / 8][4], alpha[2];
    const bool rescale = softmax(s, tile, x, alpha);
    if (rescale) {            // warp-uniform
        wgmma_wait<0>();
        keep_live(o);
        rescale_rows<D>(o, alpha);
    }
    pack_p<NK>(x, pk);
}

// Tiles 0 .. n - 1 through `step(tile, P)`, two a loop iteration so that the two register sets
// of P (P_j V_j reads one while P_{j+1} is packed into the other) alternate by a compile-time
// index: a runtime index would put them in local memory.
template <typename Step>
__device__ __forceinline__ void run_tiles(int n, Step&& step) {
    int tile = 0;
    for (; tile + 1 < n; tile += 2) {
        step(tile, std::integral_constant<int, 0>{});
        step(tile + 1, std::integral_constant<int, 1>{});
    }
    if (tile < n) step(tile, std::integral_constant<int, 0>{});
}

// The Q rows of row block `mblock` (BM rows of CH 16-byte chunks, zeros past M) into a swizzled
// tile at sQ: row r is (g, t) = (r / T, r % T), query head h G + g of the KV head at qbase.
template <int BM, int CH, int NT>
__device__ __forceinline__ void copy_q_tile(const AttnParams& p, uint32_t sQ, const char* qbase, int tid, int mblock, int M) {
    const int T = static_cast<int>(p.tokens);
#pragma unroll
    for (int i = 0; i < BM * CH / NT; ++i) {
        const int idx = tid + i * NT, row = idx / CH, c = idx % CH;
        const int r = mblock * BM + row;
        const bool ok = r < M;
        const int g = ok ? r / T : 0, t = ok ? r % T : 0;
        cp_async16(sQ + swz<CH>(row, c), qbase + (g * p.q_sh + t * p.q_st) * 2 + c * 16, ok);
    }
}

// This warp's 16 rows of the Q tile as mma.m16n8k16 A fragments, one per 16 dims (wgmma takes
// the same layout for an A operand in registers).
template <int D>
__device__ __forceinline__ void load_q_fragments(uint32_t (&qa)[D / 16][4], uint32_t sQ, int warp, int lane) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const int row = warp * 16 + (lane & 15), c = 2 * kk + (lane >> 4);
        ldsm_x4(qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], sQ + swz<D / 8>(row, c));
    }
}

// ------------------------------------------------------------------------------------------
// GQA kernel
// ------------------------------------------------------------------------------------------

// Zeros in rows `from` .. ROWS - 1 of a tile stored as 64-column blocks of 128-byte rows: every
// 16-byte chunk of those rows, wherever the swizzle put it within its row.
template <int ROWS, int CH, int NT>
__device__ __forceinline__ void zero_rows(uint32_t tile, int from, int tid) {
    for (int i = tid; i < (ROWS - from) * CH; i += NT) {
        const int row = from + i / CH, c = i % CH;
        const uint32_t a = tile + (c >> 3) * (ROWS * 128) + row * 128 + ((c & 7) << 4);
#pragma unroll
        for (int w = 0; w < 4; ++w) st_shared_b32(a + 4 * w, 0u);
    }
}

template <int D>
struct GqaConfig {
    static constexpr int CH = D / 8;                       // 16-byte chunks per row
    static constexpr int STAGES = 3;
    static constexpr int TILE_BYTES = BN * D * 2;
};

// WG: S = Q K^T with wgmma (K tiles stored as 64-column blocks, 1024-byte aligned: +1 KB slack).
template <int D, int NW, bool WG>
constexpr int gqa_smem_bytes() {
    return 16 * NW * D * 2 + GqaConfig<D>::STAGES * 2 * GqaConfig<D>::TILE_BYTES + (WG ? 1024 : 0);
}

template <int D, int NW, bool PAGED, bool WG>
__global__ void __launch_bounds__(NW * 32, 1)
gqa_kernel(const AttnParams p) {
    wait_for_previous_kernel();
    constexpr int BM = 16 * NW, CH = D / 8, NT = NW * 32, STAGES = GqaConfig<D>::STAGES;
    constexpr int TILE = GqaConfig<D>::TILE_BYTES;
    static_assert(!WG || NW % 4 == 0, "wgmma needs whole warpgroups");
    TVA_DYNAMIC_SMEM(smem);
    // K stages first, 1024-byte aligned for the wgmma swizzle; then V, then Q.
    const uint32_t sK = WG ? (smem_addr(smem) + 1023u) & ~1023u : smem_addr(smem);
    const uint32_t sV = sK + STAGES * TILE;
    const uint32_t sQ = sV + STAGES * TILE;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int mblock = blockIdx.x, split = blockIdx.y;
    const int b = blockIdx.z / p.heads_kv, h = blockIdx.z % p.heads_kv;
    const int T = p.tokens, G = p.heads_q / p.heads_kv, M = G * T;
    const int L = read_length(p, b);
    const SplitRange sr = split_range(L + T, p.num_splits, split);

    // Rows of the K/V cache of (b, h); per key: + key * stride (contiguous) or through the page table.
    const char* kbase = static_cast<const char*>(p.k) + h * p.k_sh * 2 + (PAGED ? 0 : b * p.k_sb * 2);
    const char* vbase = static_cast<const char*>(p.v) + h * p.v_sh * 2 + (PAGED ? 0 : b * p.v_sb * 2);

    // Q rows of this block: row r -> (g, t) = (r / T, r % T), query head h * G + g.
    const char* qbase = static_cast<const char*>(p.q) + (b * p.q_sb + static_cast<int64_t>(h) * G * p.q_sh) * 2;
    copy_q_tile<BM, CH, NT>(p, sQ, qbase, tid, mblock, M);

    // Each thread copies one 16-byte column `lc` of rows lrow0, lrow0 + RS, ... of every tile.
    constexpr int RS = NT / CH;
    static_assert(NT % CH == 0 && BN % RS == 0, "tile copy layout");
    const int lc = tid % CH, lrow0 = tid / CH;
    // Paged: the page of each of this thread's rows, read one tile ahead. Read at the copy, the
    // page-table load stalled the warp before every cp.async it feeds (paged 16 took 1.36x the
    // contiguous time at T 16, 65536 keys on the H200); a tile ahead, its latency hides under
    // a whole tile of work.
    int32_t pages[BN / RS];
    const IntDiv page_size(static_cast<uint32_t>(p.page_size));
    auto fetch_pages = [&](int tile) {
        if constexpr (PAGED) fetch_tile_pages<RS>(p, page_size, b, sr, tile, lrow0, pages);
    };
    fetch_pages(0);
    auto load_tile = [&](int tile, int stage) {
        const int kb = sr.begin + tile * BN;
#pragma unroll
        for (int i = 0; i < BN / RS; ++i) {
            const int row = lrow0 + i * RS, key = kb + row;
            const bool ok = key < sr.end;
            int64_t ko, vo;
            if constexpr (PAGED) {
                const int kk = ok ? key : sr.begin;
                const int64_t page = pages[i];          // fetched for this tile (tiles load in order)
                const int64_t slot = page_size.mod(kk);
                ko = page * p.k_sb + slot * p.k_st;
                vo = page * p.v_sb + slot * p.v_st;
            } else {
                ko = static_cast<int64_t>(ok ? key : sr.begin) * p.k_st;
                vo = static_cast<int64_t>(ok ? key : sr.begin) * p.v_st;
            }
            const uint32_t dst = stage * TILE + swz<CH>(row, lc);
            // wgmma reads K as 64-column blocks of 128-byte rows: block lc / 8, chunk lc % 8.
            const uint32_t kdst = WG ? stage * TILE + (lc >> 3) * (BN * 128) + row * 128 + (((lc & 7) ^ (row & 7)) << 4)
                                     : dst;
            cp_async16(sK + kdst, kbase + ko * 2 + lc * 16, ok);
            cp_async16(sV + dst, vbase + vo * 2 + lc * 16, ok);
        }
        fetch_pages(tile + 1);
    };

    // Prologue: Q and the first STAGES-1 tiles (one commit group per tile; Q joins tile 0's).
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < sr.tiles) load_tile(s, s);
        cp_async_commit();
    }
    cp_async_wait<STAGES - 2>();
    if (WG) fence_proxy_async();
    __syncthreads();

    uint32_t qa[D / 16][4];
    load_q_fragments<D>(qa, sQ, warp, lane);

    const float scale = static_cast<float>(p.sm_scale) * LOG2E;
    const int gid = lane >> 2, tig = lane & 3;
    const int r0 = mblock * BM + warp * 16 + gid;          // this thread's rows: r0, r0 + 8
    const int32_t* bits_row[2];
    tree_mask_rows(p, b, r0, M, bits_row);

    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

    for (int tile = 0; tile < sr.tiles; ++tile) {
        if (tile > 0) {
            cp_async_wait<STAGES - 2>();
            if (WG) fence_proxy_async();
            __syncthreads();      // tile `tile` landed; everyone is done with tile - 1's stage
        }
        if (tile + STAGES - 1 < sr.tiles) load_tile(tile + STAGES - 1, (tile + STAGES - 1) % STAGES);
        cp_async_commit();

        const int stage = tile % STAGES;
        const uint32_t k_s = sK + stage * TILE, v_s = sV + stage * TILE;

        // S = Q K^T: 16 rows x 64 keys per warp.
        float s[BN / 8][4];
#pragma unroll
        for (int i = 0; i < BN / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
        if constexpr (WG) {        // one wgmma per 16 dims for the warpgroup's 64 rows
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk)
                wgmma_m64n64k16(s, qa[kk], desc_kmajor_sw128(k_s + (kk >> 2) * (BN * 128) + (kk & 3) * 32), kk > 0);
            wgmma_commit();
            wgmma_wait<0>();
        } else {                   // mma.sync: every warp loads the K fragments itself
#pragma unroll
            for (int kk = 0; kk < D / 16; kk += 2) {
#pragma unroll
                for (int nt = 0; nt < BN / 8; ++nt) {
                    const int row = nt * 8 + (lane & 7), c = 2 * kk + (lane >> 3);
                    uint32_t b0, b1, b2, b3;
                    ldsm_x4(b0, b1, b2, b3, k_s + swz<CH>(row, c));
                    mma16816(s[nt], qa[kk], b0, b1);
                    mma16816(s[nt], qa[kk + 1], b2, b3);
                }
            }
        }

        // Scale to the log2 domain; mask the tree part and the keys past this split.
        const int kb = sr.begin + tile * BN;
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[nt][e] *= scale;
        mask_tile_by_key<BN>(s, kb, L, sr.end, bits_row, tig);

        // Online softmax (fp32, log2 domain). l is kept per thread and reduced at the end.
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            float mx = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < BN / 8; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * hf], s[nt][2 * hf + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = fmaxf(m_run[hf], mx);
            const float m_use = max_ref(m_new);
            const float alpha = fast_exp2(m_run[hf] - m_use);
            m_run[hf] = m_new;
            float sum = 0.f;
#pragma unroll
            for (int nt = 0; nt < BN / 8; ++nt) {
                s[nt][2 * hf] = fast_exp2(s[nt][2 * hf] - m_use);
                s[nt][2 * hf + 1] = fast_exp2(s[nt][2 * hf + 1] - m_use);
                sum += s[nt][2 * hf] + s[nt][2 * hf + 1];
            }
            l_run[hf] = l_run[hf] * alpha + sum;
#pragma unroll
            for (int dt = 0; dt < D / 8; ++dt) {
                o[dt][2 * hf] *= alpha;
                o[dt][2 * hf + 1] *= alpha;
            }
        }

        // O += P V: the S accumulator layout is the A-operand layout of P (two n-tiles per k-step).
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            const uint32_t pa[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                                    pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                    pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                const int row = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, c = 2 * dp + (lane >> 4);
                uint32_t b0, b1, b2, b3;
                ldsm_x4_t(b0, b1, b2, b3, v_s + swz<CH>(row, c));
                mma16816(o[2 * dp], pa, b0, b1);
                mma16816(o[2 * dp + 1], pa, b2, b3);
            }
        }
    }
    cp_async_wait<0>();

    write_rows<D>(p, o, m_run, l_run, r0, b, h, split, lane & 3);
}

// ------------------------------------------------------------------------------------------
// GQA kernel with both products on wgmma, software-pipelined (Hopper; impl "wgmma_pv")
// ------------------------------------------------------------------------------------------
// gqa_kernel's loop runs each tile's steps one after another: S = Q K^T, wait, softmax, O += P V,
// wait. With P V on wgmma too in that loop, ncu on the H200 (65 tree tokens, 65536 keys) saw the
// tensor pipe busy 41 % of the time and neither L2 (48 %) nor DRAM (26 %) near a limit: the warps
// waited on their own MMAs (kernels/NOTES.md, session 8). Here each
// warpgroup issues S_{j+1} = Q K_{j+1}^T and then O += P_j V_j back to back, and computes the
// softmax of S_{j+1} while the tensor cores run P_j V_j (FlashAttention-3's intra-warpgroup
// overlap). It waits for P_j V_j only when O must be rescaled (the lazy rescale: rarely), so P_j
// V_j also runs under the packing of P_{j+1}, into a second set of A registers, and P_{j+1}
// V_{j+1} accumulates behind it. K has a ring of three tiles, V of four (the fourth is the Q
// tile's memory, free once Q is in registers): iteration j loads K_{j+3} and V_{j+2} right after
// its MMAs, so each lands about two iterations before it is read and one barrier a tile frees
// both stages. V tiles are stored as K tiles are
// (64-column blocks of 128-byte rows, 128-byte swizzle) and read as an MN-major B operand; P goes
// from the S accumulators to the A registers of P V.

// TMA (a contiguous cache only; impl wgmma_tma, or wgmma_pv / wgmma_sumcheck in the -DTVA_TMA
// build, kernels/build.py's HARNESS_KERNEL_TMA): K and V tiles come as tensor copies, two
// 64-column boxes a tile issued by thread 0 and waited for on an mbarrier per stage, instead of
// 16 cp.async a thread a tile; the rest of the schedule is the same. `kmap` / `vmap`: the cache
// as [b, heads, rows, D] boxes of 64 x BN (gqa_tma_kernel).
//
// TAIL (gqa_tail_kernel; a contiguous cache, 4 warps): M = nb BM + rem rows with 0 < rem <= nb
// (65 tree tokens x G heads: nb = G, rem = G) run as nb row blocks, not nb + 1: CTA i also
// carries row nb BM + i, its tail row, on the K and V tiles it already holds, where a CTA of its
// own for the rem rows streamed every tile for 4 of 64 rows. The tail row's S^T = K_tile
// Q_tail^T is a wgmma m64n8k16 (A the K tile by its K-major descriptor, B the tail's Q row and 7
// zero rows), and its O^T += V_tile^T P^T one with A the V tile read MN-major (imm-trans-a 1) and
// B P^T from shared memory. Warp w's 16 keys of a tile feed column w of P^T only, so each warp
// runs its own softmax over its keys (its own running max; no reduction across warps a tile),
// and the epilogue merges the four columns as split partials are merged. A column's rescale
// touches O^T rows every warp holds: the warp leaves its factor in shared memory, and every
// thread applies it after the next tile's first barrier. The tail takes the Q tile's 16 KB, so V
// has three stages (the Q tile in the third until V_2 lands) and a second barrier a tile, after
// the main rows' softmax, frees V_{j-1}'s stage and P^T_{j-1}'s buffer (session 15 measured such
// a barrier level at 65 tree tokens; kernels/NOTES.md).
namespace tail {
// The tail's shared memory (the 16 KB past V's stages), offsets from its 1024-byte aligned start.
constexpr uint32_t Q = 0;          // Q_tail as a K-major B operand: 8 rows x 128 dims, 128-byte swizzle (2 KB)
constexpr uint32_t PT = 2048;      // P^T, two buffers of 8 rows (columns of P) x 64 keys (1 KB each)
constexpr uint32_t ALPHA = 4096;   // warp w's column rescale factor for the next tile: 4 floats
constexpr uint32_t ML = 4160;      // epilogue: the warps' running max and sum: 8 floats
constexpr uint32_t O = 8192;       // epilogue: O^T's 4 columns, fp32 [4][128] (2 KB)
}  // namespace tail

// Full row blocks of BM a GQA launch of M rows runs with the tail kernel (the rest, one row a
// CTA, as tail rows), or 0 where M has no such shape.
__host__ __device__ __forceinline__ int tail_row_blocks(int M, int BM) {
    const int nb = M / BM, rem = M % BM;
    return rem > 0 && rem <= nb ? nb : 0;
}

// The tail row's value: the four warps' partial softmaxes (O^T's columns 0-3 and each warp's max
// and sum) merged as split partials are. Returns this thread's dim of the normalised row (a dim a
// thread) and sets `lse` (log2-sum-exp; -inf where the split shows the row nothing).
template <int D>
__device__ __forceinline__ float merge_tail_columns(uint8_t* mem, const float (&ot)[2][1][4], float m, float l,
                                                    int tid, float& lse) {
    static_assert(D == 128, "one dim a thread of the CTA");
    const int warp = tid >> 5, lane = tid & 31, gid = lane >> 2, tig = lane & 3;
    l += __shfl_xor_sync(0xffffffffu, l, 4);     // the sum over the warp's lanes tig == 0
    l += __shfl_xor_sync(0xffffffffu, l, 8);
    l += __shfl_xor_sync(0xffffffffu, l, 16);
    float* const ml = reinterpret_cast<float*>(mem + tail::ML);
    float* const oc = reinterpret_cast<float*>(mem + tail::O);
    if (lane == 0) {
        ml[warp] = m;
        ml[4 + warp] = l;
    }
    if (tig < 2) {            // columns 2 tig and 2 tig + 1 (4-7 are never fed)
#pragma unroll
        for (int mb = 0; mb < 2; ++mb)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                oc[(2 * tig + (e & 1)) * D + 64 * mb + 16 * warp + gid + 8 * (e >> 1)] = ot[mb][0][e];
    }
    __syncthreads();
    const float m_all = fmaxf(fmaxf(ml[0], ml[1]), fmaxf(ml[2], ml[3]));
    float o = 0.f, l_all = 0.f;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        const float f = fast_exp2(ml[w] - max_ref(m_all));
        o += f * oc[w * D + tid];
        l_all += f * ml[4 + w];
    }
    lse = row_lse(m_all, l_all);
    return l_all > 0.f ? o / l_all : 0.f;
}

// The tail row written as write_rows writes a row (the output with one split, else the partial
// and its log2-sum-exp), a dim a thread.
template <int D>
__device__ __forceinline__ void write_tail_row(const AttnParams& p, float o, float lse, int row, int b, int h,
                                               int split, int tid) {
    const int T = static_cast<int>(p.tokens), G = static_cast<int>(p.heads_q / p.heads_kv);
    const int t = row % T, hq = h * G + row / T;
    if (p.num_splits == 1) {
        __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out) + b * p.o_sb + hq * p.o_sh + t * p.o_st;
        *reinterpret_cast<uint16_t*>(out + tid) = static_cast<uint16_t>(pack_bf16(o, 0.f));
    } else {
        const int64_t r = ((static_cast<int64_t>(split) * p.batch + b) * p.heads_q + hq) * T + t;
        p.ws_o[r * D + tid] = o;
        if (tid == 0) p.ws_lse[r] = lse;
    }
}

// A contiguous cache's K or V tile of keys kb .. kb + BN - 1 by cp.async into its swizzled stage
// (dst: the stage plus this thread's offset): 16-byte column `lc` of rows lrow0, lrow0 + RS, ...
// Rows past the split's end are zero-filled (their scores are masked, so P is 0 there).
template <int RS>
__device__ __forceinline__ void copy_tile_rows(uint32_t dst, const char* base, int64_t st, int kb, const SplitRange& sr,
                                               int lrow0, int lc) {
    if (kb + BN <= sr.end) {    // a whole tile (all but a split's last): no predicates
        const char* src = base + static_cast<int64_t>(kb + lrow0) * st * 2 + lc * 16;
        const int64_t step = static_cast<int64_t>(RS) * st * 2;
#pragma unroll
        for (int i = 0; i < BN / RS; ++i) cp_async16(dst + i * RS * 128, src + i * step, true);
        return;
    }
#pragma unroll
    for (int i = 0; i < BN / RS; ++i) {
        const int key = kb + lrow0 + i * RS;
        const bool ok = key < sr.end;
        const int64_t off = static_cast<int64_t>(ok ? key : sr.begin) * st;
        cp_async16(dst + i * RS * 128, base + off * 2 + lc * 16, ok);
    }
}

template <int D, int NW, bool PAGED, bool TMA, bool TAIL = false, bool SUMCHECK = false>
__device__ __forceinline__ void gqa_pipelined(const AttnParams& p, const CUtensorMap* kmap, const CUtensorMap* vmap,
                                              int trace_row = -1) {
    static_assert(!(TMA && PAGED), "tensor copies for a contiguous cache only");
    static_assert(!TAIL || (!TMA && !PAGED && NW == 4 && D == 128), "the tail row: cp.async, contiguous, 4 warps, d 128");
    constexpr int CH = D / 8, NT = NW * 32, STAGES = GqaConfig<D>::STAGES;
    constexpr int TILE = GqaConfig<D>::TILE_BYTES;
    constexpr int BM = 16 * NW;
    static_assert(NW % 4 == 0, "wgmma needs whole warpgroups");
    static_assert(STAGES == 3, "the rings below load K three tiles and V two tiles ahead");
    // V has a fourth stage: the Q tile's shared memory, free once every warp has its Q fragments
    // in registers (before the loop). V_{j+2} then goes into V_{j-2}'s stage, free at iteration
    // j's first barrier, so no second barrier a tile and no copy between S's wait and the softmax.
    // TAIL: three, the Q tile's memory holding the tail's operands instead.
    constexpr int V_STAGES = TAIL ? 3 : 4;
    static_assert(16 * NW * D * 2 >= TILE, "the Q tile holds a V tile");
    static_assert(D == 128, "P V is one m64n128k16 per 16 keys");
    TVA_DYNAMIC_SMEM(smem);
    const uint32_t sK = (smem_addr(smem) + 1023u) & ~1023u;    // 1024-byte aligned for the swizzle
    const uint32_t sV = sK + STAGES * TILE;
    const uint32_t sQ = sV + (TAIL ? 2 : STAGES) * TILE;   // V's fourth (TAIL: third) stage once Q is in registers
    const uint32_t sTail = sV + STAGES * TILE;       // TAIL: the tail's operands (tail::)
    uint8_t* const tail_mem = smem + (sTail - smem_addr(smem));
    // TMA: the stages' mbarriers, K's three then V's four, past the Q tile (in the alignment
    // slack: at least 128 bytes there, since the window starts 128-byte aligned).
    const uint32_t sBar = sQ + 16 * NW * D * 2;
    auto k_bar = [&](int tile) { return sBar + 8u * static_cast<uint32_t>(tile % STAGES); };
    auto v_bar = [&](int tile) { return sBar + 8u * static_cast<uint32_t>(STAGES + tile % V_STAGES); };

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int mblock = blockIdx.x, split = blockIdx.y;
    const int b = blockIdx.z / p.heads_kv, h = blockIdx.z % p.heads_kv;
    const int T = p.tokens, G = p.heads_q / p.heads_kv, M = G * T;
    const int L = read_length(p, b);
    const SplitRange sr = split_range(L + T, p.num_splits, split);
    const int n = sr.tiles;
    // TAIL: this CTA's tail row, if M has one for it
    const int t_row = M / BM * BM + mblock;
    const bool t_valid = TAIL && t_row < M;
    const int t_tok = t_valid ? t_row % T : 0;

    const char* kbase = static_cast<const char*>(p.k) + h * p.k_sh * 2 + (PAGED ? 0 : b * p.k_sb * 2);
    const char* vbase = static_cast<const char*>(p.v) + h * p.v_sh * 2 + (PAGED ? 0 : b * p.v_sb * 2);
    const char* qbase = static_cast<const char*>(p.q) + (b * p.q_sb + static_cast<int64_t>(h) * G * p.q_sh) * 2;
    copy_q_tile<BM, CH, NT>(p, sQ, qbase, tid, mblock, M);
    // TAIL: the tail row copied with the Q tile, as row 0 of Q_tail's eight (the rest zeros: one
    // 16-byte chunk a thread); P^T's buffers zeroed (a warp only ever writes its own column, at
    // its own keys).
    if constexpr (TAIL) {
        const int row = tid / CH, c = tid % CH;
        cp_async16(sTail + tail::Q + (c >> 3) * 1024 + row * 128 + (((c & 7) ^ row) << 4),
                   qbase + ((t_row / T) * p.q_sh + t_tok * p.q_st) * 2 + c * 16, t_valid && row == 0);
#pragma unroll
        for (int w = 0; w < 4; ++w) st_shared_b32(sTail + tail::PT + 16 * tid + 4 * w, 0u);
    }

    // Each thread copies 16-byte column `lc` of rows lrow0, lrow0 + RS, ... of every tile, into
    // 64-column block lc / 8, chunk (lc % 8) ^ (row % 8); RS is a multiple of 8, so the swizzled
    // chunk is the same for all of a thread's rows.
    constexpr int RS = NT / CH;
    static_assert(NT % CH == 0 && BN % RS == 0 && RS % 8 == 0, "tile copy layout");
    const int lc = tid % CH, lrow0 = tid / CH;
    const uint32_t dst0 = (lc >> 3) * (BN * 128) + lrow0 * 128 + (((lc & 7) ^ (lrow0 & 7)) << 4);
    // Paged: a thread copies 8 rows of every K and V tile, and working out a row's address (its
    // page-table entry, a modulo, two 64-bit multiply-adds, the selects past the split's end) per
    // row doubled the kernel's instructions (ncu at 65 tree tokens, 65536 keys: 120.0 M warp
    // instructions against 59.2 M contiguous, the cp.async count equal; kernels/NOTES.md). So each
    // lane works out one row a tile, and the copies take them by shuffle: lane j = lane mod WROWS
    // (< 16) of warp w the K offset of row 2w + (j & 1) + RS (j >> 1), lane 16 + j the V offset
    // of the same row; these are the rows the warp's 32 lanes copy (lrow0 is 2w or 2w + 1). The
    // row's page is read a tile ahead (a page-table round trip before the copy stalled the warp),
    // and a V tile is copied an iteration after its K tile, from the offsets kept since. An offset
    // is a 32-bit count of 16-byte chunks from the head's first row (rows are 16-byte aligned; the
    // Python side refuses a pool past 2^31 chunks, 32 GiB): one shuffle a row, not two, and no
    // 64-bit arithmetic or predicate in the copy.
    constexpr int WROWS = 2 * (BN / RS);              // rows a warp copies a tile
    static_assert(NT / CH == RS && 32 / CH == 2 && WROWS <= 16, "two rows a warp's 32 lanes, 16 offsets a kind");
    const IntDiv page_size(static_cast<uint32_t>(p.page_size));
    const int pj = lane % WROWS;
    const int prow = 2 * warp + (pj & 1) + RS * (pj >> 1);   // this lane's row of a tile
    const bool pv = lane >= 16;                              // its offset serves the V copy
    int32_t page = 0;          // the page of this lane's row of the next K tile
    uint32_t voff = 0;         // this lane's offset in the next V tile (its K tile's, kept)
    auto fetch_page = [&](int tile) {
        if constexpr (PAGED) {
            const int key = sr.begin + tile * BN + prow, kk = key < sr.end ? key : sr.begin;
            page = __ldg(p.page_table + b * p.pt_sb + page_size.div(kk));
        }
    };
    auto row_offset = [&](int tile) -> uint32_t {    // of this lane's row, `page` fetched for `tile`
        if constexpr (!PAGED) return 0;
        const int key = sr.begin + tile * BN + prow, kk = key < sr.end ? key : sr.begin;
        return static_cast<uint32_t>((static_cast<int64_t>(page) * (pv ? p.v_sb : p.k_sb) +
                                      static_cast<int64_t>(page_size.mod(kk)) * (pv ? p.v_st : p.k_st)) >> 3);
    };
    // Paged: `offs` is each lane's row_offset of this tile; lanes `first` .. `first` + 15 hold
    // this copy's kind (0: K, 16: V).
    auto copy_tile = [&](uint32_t stage, const char* base, int64_t st, int tile, uint32_t offs, int first) {
        if constexpr (TMA) {      // thread 0: the tile's 64-column blocks as two boxes
            if (tid == 0) {
                const uint32_t bar = first ? v_bar(tile) : k_bar(tile);
                mbar_arrive_expect_tx(bar, TILE);
#pragma unroll
                for (int c = 0; c < D / 64; ++c) {
                    const int32_t at[4] = {64 * c, sr.begin + tile * BN, h, b};
                    tma_load(stage + c * (BN * 128), first ? vmap : kmap, at, bar);
                }
            }
            return;
        }
        const uint32_t dst = stage + dst0;
        if constexpr (PAGED) {
            // Row i's chunk from its lane, plus this thread's column. No predicate: a row past the
            // split's end copies the split's first key (row_offset's clamp). Splits are whole
            // tiles, so only the sequence's last tile has such rows, and the tree mask sets their
            // scores to -inf (key >= k_end): P is 0 there and their V is never added.
#pragma unroll
            for (int i = 0; i < BN / RS; ++i) {
                const uint32_t chunk = __shfl_sync(0xFFFFFFFFu, offs, first + (lane >> 4) + 2 * i) + lc;
                cp_async16(dst + i * RS * 128, base + static_cast<uint64_t>(chunk) * 16, true);
            }
        } else {
            copy_tile_rows<RS>(dst, base, st, sr.begin + tile * BN, sr, lrow0, lc);
        }
    };

    auto k_stage = [&](int tile) { return sK + (tile % STAGES) * TILE; };
    auto v_stage = [&](int tile) { return sV + (tile % V_STAGES) * TILE; };   // the fourth: sQ

    if constexpr (TMA) {          // thread 0 issues every copy, so its program order suffices
        if (tid == 0) {
#pragma unroll
            for (int i = 0; i < STAGES + V_STAGES; ++i) mbar_init(sBar + 8u * i, 1);
            fence_mbarrier_init();
        }
    }
    // Prologue: {Q, K_0, V_0}, {K_1, V_1}, {K_2}: one commit group each, then S_0.
    fetch_page(0);
#pragma unroll
    for (int t = 0; t < 3; ++t) {
        if (t < n) {
            const uint32_t offs = row_offset(t);
            copy_tile(k_stage(t), kbase, p.k_st, t, offs, 0);
            if (t < 2) copy_tile(v_stage(t), vbase, p.v_st, t, offs, 16);
            else voff = offs;
            fetch_page(t + 1);
        }
        cp_async_commit();
    }
    cp_async_wait<2>();
    // TAIL: an empty group in V_2's place, so that every iteration's top wait counts two groups
    // behind it, K_{j+3}'s and V_{j+2}'s (V_{j+2} goes out after the second barrier).
    if constexpr (TAIL) cp_async_commit();
    fence_proxy_async();
    __syncthreads();              // TMA: the barriers are initialised before anyone waits on one
    if constexpr (TMA) {
        if (n > 0) mbar_wait(k_bar(0), 0);
    }
    trace::stamp(trace_row, STAMP_LANDED);

    uint32_t qa[D / 16][4];
    load_q_fragments<D>(qa, sQ, warp, lane);

    const float scale = static_cast<float>(p.sm_scale) * LOG2E;
    const int gid = lane >> 2, tig = lane & 3;
    const int r0 = mblock * BM + warp * 16 + gid;          // this thread's rows: r0, r0 + 8
    const int32_t* bits_row[2];
    tree_mask_rows(p, b, r0, M, bits_row);

    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
    uint32_t pa[2][BN / 16][4];

    // TAIL: O^T's d rows 0-63 and 64-127 (columns 2 tig, 2 tig + 1: the warps 2 tig and 2 tig + 1
    // whose keys fed them), this warp's running max of its keys' scores of the tail row and this
    // lane's part of their sum (lanes tig == 0 hold the row's scores: S^T's column 0).
    float ot[2][1][4];
#pragma unroll
    for (int mb = 0; mb < 2; ++mb) ot[mb][0][0] = ot[mb][0][1] = ot[mb][0][2] = ot[mb][0][3] = 0.f;
    float t_m = -INFINITY, t_l = 0.f;
    const int32_t* const t_bits = p.tree_bits + b * p.bits_sb + t_tok * p.bits_st;
    const bool t_own = t_valid && tig == 0;

    // S = Q K_tile^T: one wgmma per 16 dims. S is a fresh array in each iteration: carried
    // across the loop, the softmax's writes to it count as writes to the inputs of the next
    // iteration's wgmma and ptxas serialises them (C7513).
    // TAIL: then the tail row's S^T = K_tile Q_tail^T, a group of its own: the main rows'
    // softmax waits for S alone, as without the tail, and the tail's runs after it.
    auto issue_s = [&](float (&s)[BN / 8][4], float (&st)[1][4], int tile) {
        const uint64_t k_desc = desc_kmajor_sw128(k_stage(tile));
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
            wgmma_m64n64k16(s, qa[kk], desc_advance(k_desc, (kk >> 2) * (BN * 128) + (kk & 3) * 32), kk > 0);
        wgmma_commit();
        if constexpr (TAIL) {
            const uint64_t q_desc = desc_kmajor_sw128(sTail + tail::Q);
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk)
                wgmma_m64n8k16_ss(st, desc_advance(k_desc, (kk >> 2) * (BN * 128) + (kk & 3) * 32),
                                  desc_advance(q_desc, (kk >> 2) * 1024 + (kk & 3) * 32), kk > 0);
            wgmma_commit();
        }
    };
    // TAIL: the tail row's O^T += V_tile^T P^T_tile, P^T from the tile's buffer.
    auto issue_pv_tail = [&](int tile) {
        const uint64_t p_desc = desc_kmajor_sw128(sTail + tail::PT + (tile & 1) * 1024);
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
            for (int mb = 0; mb < 2; ++mb)
                wgmma_m64n8k16_ss_ta(ot[mb], desc_advance(desc_mnmajor_sw128(v_stage(tile) + mb * (BN * 128)), kk * 16 * 128),
                                     desc_advance(p_desc, kk * 32));
    };
    // TAIL: this warp's softmax of its 16 keys of the tile for the tail row (the main rows' lazy
    // rescale, per warp): P^T's column `warp` at those keys into the tile's buffer, and the factor
    // the column's O^T must take before this tile's product into shared memory.
    auto tail_softmax = [&](const float (&st)[1][4], int tile) {
        const int kb = sr.begin + tile * BN, key = kb + 16 * warp + gid;
        float x0 = t_own ? st[0][0] : -INFINITY, x1 = t_own ? st[0][2] : -INFINITY;
        if (kb + BN > L) {
            if (!key_visible(t_bits, key, L, sr.end)) x0 = -INFINITY;
            if (!key_visible(t_bits, key + 8, L, sr.end)) x1 = -INFINITY;
        }
        const float m_tile = fmaxf(x0, x1) * scale;
        float alpha = 1.f;
        if (__any_sync(0xffffffffu, m_tile > t_m + RESCALE_LOG2)) {
            float mx = m_tile;
#pragma unroll
            for (int off = 4; off < 32; off *= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            const float m_new = fmaxf(t_m, mx);
            alpha = fast_exp2(t_m - max_ref(m_new));
            t_m = m_new;
        }
        const float m_use = max_ref(t_m);
        const float p0 = fast_exp2(fmaf(x0, scale, -m_use)), p1 = fast_exp2(fmaf(x1, scale, -m_use));
        t_l = t_l * alpha + p0 + p1;
        if (tig == 0) {      // row `warp` of the buffer, keys 16 warp + gid (chunk 2 warp) and + 8
            uint8_t* col = tail_mem + tail::PT + (tile & 1) * 1024 + warp * 128 + 2 * gid;
            *reinterpret_cast<uint16_t*>(col + (((2 * warp) ^ warp) << 4)) = static_cast<uint16_t>(pack_bf16(p0, 0.f));
            *reinterpret_cast<uint16_t*>(col + (((2 * warp + 1) ^ warp) << 4)) = static_cast<uint16_t>(pack_bf16(p1, 0.f));
        }
        if (lane == 0) reinterpret_cast<float*>(tail_mem + tail::ALPHA)[warp] = alpha;
    };
    // TAIL: O^T's columns times the factors the warps left for this tile (all 1 but after a
    // warp's max moved: then the products still running are waited for first).
    auto tail_rescale = [&]() {
        const float4 a = *reinterpret_cast<const float4*>(tail_mem + tail::ALPHA);
        if (a.x == 1.f && a.y == 1.f && a.z == 1.f && a.w == 1.f) return;   // the same for every thread
        wgmma_wait<0>();
        keep_live(ot[0]);
        keep_live(ot[1]);
        const float f0 = tig == 0 ? a.x : tig == 1 ? a.z : 1.f, f1 = tig == 0 ? a.y : tig == 1 ? a.w : 1.f;
#pragma unroll
        for (int mb = 0; mb < 2; ++mb) {
            ot[mb][0][0] *= f0;
            ot[mb][0][1] *= f1;
            ot[mb][0][2] *= f0;
            ot[mb][0][3] *= f1;
        }
    };
    // SUMCHECK: the loop's tiles through sumchecked_softmax (the first tile, before the loop,
    // always takes the exact path: m is -inf there).
    auto softmax = [&](const float (&s)[BN / 8][4], int tile, float (&x)[BN / 8][4], float (&alpha)[2]) {
        if constexpr (SUMCHECK)
            return sumchecked_softmax<BN>(s, sr.begin + tile * BN, L, sr.end, bits_row, tig, scale, m_run, l_run, x, alpha);
        else
            return online_softmax<BN>(s, sr.begin + tile * BN, L, sr.end, bits_row, tig, scale, m_run, l_run, x, alpha);
    };

    if (n > 0) {
        float s[BN / 8][4], st[1][4], x[BN / 8][4], alpha[2];
        wgmma_fence();
        issue_s(s, st, 0);
        wgmma_wait<0>();
        keep_live(s);
        // O is still zero: alpha is not needed
        online_softmax<BN>(s, sr.begin, L, sr.end, bits_row, tig, scale, m_run, l_run, x, alpha);
        pack_p<BN>(x, pa[0]);
        if constexpr (TAIL) {
            keep_live(st);
            tail_softmax(st, 0);
        }
    }
    // One tile. P_tile is in pa[PA] (tile's parity: the loop runs tiles in pairs, so the index is
    // a constant); P_{tile+1} goes to the other one while P_tile V_tile may still run.
    auto step = [&](int tile, auto pa_index) {
        constexpr int PA = decltype(pa_index)::value;
        const bool more = tile + 1 < n;
        // K_{tile+1} and V_tile landed (only this iteration's group may still be in flight, and
        // it has not been committed yet); every warp is done with K_tile.
        if constexpr (TMA) {
            // K_j is the (j / 3)-th copy into its stage, V_j the (j / 4)-th: that use's parity.
            if (more) mbar_wait(k_bar(tile + 1), static_cast<uint32_t>((tile + 1) / STAGES) & 1u);
            mbar_wait(v_bar(tile), static_cast<uint32_t>(tile / V_STAGES) & 1u);
            // A box reads the cache's rows past the sequence (cp.async zero-fills them): their
            // scores are masked, but P = 0 times a NaN or infinite V row is NaN, so those V rows
            // become zeros before P V reads them (only the sequence's last tile has any).
            const int valid = L + T - (sr.begin + tile * BN);
            if (valid < BN) zero_rows<BN, D / 8, NT>(v_stage(tile), valid > 0 ? valid : 0, tid);
        } else {
            cp_async_wait<TAIL ? 2 : 1>();
        }
        fence_proxy_async();
        __syncthreads();
        if constexpr (TAIL) tail_rescale();

        // S_{tile+1} then P_tile V_tile. On the last tile S is issued again on K_tile, still in
        // its stage, and dropped: a branch between the fence and the MMAs makes ptxas serialise
        // every wgmma of the kernel (advisory C7513).
        float s[BN / 8][4], st[1][4];
        wgmma_fence();            // o and pa were last written by ordinary instructions
        issue_s(s, st, more ? tile + 1 : tile);
        const uint64_t v_desc = desc_mnmajor_sw128(v_stage(tile));
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) wgmma_m64n128k16_tb(o, pa[PA][kk], desc_advance(v_desc, kk * 16 * 128));
        if constexpr (TAIL) issue_pv_tail(tile);
        wgmma_commit();
        // K_{tile+3} and V_{tile+2} go out while the tensor cores run: K_{tile+3} into K_tile's
        // stage (S_tile finished in the previous iteration), V_{tile+2} into V_{tile-2}'s (P_{tile-2}
        // V_{tile-2} was retired by the previous iteration's wait_group 1), both for every warp
        // before the barrier above. A warp's wait_group covers its own share of a warpgroup MMA,
        // so a stage is free only after such a barrier (CUTLASS's consumers release a stage
        // likewise). Paged: V_{tile+3} will reuse K_{tile+3}'s row offsets.
        uint32_t offs3 = 0;
        if (tile + 3 < n) {
            offs3 = row_offset(tile + 3);
            copy_tile(k_stage(tile + 3), kbase, p.k_st, tile + 3, offs3, 0);
            fetch_page(tile + 4);
        }
        if (!TAIL && tile + 2 < n) copy_tile(v_stage(tile + 2), vbase, p.v_st, tile + 2, voff, 16);
        if (tile + 3 < n) voff = offs3;
        cp_async_commit();
        if (more) {
            // S_{tile+1}, and with it every older group: P_{tile-1} V_{tile-1} too. Only P_tile
            // V_tile (TAIL: and the tail's S^T) may still run.
            wgmma_wait<TAIL ? 2 : 1>();
            keep_live(s);
            softmax_rescale_pack<D, BN>(s, tile + 1, softmax, o, pa[1 - PA]);
            if constexpr (TAIL) {
                wgmma_wait<1>();      // the tail's S^T_{tile+1}
                keep_live(st);
                __syncthreads();      // every warp has retired P_{tile-1} V_{tile-1} and O^T's with it
                tail_softmax(st, tile + 1);
            }
        } else {
            wgmma_wait<0>();
            keep_live(o);
        }
        if constexpr (TAIL) {     // V_{tile+2} into V_{tile-1}'s stage
            if (tile + 2 < n) copy_tile(v_stage(tile + 2), vbase, p.v_st, tile + 2, voff, 16);
            cp_async_commit();
        }
    };
    trace::stamp(trace_row, STAMP_FIRST_TILE);
    run_tiles(n, step);
    // The last step waited for every product; ptxas cannot tell across the loops, and would
    // inject this wait itself (advisory C7517).
    wgmma_wait<0>();
    keep_live(o);
    cp_async_wait<0>();
    trace::stamp(trace_row, STAMP_LOOP);

    float t_o = 0.f, t_lse = -INFINITY;      // TAIL: this thread's dim of the tail row, its lse
    if constexpr (TAIL) {
        keep_live(ot[0]);
        keep_live(ot[1]);
        t_o = merge_tail_columns<D>(tail_mem, ot, t_m, t_l, tid, t_lse);
    }
    write_rows<D>(p, o, m_run, l_run, r0, b, h, split, tig);
    if (TAIL && t_valid) write_tail_row<D>(p, t_o, t_lse, t_row, b, h, split, tid);
}

template <int D, int NW, bool PAGED, bool SUMCHECK = false>
__global__ void __launch_bounds__(NW * 32, 1)
gqa_pipelined_kernel(const AttnParams p) {
    const int trace_row = trace::begin(TRACE_PIPELINED);
    wait_for_previous_kernel();
    trace::stamp(trace_row, STAMP_WAITED);
    gqa_pipelined<D, NW, PAGED, false, false, SUMCHECK>(p, nullptr, nullptr, trace_row);
    trace::end(trace_row, STAMP_END);
}

// The pipelined kernel with the tail rows (TAIL above): launched as tail_row_blocks row blocks.
template <int D, int NW>
__global__ void __launch_bounds__(NW * 32, 1)
gqa_tail_kernel(const AttnParams p) {
    wait_for_previous_kernel();
    gqa_pipelined<D, NW, false, false, true>(p, nullptr, nullptr);
}

// The tensor maps first: a CUtensorMap is 128-byte aligned.
struct GqaTmaParams {
    CUtensorMap k, v;
    AttnParams p;
};

template <int D, int NW, bool SUMCHECK = false>
__global__ void __launch_bounds__(NW * 32, 1)
gqa_tma_kernel(const __grid_constant__ GqaTmaParams a) {
    const int trace_row = trace::begin(TRACE_PIPELINED);
    wait_for_previous_kernel();
    trace::stamp(trace_row, STAMP_WAITED);
    gqa_pipelined<D, NW, false, true, false, SUMCHECK>(a.p, &a.k, &a.v, trace_row);
    trace::end(trace_row, STAMP_END);
}

// ------------------------------------------------------------------------------------------
// MLA latent kernel: keys 576 wide (512 latent + 64 rope), values = the first 512, one KV head.
// ------------------------------------------------------------------------------------------

namespace mla {
constexpr int DK = 576, DV = 512, CH = DK / 8, BM = 64, NW = 8, NT = NW * 32, STAGES = 2;
constexpr int PCH = BN / 8;                       // chunks per row of the P tile
constexpr int Q_BYTES = BM * DK * 2;              // 73728
constexpr int TILE = BN * DK * 2;                 // 73728
constexpr int P_BYTES = BM * BN * 2;              // 8192
constexpr int RED_BYTES = 2 * 2 * BM * 4;         // row max and row sum halves: 1024
constexpr int SMEM = Q_BYTES + STAGES * TILE + P_BYTES + RED_BYTES + 1024;   // 231424 (+1 KB: alignment)
}  // namespace mla

// Byte offset of 16-byte chunk c of row r in a tile of ROWS rows stored as 64-column blocks of
// 128-byte rows, swizzled: the layout wgmma's 128-byte-swizzle descriptors read (block base
// 1024-byte aligned), and one ldmatrix reads without bank conflicts.
template <int ROWS>
__device__ __forceinline__ uint32_t blk(int r, int c) {
    return static_cast<uint32_t>((c >> 3) * (ROWS * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

// Copies of the MLA kernels: with W warps copying, warp w takes rows w, w + W, ...; its lanes
// the 16-byte chunks lane, lane + 32, lane + 64 of a 576-wide row. Q: all 8 warps.
// The Q rows of row block `mblock` (row r = (head, token) = (r / T, r % T); zeros past M).
__device__ __forceinline__ void mla_copy_q(const AttnParams& p, uint32_t sQ, int b, int mblock, int M, int warp,
                                           int lane) {
    using namespace mla;
    const int T = p.tokens;
    const char* qbase = static_cast<const char*>(p.q) + b * p.q_sb * 2;
#pragma unroll 2
    for (int i = 0; i < BM / NW; ++i) {
        const int row = warp + i * NW, r = mblock * BM + row;
        const bool ok = r < M;
        const char* src = qbase + ((ok ? r / T : 0) * p.q_sh + (ok ? r % T : 0) * p.q_st) * 2;
#pragma unroll
        for (int j = 0; j < 3; ++j) {
            const int c = lane + 32 * j;
            if (c < CH) cp_async16(sQ + blk<BM>(row, c), src + c * 16, ok);
        }
    }
}

// Latent tile `tile` of this split (keys past its end: zeros) into `dst`, by WARPS warps (`warp`
// counted among them: mla_kernel's 8, or mla_pv_kernel's copying warpgroup).
template <bool PAGED, int WARPS = mla::NW>
__device__ __forceinline__ void mla_copy_tile(const AttnParams& p, int b, const SplitRange& sr, int tile, uint32_t dst,
                                              int warp, int lane) {
    using namespace mla;
    const char* kvbase = static_cast<const char*>(p.k);
    const int kb = sr.begin + tile * BN;
#pragma unroll 2
    for (int i = 0; i < BN / WARPS; ++i) {
        const int row = warp + i * WARPS, key = kb + row;
        const bool ok = key < sr.end;
        const char* src = kvbase + key_offset<PAGED>(p, b, ok ? key : sr.begin, p.k_sb, p.k_st) * 2;
#pragma unroll
        for (int j = 0; j < 3; ++j) {
            const int c = lane + 32 * j;
            if (c < CH) cp_async16(dst + blk<BN>(row, c), src + c * 16, ok);
        }
    }
}

// WG: S = Q K^T with wgmma, Q and K both read by descriptor (each warpgroup: 64 rows x 32 keys).
template <bool PAGED, bool WG>
__global__ void __launch_bounds__(mla::NT, 1)
mla_kernel(const AttnParams p) {
    wait_for_previous_kernel();
    using namespace mla;
    TVA_DYNAMIC_SMEM(smem);
    const uint32_t sQ = (smem_addr(smem) + 1023u) & ~1023u;     // Q and KV tiles: 1024-byte aligned
    const uint32_t sKV = sQ + Q_BYTES;
    const uint32_t sP = sKV + STAGES * TILE;
    float* red_max = reinterpret_cast<float*>(smem + (sP + P_BYTES - smem_addr(smem)));   // [2][BM]
    float* red_sum = red_max + 2 * BM;                                                     // [2][BM]

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int gid = lane >> 2, tig = lane & 3;
    const int mblock = blockIdx.x, split = blockIdx.y, b = blockIdx.z;
    const int T = p.tokens, H = p.heads_q, M = H * T;
    const int L = read_length(p, b);
    const SplitRange sr = split_range(L + T, p.num_splits, split);

    mla_copy_q(p, sQ, b, mblock, M, warp, lane);
    auto load_tile = [&](int tile, int stage) { mla_copy_tile<PAGED>(p, b, sr, tile, sKV + stage * TILE, warp, lane); };

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < sr.tiles) load_tile(s, s);
        cp_async_commit();
    }

    // Roles. QK: warp computes S for rows 16*rt.. of the block and keys 32*kh.. of the tile.
    // PV: warp owns value columns 64*warp .. 64*warp+63 for all 64 rows (4 m-tiles).
    const int rt = warp & 3, kh = warp >> 2;
    const float scale = static_cast<float>(p.sm_scale) * LOG2E;
    const int32_t* bits_row[2];
    tree_mask_rows(p, b, mblock * BM + rt * 16 + gid, M, bits_row);

    float o[4][8][4];
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int i = 0; i < 8; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
    float m_run[4][2];
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) m_run[mt][0] = m_run[mt][1] = -INFINITY;
    float l_part[2] = {0.f, 0.f};      // QK role: partial row sums over this warp's key half

    for (int tile = 0; tile < sr.tiles; ++tile) {
        cp_async_wait<STAGES - 2>();
        if (WG) fence_proxy_async();
        __syncthreads();                                         // (A) tile landed, stage free
        if (tile + STAGES - 1 < sr.tiles) load_tile(tile + STAGES - 1, (tile + STAGES - 1) % STAGES);
        cp_async_commit();
        const uint32_t kv_s = sKV + (tile % STAGES) * TILE;

        // S = Q K^T for 16 rows x 32 keys per warp (warpgroup kh: 64 rows x keys 32kh..32kh+31).
        float s[4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
        if constexpr (WG) {
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < DK / 16; ++kk) {
                const uint32_t kofs = (kk & 3) * 32;           // 16 columns of a 64-column block
                wgmma_m64n32k16_ss(s, desc_kmajor_sw128(sQ + (kk >> 2) * (BM * 128) + kofs),
                                   desc_kmajor_sw128(kv_s + (kk >> 2) * (BN * 128) + kh * 32 * 128 + kofs), kk > 0);
            }
            wgmma_commit();
            wgmma_wait<0>();
        } else {                   // mma.sync, A fragments from shared memory
#pragma unroll 6
            for (int kk = 0; kk < DK / 16; kk += 2) {
                uint32_t a0[4], a1[4];
                const int qrow = rt * 16 + (lane & 15);
                ldsm_x4(a0[0], a0[1], a0[2], a0[3], sQ + blk<BM>(qrow, 2 * kk + (lane >> 4)));
                ldsm_x4(a1[0], a1[1], a1[2], a1[3], sQ + blk<BM>(qrow, 2 * kk + 2 + (lane >> 4)));
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) {
                    const int row = kh * 32 + nt * 8 + (lane & 7), c = 2 * kk + (lane >> 3);
                    uint32_t b0, b1, b2, b3;
                    ldsm_x4(b0, b1, b2, b3, kv_s + blk<BN>(row, c));
                    mma16816(s[nt], a0, b0, b1);
                    mma16816(s[nt], a1, b2, b3);
                }
            }
        }

        const int kb = sr.begin + tile * BN + kh * 32;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[nt][e] *= scale;
        mask_tile<32>(s, kb, L, sr.end, bits_row, tig);
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            float mx = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * hf], s[nt][2 * hf + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            if (tig == 0) red_max[kh * BM + rt * 16 + gid + 8 * hf] = mx;
        }
        __syncthreads();                                         // (B) row maxima of both halves

        // Every warp updates the running max of all 64 rows (identically), rescales its O.
        float m_qk[2] = {0.f, 0.f}, a_qk[2] = {0.f, 0.f};
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const int row = mt * 16 + gid + 8 * hf;
                const float m_new = fmaxf(m_run[mt][hf], fmaxf(red_max[row], red_max[BM + row]));
                const float m_use = max_ref(m_new);
                const float alpha = fast_exp2(m_run[mt][hf] - m_use);
                m_run[mt][hf] = m_new;
#pragma unroll
                for (int dt = 0; dt < 8; ++dt) {
                    o[mt][dt][2 * hf] *= alpha;
                    o[mt][dt][2 * hf + 1] *= alpha;
                }
                if (mt == rt) {
                    m_qk[hf] = m_use;
                    a_qk[hf] = alpha;
                }
            }

        // P = exp2(S - m) to shared memory (bf16), partial row sums.
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            float sum = 0.f;
            const int prow = rt * 16 + gid + 8 * hf;
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                const float p0 = fast_exp2(s[nt][2 * hf] - m_qk[hf]);
                const float p1 = fast_exp2(s[nt][2 * hf + 1] - m_qk[hf]);
                sum += p0 + p1;
                const int pc = kh * 4 + nt;   // 16-byte chunk of 8 keys
                st_shared_b32(sP + swz<PCH>(prow, pc) + tig * 4, pack_bf16(p0, p1));
            }
            l_part[hf] = l_part[hf] * a_qk[hf] + sum;
        }
        __syncthreads();                                         // (C) P complete

        // O[:, 64*warp .. +63] += P V.
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            uint32_t pa[4][4];
#pragma unroll
            for (int mt = 0; mt < 4; ++mt)
                ldsm_x4(pa[mt][0], pa[mt][1], pa[mt][2], pa[mt][3],
                        sP + swz<PCH>(mt * 16 + (lane & 15), 2 * kk + (lane >> 4)));
#pragma unroll
            for (int dp = 0; dp < 4; ++dp) {
                const int row = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                const int c = warp * 8 + 2 * dp + (lane >> 4);
                uint32_t b0, b1, b2, b3;
                ldsm_x4_t(b0, b1, b2, b3, kv_s + blk<BN>(row, c));
#pragma unroll
                for (int mt = 0; mt < 4; ++mt) {
                    mma16816(o[mt][2 * dp], pa[mt], b0, b1);
                    mma16816(o[mt][2 * dp + 1], pa[mt], b2, b3);
                }
            }
        }
    }
    cp_async_wait<0>();

    // Row sums: the two key halves of each row, through shared memory.
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        const float l = quad_sum(l_part[hf]);
        if (tig == 0) red_sum[kh * BM + rt * 16 + gid + 8 * hf] = l;
    }
    __syncthreads();

#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            const int row = mt * 16 + gid + 8 * hf;
            const int r = mblock * BM + row;
            if (r >= M) continue;
            const float l = red_sum[row] + red_sum[BM + row];
            const float inv = l > 0.f ? 1.f / l : 0.f;
            const int hh = r / T, t = r % T;
            if (p.num_splits == 1) {
                __nv_bfloat16* out =
                    static_cast<__nv_bfloat16*>(p.out) + b * p.o_sb + hh * p.o_sh + t * p.o_st + warp * 64;
#pragma unroll
                for (int dt = 0; dt < 8; ++dt)
                    *reinterpret_cast<uint32_t*>(out + dt * 8 + 2 * tig) =
                        pack_bf16(o[mt][dt][2 * hf] * inv, o[mt][dt][2 * hf + 1] * inv);
            } else {
                const int64_t wrow = ((static_cast<int64_t>(split) * p.batch + b) * H + hh) * T + t;
                float* wo = p.ws_o + wrow * DV + warp * 64;
#pragma unroll
                for (int dt = 0; dt < 8; ++dt)
                    *reinterpret_cast<float2*>(wo + dt * 8 + 2 * tig) =
                        make_float2(o[mt][dt][2 * hf] * inv, o[mt][dt][2 * hf + 1] * inv);
                if (warp == 0 && tig == 0) p.ws_lse[wrow] = l > 0.f ? m_run[mt][hf] + __log2f(l) : -INFINITY;
            }
        }
}

// MLA with P V on wgmma too (impl "wgmma_pv"). The first warpgroup computes S = Q K^T for the
// whole 64-key tile (36 m64n64k16, Q and K by descriptor) and its softmax, and writes P to shared
// memory (bf16, a K-major operand) with each row's rescale factor; the second copies the tiles
// meanwhile. Then both compute their half of O: O[:, 256 g .. 256 g + 255] += P V as four
// m64n256k16 a tile, P and V both by descriptor (V: the tile's first 512 columns, MN-major).
// mla_kernel's P V was 128 mma.sync a warp a tile with their ldmatrix loads of P and V, and its
// S two m64n32k16 halves whose row maxima met through shared memory behind a barrier. The
// reference max moves lazily (RESCALE_LOG2, as the GQA pipelined kernel's).
//
// TMA (a contiguous cache; impl wgmma_tma, or wgmma_pv in the -DTVA_TMA build): the
// copying warpgroup's first thread copies each tile as nine 64-column boxes through `kvmap`,
// waited for on the stage's mbarrier, instead of 36 cp.async a thread of that warpgroup (their
// issue slots are the same multiprocessor's as the softmax's). Keys past the split's end, which
// cp.async zero-fills, are zeroed after the box lands: their scores are masked, but P = 0 times a
// NaN value read past the sequence would still be NaN.
template <bool PAGED, bool TMA>
__device__ __forceinline__ void mla_pv(const AttnParams& p, const CUtensorMap* kvmap) {
    using namespace mla;
    static_assert(NW == 8 && DV == 512, "two warpgroups, 256 value columns each");
    static_assert(!(TMA && PAGED), "tensor copies for a contiguous cache only");
    TVA_DYNAMIC_SMEM(smem);
    const uint32_t sQ = (smem_addr(smem) + 1023u) & ~1023u;     // Q, KV and P tiles: 1024-byte aligned
    const uint32_t sKV = sQ + Q_BYTES;
    const uint32_t sP = sKV + STAGES * TILE;
    float* red_alpha = reinterpret_cast<float*>(smem + (sP + P_BYTES - smem_addr(smem)));   // [BM]
    float* red_sum = red_alpha + 2 * BM;                                                     // [BM]
    const uint32_t sBar = sP + P_BYTES + 3 * BM * 4;       // TMA: a stage's mbarrier each, past red_sum
    static_assert(3 * BM * 4 + 8 * STAGES <= RED_BYTES, "the mbarriers fit the reduction area");

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int gid = lane >> 2, tig = lane & 3;
    const int wg = warp >> 2, wr = warp & 3;       // warpgroup; rows 16 wr + gid (+ 8) of the block
    const int mblock = blockIdx.x, split = blockIdx.y, b = blockIdx.z;
    const int T = p.tokens, H = p.heads_q, M = H * T;
    const int L = read_length(p, b);
    const SplitRange sr = split_range(L + T, p.num_splits, split);
    const int n = sr.tiles;

    // Q by every warp; the tiles by the second warpgroup, one tile ahead. Every thread commits a
    // group each time (the first warpgroup's are empty), so the waits count alike. TMA: thread
    // NT / 2 initialises the barriers and issues every copy, so its program order suffices.
    mla_copy_q(p, sQ, b, mblock, M, warp, lane);
    auto load_tile = [&](int tile) {
        const uint32_t stage = sKV + (tile % STAGES) * TILE;
        if constexpr (TMA) {
            if (tid == NT / 2) {
                const uint32_t bar = sBar + 8u * (tile % STAGES);
                mbar_arrive_expect_tx(bar, TILE);
#pragma unroll
                for (int c = 0; c < DK / 64; ++c) {
                    const int32_t at[4] = {64 * c, sr.begin + tile * BN, 0, b};
                    tma_load(stage + c * (BN * 128), kvmap, at, bar);
                }
            }
        } else if (wg == 1) {
            mla_copy_tile<PAGED, 4>(p, b, sr, tile, stage, wr, lane);
        }
    };
    if constexpr (TMA) {
        if (tid == NT / 2) {
#pragma unroll
            for (int i = 0; i < STAGES; ++i) mbar_init(sBar + 8u * i, 1);
            fence_mbarrier_init();
        }
    }
    if (n > 0) load_tile(0);
    cp_async_commit();
    if constexpr (TMA) __syncthreads();        // the barriers are initialised before anyone waits on one

    const float scale = static_cast<float>(p.sm_scale) * LOG2E;
    const int32_t* bits_row[2];
    tree_mask_rows(p, b, mblock * BM + wr * 16 + gid, M, bits_row);
    float o[DV / 2 / 8][4];
#pragma unroll
    for (int i = 0; i < DV / 2 / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY};
    float l_run[2] = {0.f, 0.f};       // first warpgroup: this thread's share of its rows' sums
    const uint64_t p_desc = desc_kmajor_sw128(sP);

    for (int tile = 0; tile < n; ++tile) {
        const uint32_t kv_s = sKV + (tile % STAGES) * TILE;
        if constexpr (TMA) {                   // the tile is its stage's (tile / STAGES)-th copy
            mbar_wait(sBar + 8u * (tile % STAGES), static_cast<uint32_t>(tile / STAGES) & 1u);
            const int valid = sr.end - (sr.begin + tile * BN);     // only a sequence's last tile has fewer
            if (valid < BN) zero_rows<BN, CH, NT>(kv_s, valid > 0 ? valid : 0, tid);
        }
        cp_async_wait<0>();
        fence_proxy_async();
        __syncthreads();                       // (A) tile landed; the other stage, P and alphas free
        if (tile + 1 < n) load_tile(tile + 1);
        cp_async_commit();

        if (wg == 0) {
            float s[BN / 8][4];
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < DK / 16; ++kk) {
                const uint32_t kofs = (kk & 3) * 32;           // 16 columns of a 64-column block
                wgmma_m64n64k16_ss(s, desc_kmajor_sw128(sQ + (kk >> 2) * (BM * 128) + kofs),
                                   desc_kmajor_sw128(kv_s + (kk >> 2) * (BN * 128) + kofs), kk > 0);
            }
            wgmma_commit();
            wgmma_wait<0>();
            keep_live(s);

            float x[BN / 8][4], m_tile[2];
            masked_tile_max<BN>(s, sr.begin + tile * BN, L, sr.end, bits_row, tig, scale, x, m_tile);
            const bool rescale = __any_sync(0xffffffffu, m_tile[0] > m_run[0] + RESCALE_LOG2 ||
                                                         m_tile[1] > m_run[1] + RESCALE_LOG2);
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                float alpha = 1.f;
                if (rescale) {          // warp-uniform; P V of the tile before was waited for
                    const float m_new = fmaxf(m_run[hf], m_tile[hf]);
                    alpha = fast_exp2(m_run[hf] - max_ref(m_new));
                    m_run[hf] = m_new;
#pragma unroll
                    for (int j = 0; j < DV / 2 / 8; ++j) {
                        o[j][2 * hf] *= alpha;
                        o[j][2 * hf + 1] *= alpha;
                    }
                }
                const float m_use = max_ref(m_run[hf]);
                const int prow = wr * 16 + gid + 8 * hf;
#pragma unroll
                for (int nt = 0; nt < BN / 8; ++nt) {
                    x[nt][2 * hf] = fast_exp2(fmaf(x[nt][2 * hf], scale, -m_use));
                    x[nt][2 * hf + 1] = fast_exp2(fmaf(x[nt][2 * hf + 1], scale, -m_use));
                    st_shared_b32(sP + blk<BM>(prow, nt) + tig * 4, pack_bf16(x[nt][2 * hf], x[nt][2 * hf + 1]));
                }
                l_run[hf] = l_run[hf] * alpha + row_sum(x, hf);
                if (tig == 0) red_alpha[prow] = alpha;
            }
        }
        fence_proxy_async();
        __syncthreads();                                         // (C) P and the alphas

        if (wg == 1) {          // the rows of warp wr of the first warpgroup, and its decision
            float alpha[2];
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) alpha[hf] = red_alpha[wr * 16 + gid + 8 * hf];
            if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
                for (int j = 0; j < DV / 2 / 8; ++j) {
                    o[j][0] *= alpha[0];
                    o[j][1] *= alpha[0];
                    o[j][2] *= alpha[1];
                    o[j][3] *= alpha[1];
                }
            }
        }
        // O[:, 256 wg ..] += P V: V's 64-column blocks 4 wg .. 4 wg + 3, 16 keys a step.
        const uint64_t v_desc = desc_mnmajor_sw128(kv_s + wg * 4 * (BN * 128));
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)
            wgmma_m64n256k16_ss_tb(o, desc_advance(p_desc, kk * 32), desc_advance(v_desc, kk * 16 * 128));
        wgmma_commit();
        wgmma_wait<0>();
        keep_live(o);
    }
    cp_async_wait<0>();

    // Row sums: the first warpgroup's, through shared memory (the lse below is written by the
    // first warpgroup, which holds the rows' maxima).
    if (wg == 0) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            const float l = quad_sum(l_run[hf]);
            if (tig == 0) red_sum[wr * 16 + gid + 8 * hf] = l;
        }
    }
    __syncthreads();

#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        const int row = wr * 16 + gid + 8 * hf;
        const int r = mblock * BM + row;
        if (r >= M) continue;
        const float l = red_sum[row];
        const float inv = l > 0.f ? 1.f / l : 0.f;
        const int hh = r / T, t = r % T;
        const int col0 = wg * (DV / 2) + 2 * tig;
        if (p.num_splits == 1) {
            __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out) + b * p.o_sb + hh * p.o_sh + t * p.o_st + col0;
#pragma unroll
            for (int j = 0; j < DV / 2 / 8; ++j)
                *reinterpret_cast<uint32_t*>(out + 8 * j) = pack_bf16(o[j][2 * hf] * inv, o[j][2 * hf + 1] * inv);
        } else {
            const int64_t wrow = ((static_cast<int64_t>(split) * p.batch + b) * H + hh) * T + t;
            float* wo = p.ws_o + wrow * DV + col0;
#pragma unroll
            for (int j = 0; j < DV / 2 / 8; ++j)
                *reinterpret_cast<float2*>(wo + 8 * j) = make_float2(o[j][2 * hf] * inv, o[j][2 * hf + 1] * inv);
            if (wg == 0 && tig == 0) p.ws_lse[wrow] = row_lse(m_run[hf], l);
        }
    }
}

template <bool PAGED>
__global__ void __launch_bounds__(mla::NT, 1)
mla_pv_kernel(const AttnParams p) {
    wait_for_previous_kernel();
    mla_pv<PAGED, false>(p, nullptr);
}

// The tensor map first: a CUtensorMap is 128-byte aligned.
struct MlaTmaParams {
    CUtensorMap kv;
    AttnParams p;
};

__global__ void __launch_bounds__(mla::NT, 1)
mla_tma_kernel(const __grid_constant__ MlaTmaParams a) {
    if (threadIdx.x == mla::NT / 2) prefetch_tensormap(&a.kv);    // the copying thread's, under the wait
    wait_for_previous_kernel();
    mla_pv<false, true>(a.p, &a.kv);
}

// ------------------------------------------------------------------------------------------
// Combine: out[row] = sum_s 2^(lse_s - m) O_s / sum_s 2^(lse_s - m). One warp per output row
// and slice of COLS columns (up to 128; a 512-wide MLA row is four warps' work, or eight: see
// launch_combine), COMBINE_ROWS such warps a CTA, lane l taking the slice's columns 2 (l + 32 i).
// A warp loads a chunk of up to CHUNK splits at once (every lane the chunk's lse values, one
// broadcast transaction each, and its share of their partial rows), then folds the chunk into its
// running max, sum and accumulator (an online softmax over chunks): up to CHUNK splits cost one
// round trip to L2, with no shared memory and no barrier. CHUNK is 4 or 8 where the launch has
// that few splits, else 32 float2 a lane's worth (16 splits on 128-column slices, 32 on 64): the
// chunk's loads and folds are unrolled, so every slot past the splits still costs its
// instructions on every row (at 6 splits a chunk of 32 made the combine ~3 us slower on the
// H200, kernels/NOTES.md "Split-KV partials in bf16"). Tried before (kernels/NOTES.md): four
// warps a row meeting through shared memory (6-8 us under ncu for 8-13 MB of partials, the
// kernel this replaced), and one warp a row with four splits in flight and the weights
// broadcast by shuffle (slower). A whole 512-wide row a warp had four splits in flight and 128
// warps for MLA's 128 rows: the MLA verify took 116 us at 65536 keys (65 splits, 17 MB of
// partials), its main kernel 63 of them.
// ------------------------------------------------------------------------------------------

constexpr int COMBINE_ROWS = 4;

// Columns a combine warp takes: a slice of the row, so wide rows spread over more warps.
template <int DV>
constexpr int COMBINE_COLS = DV < 128 ? DV : 128;

template <int DV, int COLS, int CHUNK>
__global__ void __launch_bounds__(COMBINE_ROWS * 32)
combine_kernel(const AttnParams p) {
    const int trace_row = trace::begin(TRACE_COMBINE);
    wait_for_previous_kernel();
    trace::stamp(trace_row, STAMP_WAITED);
    constexpr int SLICES = DV / COLS;
    static_assert(COLS % 64 == 0 && DV % COLS == 0, "a float2 per lane per 64 columns");
    constexpr int V = COLS / 64;                   // float2 per lane and split: columns 2 (lane + 32 i)
    static_assert(CHUNK * V <= 32, "splits in flight: at most 32 float2 a lane");
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int S = static_cast<int>(p.num_splits), T = static_cast<int>(p.tokens), H = static_cast<int>(p.heads_q);
    const int64_t rows = p.batch * H * T, task = static_cast<int64_t>(blockIdx.x) * COMBINE_ROWS + warp;
    const int64_t row = task / SLICES;
    const int col0 = static_cast<int>(task % SLICES) * COLS;
    if (row >= rows) return;                       // the last CTA's spare warps
    const int t = row % T, hq = (row / T) % H, b = row / (static_cast<int64_t>(T) * H);

    float m = -INFINITY, total = 0.f;
    float2 acc[V];
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] = make_float2(0.f, 0.f);
    for (int c0 = 0; c0 < S; c0 += CHUNK) {
        float lse[CHUNK];
        float2 x[CHUNK][V];
#pragma unroll
        for (int j = 0; j < CHUNK; ++j) {
            const int s = c0 + j;
            lse[j] = -INFINITY;
#pragma unroll
            for (int i = 0; i < V; ++i) x[j][i] = make_float2(0.f, 0.f);
            if (s < S) {
                lse[j] = p.ws_lse[s * rows + row];
                const float2* src = reinterpret_cast<const float2*>(p.ws_o + (s * rows + row) * DV + col0);
#pragma unroll
                for (int i = 0; i < V; ++i) x[j][i] = src[lane + 32 * i];
            }
        }
        float m_new = m;
#pragma unroll
        for (int j = 0; j < CHUNK; ++j) m_new = fmaxf(m_new, lse[j]);
        // An empty split (or a row that saw nothing in it) has lse -inf: weight 0, O = 0.
        const float m_ref = max_ref(m_new);
        const float keep = exp2f(m - m_ref);
        total *= keep;
#pragma unroll
        for (int i = 0; i < V; ++i) {
            acc[i].x *= keep;
            acc[i].y *= keep;
        }
#pragma unroll
        for (int j = 0; j < CHUNK; ++j) {
            const float w = exp2f(lse[j] - m_ref);
            total += w;
#pragma unroll
            for (int i = 0; i < V; ++i) {
                acc[i].x += w * x[j][i].x;
                acc[i].y += w * x[j][i].y;
            }
        }
        m = m_new;
    }
    const float inv = total > 0.f ? 1.f / total : 0.f;
    __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out) + b * p.o_sb + hq * p.o_sh + t * p.o_st + col0;
#pragma unroll
    for (int i = 0; i < V; ++i)
        *reinterpret_cast<uint32_t*>(out + 2 * (lane + 32 * i)) = pack_bf16(acc[i].x * inv, acc[i].y * inv);
    trace::end(trace_row, STAMP_END);     // thread 0's warp done (its row is never a spare one)
}

// ------------------------------------------------------------------------------------------
// Host side
// ------------------------------------------------------------------------------------------

// Raise a kernel's dynamic shared-memory limit once per (kernel, device) (a host-side attribute:
// no stream work, so it is also fine while a graph is being captured). Every kernel here has the
// same type, void(*)(AttnParams), so the memo is keyed by the kernel's address: a per-type memo
// (a `static bool done[device]` in a template over the kernel's type, as this once was) marks the
// first kernel prepared as done for all of them, and every other kernel needing more than the
// default 48 KB then fails to launch with cudaErrorInvalidValue ("invalid argument").
template <typename Kernel>
static cudaError_t prepare(Kernel kernel, int smem) {
    struct Done {
        const void* kernel;
        int device, smem;
    };
    static Done done[256];
    static int n_done = 0;
    static std::mutex lock;          // ctypes drops the GIL: launches may come from several threads
    const void* key = reinterpret_cast<const void*>(kernel);
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    std::lock_guard<std::mutex> guard(lock);
    for (int i = 0; i < n_done; ++i)
        if (done[i].kernel == key && done[i].device == device && done[i].smem >= smem) return cudaSuccess;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err == cudaSuccess && n_done < 256) done[n_done++] = {key, device, smem};
    return err;
}

// The kernel of a variant: wgmma 0 mma.sync, 1 S on wgmma, 2 S and P V on wgmma (pipelined), 3
// the pipelined kernel with tail rows, 6 the pipelined kernel with the sum-checked softmax.
template <int D, int NW, bool PAGED, int WGMMA>
constexpr auto gqa_variant() {
    if constexpr (WGMMA == 6) return gqa_pipelined_kernel<D, NW, PAGED, true>;
    else if constexpr (WGMMA == 3) return gqa_tail_kernel<D, NW>;
    else if constexpr (WGMMA == 2) return gqa_pipelined_kernel<D, NW, PAGED>;
    else return gqa_kernel<D, NW, PAGED, WGMMA == 1>;
}

template <bool PAGED, int WGMMA>
constexpr auto mla_variant() {
    if constexpr (WGMMA == 2) return mla_pv_kernel<PAGED>;
    else return mla_kernel<PAGED, WGMMA == 1>;
}

template <int D, int NW, bool PAGED, int WGMMA>
static cudaError_t launch_gqa(const AttnParams& p, cudaStream_t stream, int m_blocks) {
    constexpr int smem = gqa_smem_bytes<D, NW, WGMMA != 0>();
    auto kernel = gqa_variant<D, NW, PAGED, WGMMA>();
    cudaError_t err = prepare(kernel, smem);
    if (err != cudaSuccess) return err;
    dim3 grid(m_blocks, static_cast<unsigned>(p.num_splits), static_cast<unsigned>(p.batch * p.heads_kv));
    TVA_LAUNCH(kernel, grid, NW * 32, smem, stream, p);
    return launch_status(stream);
}

// The tensor-copy launchers, in every build (custom_impl wgmma_tma; the -DTVA_TMA build also
// sends wgmma_pv and wgmma_sumcheck through them).
// A contiguous cache [b, heads, rows, D] (any strides, 16-byte multiples) as boxes of 64
// columns by BN rows, 128-byte swizzled: the layout the wgmma descriptors read. Rows past
// `kv_rows` read as zeros.
static bool encode_cache_map(CUtensorMap* map, const void* base, const AttnParams& p, int64_t sb, int64_t sh,
                             int64_t st, int d) {
    const EncodeTiled encode = encode_tiled();
    if (encode == nullptr) return false;
    const cuuint64_t dims[4] = {static_cast<cuuint64_t>(d), static_cast<cuuint64_t>(p.kv_rows),
                                static_cast<cuuint64_t>(p.heads_kv), static_cast<cuuint64_t>(p.batch)};
    const cuuint64_t strides[3] = {static_cast<cuuint64_t>(st * 2), static_cast<cuuint64_t>(sh * 2),
                                   static_cast<cuuint64_t>(sb * 2)};
    const cuuint32_t box[4] = {64, BN, 1, 1}, unit[4] = {1, 1, 1, 1};
    return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(base), dims, strides, box, unit,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <int D, int NW, typename Kernel>
static cudaError_t launch_gqa_tma(Kernel kernel, const AttnParams& p, cudaStream_t stream, int m_blocks) {
    constexpr int smem = gqa_smem_bytes<D, NW, true>();
    cudaError_t err = prepare(kernel, smem);
    if (err != cudaSuccess) return err;
    GqaTmaParams a;
    a.p = p;
    if (!encode_cache_map(&a.k, p.k, p, p.k_sb, p.k_sh, p.k_st, D) ||
        !encode_cache_map(&a.v, p.v, p, p.v_sb, p.v_sh, p.v_st, D))
        return cudaErrorInvalidValue;
    dim3 grid(m_blocks, static_cast<unsigned>(p.num_splits), static_cast<unsigned>(p.batch * p.heads_kv));
    TVA_LAUNCH(kernel, grid, NW * 32, smem, stream, a);
    return launch_status(stream);
}

// The MLA latent cache [b, 1, rows, 576] as nine boxes a tile (mla_tma_kernel).
static cudaError_t launch_mla_tma(const AttnParams& p, cudaStream_t stream, dim3 grid) {
    cudaError_t err = prepare(mla_tma_kernel, mla::SMEM);
    if (err != cudaSuccess) return err;
    MlaTmaParams a;
    a.p = p;
    if (!encode_cache_map(&a.kv, p.k, p, p.k_sb, p.k_sh, p.k_st, mla::DK)) return cudaErrorInvalidValue;
    TVA_LAUNCH(mla_tma_kernel, grid, mla::NT, mla::SMEM, stream, a);
    return launch_status(stream);
}

template <int D, int COLS>
static void launch_combine_cols(const AttnParams& p, cudaStream_t stream) {
    const int64_t warps = p.batch * p.heads_q * p.tokens * (D / COLS);
    const auto ctas = static_cast<unsigned>((warps + COMBINE_ROWS - 1) / COMBINE_ROWS);
    constexpr int MAX_CHUNK = 32 / (COLS / 64);
    if (p.num_splits <= 4) TVA_LAUNCH((combine_kernel<D, COLS, 4>), dim3(ctas), COMBINE_ROWS * 32, 0, stream, p);
    else if (p.num_splits <= 8) TVA_LAUNCH((combine_kernel<D, COLS, 8>), dim3(ctas), COMBINE_ROWS * 32, 0, stream, p);
    else TVA_LAUNCH((combine_kernel<D, COLS, MAX_CHUNK>), dim3(ctas), COMBINE_ROWS * 32, 0, stream, p);
}

// Rows wider than 128 columns (MLA's 512) at more than COMBINE_NARROW_SPLITS splits take
// 64-column slices: twice the warps, each with a chunk of 32 splits in flight. Measured on an
// H100 (MLA, 16 tree tokens, 8 heads; kernels/NOTES.md "Session 57"): at 57 and 65 splits the
// narrow slices were 1.3-6.4 µs faster at every context from 4k to 128k keys, at 43 and fewer
// up to 3.5 µs slower.
constexpr int COMBINE_NARROW_SPLITS = 48;
template <int DV>
constexpr int COMBINE_NARROW_COLS = DV > 128 ? 64 : COMBINE_COLS<DV>;   // narrower rows: unchanged

template <int D>
static cudaError_t launch_combine(const AttnParams& p, cudaStream_t stream) {
    if (p.num_splits == 1) return cudaSuccess;
    if (p.num_splits > COMBINE_NARROW_SPLITS) launch_combine_cols<D, COMBINE_NARROW_COLS<D>>(p, stream);
    else launch_combine_cols<D, COMBINE_COLS<D>>(p, stream);
    return launch_status(stream);
}

template <int D, bool PAGED>
static cudaError_t dispatch_warps(const AttnParams& p, int num_warps, int wgmma, cudaStream_t stream) {
    const int M = static_cast<int>(p.heads_q / p.heads_kv * p.tokens);
    const int bm = 16 * num_warps;
    const int m_blocks = (M + bm - 1) / bm;
    // wgmma: 0 mma.sync, 1 S on wgmma, 2 S and P V on wgmma (head_dim 128 only), 3 as 2 with the
    // rows past the last full row block as tail rows where M has that shape (else as 2), 6 as 2
    // with the sum-checked softmax, 12 as 2 with the tiles by tensor copies (as tva_gqa_forward
    // documents). Any other code is refused here: in the switch below, a code's sum with the warps
    // could name another variant's case.
    if (wgmma < 0 || (wgmma > 3 && wgmma != 6 && wgmma != 12)) return cudaErrorInvalidValue;
    if (wgmma >= 2 && D != 128) return cudaErrorInvalidValue;
    if (wgmma == 12) {                   // tensor copies: a contiguous cache and 4 warps, else as 2
        if constexpr (!PAGED && D == 128) {
            if (num_warps == 4) return launch_gqa_tma<D, 4>(gqa_tma_kernel<D, 4>, p, stream, m_blocks);
        }
        wgmma = 2;
    }
    if (wgmma == 3 && !PAGED && num_warps == 4 && tail_row_blocks(M, bm) > 0) {
        if constexpr (!PAGED && D == 128) return launch_gqa<D, 4, false, 3>(p, stream, tail_row_blocks(M, bm));
    }
    if (wgmma == 3) wgmma = 2;
    if (wgmma == 6) {                    // the sum-checked softmax: the pipelined kernel's shapes
        if constexpr (D == 128) {
#ifdef TVA_TMA
            if (!PAGED && num_warps == 4) return launch_gqa_tma<D, 4>(gqa_tma_kernel<D, 4, true>, p, stream, m_blocks);
#endif
            if (num_warps == 4) return launch_gqa<D, 4, PAGED, 6>(p, stream, m_blocks);
            if (num_warps == 8) return launch_gqa<D, 8, PAGED, 6>(p, stream, m_blocks);
        }
        return cudaErrorInvalidValue;
    }
    switch (num_warps * 4 + wgmma) {
        case 8: return launch_gqa<D, 2, PAGED, 0>(p, stream, m_blocks);
        case 16: return launch_gqa<D, 4, PAGED, 0>(p, stream, m_blocks);
        case 17: return launch_gqa<D, 4, PAGED, 1>(p, stream, m_blocks);
        case 18:
#ifdef TVA_TMA
            if constexpr (!PAGED && D == 128) return launch_gqa_tma<D, 4>(gqa_tma_kernel<D, 4>, p, stream, m_blocks);
#endif
            return launch_gqa<D, 4, PAGED, D == 128 ? 2 : 1>(p, stream, m_blocks);
        case 32: return launch_gqa<D, 8, PAGED, 0>(p, stream, m_blocks);
        case 33: return launch_gqa<D, 8, PAGED, 1>(p, stream, m_blocks);
        case 34: return launch_gqa<D, 8, PAGED, D == 128 ? 2 : 1>(p, stream, m_blocks);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace tva

using tva::AttnParams;

extern "C" {

// Shared-memory bytes the GQA kernel needs (for occupancy planning on the Python side).
int tva_gqa_smem_bytes(int head_dim, int num_warps, int wgmma) {
    const int q = 16 * num_warps * head_dim * 2;
    return q + 3 * 2 * tva::BN * head_dim * 2 + (wgmma ? 1024 : 0);
}

int tva_mla_smem_bytes() { return tva::mla::SMEM; }

// CTAs of the GQA kernel that fit on one multiprocessor (0 on error, an unknown wgmma code
// included). wgmma 3: the tail kernel's where it may run, else the plain pipelined kernel's.
int tva_gqa_occupancy(int head_dim, int num_warps, int paged, int wgmma) {
    if (wgmma == 3 && (paged || num_warps != 4 || head_dim != 128)) wgmma = 2;
    if (wgmma == 12) wgmma = 2;          // the tensor-copy kernel: the pipelined kernel's memory
    int blocks = 0;
    const int smem = tva_gqa_smem_bytes(head_dim, num_warps, wgmma);
#define TVA_OCC(D, NW, P, W)                                                                     \
    if (head_dim == D && num_warps == NW && paged == P && wgmma == W) {                          \
        const auto kernel = tva::gqa_variant<D, NW, P, W>();                                     \
        if (tva::prepare(kernel, smem) != cudaSuccess) return 0;                                 \
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, NW * 32, smem);           \
    }
#define TVA_OCC_D(D, P)                                                                          \
    TVA_OCC(D, 2, P, 0) TVA_OCC(D, 4, P, 0) TVA_OCC(D, 8, P, 0) TVA_OCC(D, 4, P, 1)              \
    TVA_OCC(D, 8, P, 1)
    TVA_OCC_D(64, 0) TVA_OCC_D(64, 1) TVA_OCC_D(128, 0) TVA_OCC_D(128, 1)
    TVA_OCC(128, 4, 0, 2) TVA_OCC(128, 8, 0, 2) TVA_OCC(128, 4, 1, 2) TVA_OCC(128, 8, 1, 2)
    TVA_OCC(128, 4, 0, 3)
    TVA_OCC(128, 4, 0, 6) TVA_OCC(128, 8, 0, 6) TVA_OCC(128, 4, 1, 6) TVA_OCC(128, 8, 1, 6)
#undef TVA_OCC_D
#undef TVA_OCC
    return blocks;
}

// Returns a cudaError_t (0 = success). The launch is asynchronous on `stream`.
// wgmma = 0: mma.sync (any GPU from sm_80); 1: S = Q K^T on Hopper's warpgroup MMA (4 or 8 warps;
// a 9.0a build on an sm_90 GPU); 2: P V on it too; 3: as 2, with tail rows where the shape has
// them (a contiguous cache, 4 warps); 6: as 2, with the sum-checked softmax (the tile max only
// where P's sums say m may move); 12: as 2, its K and V tiles by tensor copies (a contiguous
// cache, 4 warps; else as 2). 4, 5 and 7 were variants since removed (measured slower,
// kernels/NOTES.md sessions 26-32; 8, 9 and 10 likewise, later): they, as any other code,
// return cudaErrorInvalidValue.
int tva_gqa_forward(const AttnParams* params, int head_dim, int num_warps, int paged, int wgmma, void* stream) {
    const AttnParams& p = *params;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    cudaError_t err;
    if (head_dim == 64) {
        err = paged ? tva::dispatch_warps<64, true>(p, num_warps, wgmma, s)
                    : tva::dispatch_warps<64, false>(p, num_warps, wgmma, s);
        if (err == cudaSuccess) err = tva::launch_combine<64>(p, s);
    } else if (head_dim == 128) {
        err = paged ? tva::dispatch_warps<128, true>(p, num_warps, wgmma, s)
                    : tva::dispatch_warps<128, false>(p, num_warps, wgmma, s);
        if (err == cudaSuccess) err = tva::launch_combine<128>(p, s);
    } else {
        err = cudaErrorInvalidValue;
    }
    return static_cast<int>(err);
}

// wgmma = 1: S = Q K^T on Hopper's warpgroup MMA (a 9.0a build on an sm_90 GPU); 2: P V on it too;
// 12: as 2, its tiles by tensor copies (mla_tma_kernel; a paged cache: as 2).
int tva_mla_forward(const AttnParams* params, int paged, int wgmma, void* stream) {
    const AttnParams& p = *params;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const int M = static_cast<int>(p.heads_q * p.tokens);
    dim3 grid((M + tva::mla::BM - 1) / tva::mla::BM, static_cast<unsigned>(p.num_splits), static_cast<unsigned>(p.batch));
    cudaError_t err;
#define TVA_MLA(P, W)                                                                            \
    if (paged == P && wgmma == W) {                                                              \
        auto kernel = tva::mla_variant<P, W>();                                                  \
        err = tva::prepare(kernel, tva::mla::SMEM);                                              \
        if (err == cudaSuccess) TVA_LAUNCH(kernel, grid, tva::mla::NT, tva::mla::SMEM, s, p);    \
    }
    err = cudaErrorInvalidValue;
#ifdef TVA_TMA
    const bool tma = wgmma == 2 || wgmma == 12;   // the tensor-copy build sends wgmma_pv there too
#else
    const bool tma = wgmma == 12;
#endif
    if (wgmma == 12) wgmma = 2;
    if (tma && paged == 0) {
        err = tva::launch_mla_tma(p, s, grid);
        if (err == cudaSuccess) err = tva::launch_combine<tva::mla::DV>(p, s);
        return static_cast<int>(err);
    }
    TVA_MLA(0, 0) TVA_MLA(0, 1) TVA_MLA(0, 2) TVA_MLA(1, 0) TVA_MLA(1, 1) TVA_MLA(1, 2)
#undef TVA_MLA
    if (err == cudaSuccess) err = launch_status(s);
    if (err == cudaSuccess) err = tva::launch_combine<tva::mla::DV>(p, s);
    return static_cast<int>(err);
}

const char* tva_error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

int tva_struct_size() { return static_cast<int>(sizeof(AttnParams)); }

// The size of a trace build's row (kernels/trace.cuh), which custom_verify.py mirrors.
int tva_trace_row_size() { return static_cast<int>(sizeof(trace::Row)); }

// A trace build's rows into `dst` (at most `max_rows`), and the count reset for the next read.
// Returns the rows recorded since the last read (more than `max_rows` or trace::ROWS: some were
// dropped), -1 where this is not a trace build, -2 where a copy failed.
int tva_trace_read(void* dst, int max_rows) {
#if defined(TVA_TRACE)
    unsigned int n = 0;
    cudaError_t err = cudaMemcpyFromSymbol(&n, trace::count, sizeof(n));
    const int kept = static_cast<int>(n < static_cast<unsigned>(trace::ROWS) ? n : trace::ROWS);
    const int copy = kept < max_rows ? kept : max_rows;
    if (err == cudaSuccess && copy > 0) err = cudaMemcpyFromSymbol(dst, trace::rows, copy * sizeof(trace::Row));
    const unsigned int zero = 0;
    if (err == cudaSuccess) err = cudaMemcpyToSymbol(trace::count, &zero, sizeof(zero));
    return err == cudaSuccess ? static_cast<int>(n) : -2;
#else
    (void)dst;
    (void)max_rows;
    return -1;
#endif
}

}  // extern "C"
