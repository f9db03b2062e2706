// Emulator-only kernels that exercise its mbarrier and tensor-copy (TMA) model: a box read
// through a tensor map into swizzled shared memory, two phases of one barrier, a read that does
// not wait, and a bulk load out again by a tensor store. tests/kernels/test_tma_emulated.py runs
// them against numpy's view of the same tensor.
#include "cuda_emulation.h"

namespace {

struct Params {
    const uint16_t* src;       // [d2][d1][d0] 16-bit elements
    uint16_t* out;             // [2][box1][box0]: the two boxes as the kernel read them
    int64_t d0, d1, d2;
    int32_t c0, c1, c2;        // the first box's coordinates; the second is (0, 0, 1)
    int32_t box0, box1;
    int32_t swizzle, read_swizzled, wait_first;   // read_swizzled: how the kernel reads the box back
    CUtensorMap map;
};

// The element (row, col) of a box of `box0`-wide rows landed at shared address `dst`.
inline uint16_t box_at(uint32_t dst, int row, int col, int box0, bool swizzle) {
    uint32_t a = dst + static_cast<uint32_t>((row * box0 + col) * 2);
    if (swizzle) a ^= ((a >> 7) & 7u) << 4;
    uint16_t v;
    std::memcpy(&v, emu::smem_at(a, 2), 2);
    return v;
}

__global__ void two_boxes_kernel(const __grid_constant__ Params p) {
    const uint32_t base = (smem_addr(emu::shared_memory()) + 1023u) & ~1023u;
    const uint32_t bar = base, dst = base + 1024;
    const int tid = static_cast<int>(threadIdx.x), n = p.box0 * p.box1;
    const uint32_t bytes = static_cast<uint32_t>(n * 2);
    if (tid == 0) {
        mbar_init(bar, 1);
        fence_mbarrier_init();
    }
    __syncthreads();
    for (int phase = 0; phase < 2; ++phase) {
        if (tid == 0) {
            const int32_t first[3] = {p.c0, p.c1, p.c2}, second[3] = {0, 0, 1};
            mbar_arrive_expect_tx(bar, bytes);
            tma_load(dst, &p.map, phase ? second : first, bar);
        }
        if (p.wait_first) mbar_wait(bar, static_cast<uint32_t>(phase));
        for (int i = tid; i < n; i += static_cast<int>(blockDim.x))
            p.out[phase * n + i] = box_at(dst, i / p.box0, i % p.box0, p.box0, p.read_swizzled != 0);
        if (!p.wait_first) mbar_wait(bar, static_cast<uint32_t>(phase));
        __syncthreads();      // everyone has read the box before the next one lands on it
    }
}

}  // namespace

extern "C" int probe_two_boxes(const uint16_t* src, uint16_t* out, int64_t d0, int64_t d1, int64_t d2,
                               int c0, int c1, int c2, int box0, int box1, int swizzle, int read_swizzled,
                               int wait_first) {
    Params p{src, out, d0, d1, d2, c0, c1, c2, box0, box1, swizzle, read_swizzled, wait_first, {}};
    const cuuint64_t dims[3] = {static_cast<cuuint64_t>(d0), static_cast<cuuint64_t>(d1), static_cast<cuuint64_t>(d2)};
    const cuuint64_t strides[2] = {static_cast<cuuint64_t>(d0 * 2), static_cast<cuuint64_t>(d0 * d1 * 2)};
    const cuuint32_t box[3] = {static_cast<cuuint32_t>(box0), static_cast<cuuint32_t>(box1), 1};
    const cuuint32_t unit[3] = {1, 1, 1};
    const CUresult rc = cuTensorMapEncodeTiled(&p.map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<uint16_t*>(src),
                                               dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                               swizzle ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                                               CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (rc != CUDA_SUCCESS) return 100 + rc;
    emu::launch(two_boxes_kernel, dim3(1), dim3(128), 2048 + static_cast<size_t>(box0 * box1 * 2) + 1024, p);
    return cudaGetLastError();
}

// cuTensorMapEncodeTiled's answer for a 2-D bf16 tensor of these parameters (0: accepted).
extern "C" int probe_encode(uintptr_t address, uint64_t d0, uint64_t d1, uint64_t stride1, uint32_t box0,
                            uint32_t box1, int swizzle) {
    CUtensorMap map;
    const cuuint64_t dims[2] = {d0, d1}, strides[1] = {stride1};
    const cuuint32_t box[2] = {box0, box1}, unit[2] = {1, 1};
    return cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, reinterpret_cast<void*>(address), dims,
                                  strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                  swizzle ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                                  CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

// The bulk copies' other two directions: `bytes` of `src` into shared memory by one bulk load
// (cp.async.bulk), then that shared memory, as a box of box0 x box1 16-bit elements, out to the
// 2-d tensor `dst` [d1][d0] at (c0, c1) by a tensor store. With `overwrite` thread 0 writes the
// box's first element again (as 0x7777) after issuing the store and before its wait; with
// `skip_wait` it never waits.
namespace {
struct StoreParams {
    const uint16_t* src;
    uint16_t* dst;
    uint32_t bytes;
    int32_t c0, c1, overwrite, skip_wait;
    CUtensorMap map;
};

__global__ void load_then_store_kernel(const __grid_constant__ StoreParams p) {
    const uint32_t base = (smem_addr(emu::shared_memory()) + 1023u) & ~1023u;
    const uint32_t bar = base, box = base + 1024;
    if (threadIdx.x == 0) {
        mbar_init(bar, 1);
        fence_mbarrier_init();
        mbar_arrive_expect_tx(bar, p.bytes);
        bulk_load(box, p.src, p.bytes, bar);
    }
    __syncthreads();
    mbar_wait(bar, 0);
    fence_proxy_async();
    __syncthreads();
    if (threadIdx.x == 0) {
        const int32_t at[2] = {p.c0, p.c1};
        tma_store(&p.map, at, box);
        bulk_commit();
        if (p.overwrite) {
            const uint16_t v = 0x7777;
            std::memcpy(emu::smem_at(box, 2), &v, 2);
        }
        if (!p.skip_wait) bulk_wait_read<0>();
    }
}
}  // namespace

extern "C" int probe_load_then_store(const uint16_t* src, uint16_t* dst, int64_t d0, int64_t d1, int c0, int c1,
                                     int box0, int box1, int overwrite, int skip_wait) {
    StoreParams p{src, dst, static_cast<uint32_t>(box0 * box1 * 2), c0, c1, overwrite, skip_wait, {}};
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(d0), static_cast<cuuint64_t>(d1)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(d0 * 2)};
    const cuuint32_t box[2] = {static_cast<cuuint32_t>(box0), static_cast<cuuint32_t>(box1)}, unit[2] = {1, 1};
    const CUresult rc = cuTensorMapEncodeTiled(&p.map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, dst, dims, strides, box,
                                               unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                               CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (rc != CUDA_SUCCESS) return 100 + rc;
    emu::launch(load_then_store_kernel, dim3(1), dim3(64), 2048 + static_cast<size_t>(p.bytes), p);
    return cudaGetLastError();
}
