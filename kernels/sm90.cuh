// Hopper's asynchronous machinery as the kernels of this repository use it: programmatic
// dependent launch, mbarriers, tensor copies (TMA), warpgroup MMA bookkeeping and the
// shared-memory operand descriptor. Included by kernels/verify/verify_attention.cu,
// kernels/linear/stream_linear.cu and kernels/tree/tree_build.cu (kernels/build.py keys its
// cached builds on this file too).
//
// Under -DTVA_EMULATE (the tests' CPU builds) tests/kernels/emulator/cuda_emulation.h, included
// first, defines the device functions below under the same names, and launches go through its
// emu::launch; the tensor-map encoder and the descriptor arithmetic serve both builds.
#pragma once

#include <stdint.h>

#ifndef TVA_EMULATE
#include <cuda.h>               // CUtensorMap
#include <cuda_runtime.h>

// Programmatic dependent launch on sm_90+ (kernels/pdl.py): the kernel may be scheduled while the
// one before it on the stream finishes; each kernel waits for it (griddepcontrol.wait) before it
// touches what that kernel wrote. Elsewhere, or with `pdl` false, a plain launch. The launch's
// error is the runtime's last error.
template <typename Kernel, typename Params>
static void pdl_launch(Kernel kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, const Params& p,
                       bool pdl = true) {
    int device = 0, major = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = pdl && major >= 9 ? 1 : 0;
    cudaLaunchKernelEx(&cfg, kernel, p);
}

#endif  // !TVA_EMULATE

// cuTensorMapEncodeTiled, from the driver (the runtime links no libcuda; its entry point since
// CUDA 12.0; null where the driver lacks it), or the emulator's.
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
#ifdef TVA_EMULATE
static EncodeTiled encode_tiled() { return cuTensorMapEncodeTiled; }
#else
static EncodeTiled encode_tiled() {
    static const EncodeTiled fn = [] {
        void* f = nullptr;
        cudaDriverEntryPointQueryResult found;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found) !=
                cudaSuccess || found != cudaDriverEntryPointSuccess)
            return static_cast<EncodeTiled>(nullptr);
        return reinterpret_cast<EncodeTiled>(f);
    }();
    return fn;
}

// Hopper warpgroup MMA exists in the arch-specific target only (sm_90a); elsewhere the wgmma
// wrappers compile to nothing or trap, and the Python side never launches them.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TVA_WGMMA 1
#endif

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Wait until the kernel before this one on the stream has finished and its writes are visible
// (a no-op unless launched with PDL); let the next kernel launch early.
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void griddep_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// mbarriers and tensor copies (sm_90+): a copy of a box through a tensor map completes `bytes`
// of its barrier's expected transactions; a phase completes when its arrivals are in and its
// bytes have landed, and mbar_wait returns once the phase of `parity` has completed.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void fence_mbarrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile(
        "{\n.reg .pred done;\nTVA_WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra TVA_WAIT;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
// A 2-d or 4-d box (coords innermost first) into shared memory at `dst`.
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, const int32_t (&c)[2], uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst), "l"(map), "r"(c[0]), "r"(c[1]), "r"(bar) : "memory");
#else
    __trap();
#endif
}
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, const int32_t (&c)[4], uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst), "l"(map), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]),
        "r"(bar) : "memory");
#else
    __trap();
#endif
}

// A tensor map's 128-byte descriptor fetched ahead of its first copy (first thing in a kernel,
// as CUTLASS does): otherwise the first box waits for that fetch.
__device__ __forceinline__ void prefetch_tensormap(const CUtensorMap* map) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
#endif
}

// `bytes` (a multiple of 16) from global `src` into shared memory at `dst`, both 16-byte aligned,
// completing as many of the barrier's expected transaction bytes (cp.async.bulk, no tensor map).
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar) : "memory");
#else
    __trap();
#endif
}

// A 2-d box from shared memory at `src` (rows of the box's inner extent one after another) to
// the tensor at `c`; elements outside the tensor are not written. The copy joins this thread's
// open bulk group: bulk_commit closes it, bulk_wait_read<N> returns once every group but the N
// newest has read its shared memory (which may be written again, or freed at exit, only then).
__device__ __forceinline__ void tma_store(const CUtensorMap* map, const int32_t (&c)[2], uint32_t src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(map),
                 "r"(c[0]), "r"(c[1]), "r"(src) : "memory");
#else
    __trap();
#endif
}
__device__ __forceinline__ void bulk_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
#endif
}

// Proxy fences: this thread's generic-proxy writes to shared memory made visible to the async
// proxy (a tensor store's or wgmma's reads of them, once a barrier follows); and global memory
// written through the generic proxy (other CTAs' stores this thread has acquired) ordered
// before this thread's async-proxy reads of it (bulk copies).
// (The shared-memory fence is emitted for sm_90a only, where this repository's async-proxy
// readers of shared memory, wgmma and the stream-K GEMM's tensor store, are built.)
__device__ __forceinline__ void fence_proxy_async() {
#ifdef TVA_WGMMA
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void fence_proxy_async_global() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
#endif
}

// A barrier of `threads` threads under id 1-15 (0 is __syncthreads); an arrival that does not
// wait (its writes before it are ordered before what the threads that sync there do after).
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void wgmma_fence() {
#ifdef TVA_WGMMA
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#ifdef TVA_WGMMA
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#ifdef TVA_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
#endif  // !TVA_EMULATE

// A launch's error (the runtime's last error); in a debug build (TVA_DEBUG: kernels/build.py's
// HARNESS_KERNEL_DEBUG) the launcher also waits for the kernel and returns its execution error,
// so a fault is pinned to the launch that made it (not graph-capturable).
static cudaError_t launch_status(cudaStream_t stream) {
    cudaError_t err = cudaGetLastError();
#if defined(TVA_DEBUG) && !defined(TVA_EMULATE)
    if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
#else
    (void)stream;
#endif
    return err;
}

// Shared-memory matrix descriptor for wgmma: K-major operand, 128-byte swizzle, rows of 128
// bytes (64 bf16), groups of 8 rows 1024 bytes apart (the stride byte offset); the leading
// byte offset is unused in this mode. Bits: start address >> 4 [0, 14), LBO >> 4 [16, 30),
// SBO >> 4 [32, 46), layout 1 = 128-byte swizzle [62, 64). The swizzle XORs address bits [4, 7)
// with bits [7, 10): tiles must start 1024-byte aligned; chunk c of row r sits at c ^ (r & 7).
__host__ __device__ __forceinline__ uint64_t desc_kmajor_sw128(uint32_t smem_byte_addr) {
    return static_cast<uint64_t>((smem_byte_addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(1) << 16) |
           (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}
