// Emulator-only kernel in the shape of FlashAttention-3's warp specialisation, to exercise the
// emulator's named barriers and setmaxnreg with its mbarriers and tensor copies: warpgroup 0
// produces (tensor copies of tile t into a ring of stages, each stage's "full" barrier taking
// the bytes, its "empty" barrier waited for before reuse), warpgroups 1 and 2 consume every
// tile (the even and the odd columns' sums) and take turns in a section ordered by two named
// barriers (the ping-pong FA3 schedules its MMAs with).
// tests/kernels/test_warp_specialized_emulated.py checks the sums, the turns, and what the
// emulator refuses.
#include "cuda_emulation.h"

namespace {

constexpr int COLS = 64, ROWS = 8, STAGES = 2, TILE_BYTES = COLS * ROWS * 2;

struct Params {
    float* sums;               // [2][tiles]: consumer c's sum of tile t's columns of parity c
    int* turns;                // [2 tiles]: who ran the ordered section, in order (c * 1000 + t)
    // consumer_waits: 1 wait for the tile, read it, release it; 0 read before the wait (a
    // mutant); 2 wait, release, then read (a mutant: the stage may be refilled under the read)
    int tiles, consumer_waits, producer_regs, consumer_regs;
    CUtensorMap map;           // the tiles: [tiles * ROWS][COLS] bf16, a box a tile
};

inline float bf16_at(uint32_t addr) {
    uint16_t h;
    std::memcpy(&h, emu::smem_at(addr, 2), 2);
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

__global__ void producer_consumer_kernel(const __grid_constant__ Params p) {
    const uint32_t base = (smem_addr(emu::shared_memory()) + 1023u) & ~1023u;
    const uint32_t full = base, empty = base + 8 * STAGES, turn_counter = base + 16 * STAGES;
    const uint32_t stage0 = base + 1024;
    const int tid = static_cast<int>(threadIdx.x), group = tid / 128, gtid = tid % 128;
    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full + 8 * s, 1);
            mbar_init(empty + 8 * s, 256);      // every consumer thread releases the stage
        }
        fence_mbarrier_init();
        std::memset(emu::smem_at(turn_counter, 4), 0, 4);
    }
    __syncthreads();
    if (group == 0) {
        if (p.producer_regs) {
            switch (p.producer_regs) {
                case 40: setmaxnreg_dec<40>(); break;
                default: setmaxnreg_dec<24>(); break;
            }
        }
        if (gtid == 0) {
            for (int t = 0; t < p.tiles; ++t) {
                const int s = t % STAGES;
                // The stage's previous use released (its first use: the phase before, complete).
                mbar_wait(empty + 8 * s, static_cast<uint32_t>(t / STAGES + 1) & 1u);
                mbar_arrive_expect_tx(full + 8 * s, TILE_BYTES);
                const int32_t at[2] = {0, t * ROWS};
                tma_load(stage0 + s * TILE_BYTES, &p.map, at, full + 8 * s);
            }
        }
        return;
    }
    const int c = group - 1, other = 1 - c;
    if (p.consumer_regs) {
        switch (p.consumer_regs) {
            case 232: setmaxnreg_inc<232>(); break;
            default: setmaxnreg_inc<256>(); break;
        }
    }
    if (c == 1) named_barrier_arrive(1, 256);      // consumer 0 takes the first turn
    for (int t = 0; t < p.tiles; ++t) {
        const int s = t % STAGES;
        const uint32_t parity = static_cast<uint32_t>(t / STAGES) & 1u;
        if (p.consumer_waits) mbar_wait(full + 8 * s, parity);
        if (p.consumer_waits == 2) mbar_arrive(empty + 8 * s);
        float v = 0.f;                                 // this thread's share: 2 elements
        for (int i = gtid; i < ROWS * COLS / 2; i += 128) {
            const int row = (2 * i) / COLS, col = (2 * i) % COLS + c;
            v += bf16_at(stage0 + s * TILE_BYTES + (row * COLS + col) * 2);
        }
        if (!p.consumer_waits) mbar_wait(full + 8 * s, parity);    // the mutant: read, then wait
        if (p.consumer_waits != 2) mbar_arrive(empty + 8 * s);
        // The ordered section: turn (c, t) after the other's turn (c', t) or (c', t - 1).
        named_barrier_sync(1 + c, 256);
        if (gtid == 0) {
            int k;
            std::memcpy(&k, emu::smem_at(turn_counter, 4), 4);
            p.turns[k] = c * 1000 + t;
            ++k;
            std::memcpy(emu::smem_at(turn_counter, 4), &k, 4);
        }
        named_barrier_arrive(1 + other, 256);
        // The group's shares summed in global memory (exact: small integers; the emulator runs a
        // thread until it yields, so a plain add does not interleave with another's).
        p.sums[c * p.tiles + t] += v;
    }
}

}  // namespace

// Tiles [tiles * ROWS][COLS] bf16 at src. Returns the launch's status (0: ok).
extern "C" int probe_producer_consumer(const uint16_t* src, float* sums, int* turns, int tiles, int consumer_waits,
                                       int producer_regs, int consumer_regs) {
    Params p{sums, turns, tiles, consumer_waits, producer_regs, consumer_regs, {}};
    const cuuint64_t dims[2] = {COLS, static_cast<cuuint64_t>(tiles * ROWS)};
    const cuuint64_t strides[1] = {COLS * 2};
    const cuuint32_t box[2] = {COLS, ROWS}, unit[2] = {1, 1};
    const CUresult rc = cuTensorMapEncodeTiled(&p.map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<uint16_t*>(src),
                                               dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                               CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (rc != CUDA_SUCCESS) return 100 + rc;
    emu::launch(producer_consumer_kernel, dim3(1), dim3(384), 1024 + 1024 + STAGES * TILE_BYTES, p);
    return cudaGetLastError();
}
