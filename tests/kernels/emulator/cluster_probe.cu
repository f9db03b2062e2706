// Emulator-only kernel that exercises its thread block clusters: each block writes its shared
// memory, meets the others at the cluster barrier, reads the next block's shared memory through
// map_shared_rank (distributed shared memory) and meets them again before exiting (a block's
// shared memory must outlive the others' reads of it). tests/kernels/test_cluster_emulated.py
// runs it with and without the barriers, and with threads that exit before them.
#include "cuda_emulation.h"

namespace {

struct Params {
    float* out;          // [blocks][threads]: what each thread read from the next block
    int32_t* ranks;      // [blocks][2]: %cluster_ctarank, %cluster_nctarank
    int sync_first;      // 0: read the next block without the barrier between
    int exit_early;      // > 0: threads at or past it exit before the barriers
};

__global__ void next_block_kernel(const __grid_constant__ Params p) {
    float* mine = reinterpret_cast<float*>(emu::shared_memory());
    const int tid = static_cast<int>(threadIdx.x), n = static_cast<int>(blockDim.x);
    const unsigned rank = cluster_ctarank(), size = cluster_nctarank();
    const int block = static_cast<int>(blockIdx.x);
    if (tid == 0) p.ranks[2 * block] = static_cast<int32_t>(rank), p.ranks[2 * block + 1] = static_cast<int32_t>(size);
    if (p.exit_early > 0 && tid >= p.exit_early) return;
    mine[tid] = static_cast<float>(1000 * block + tid);
    if (p.sync_first) cluster_sync();
    const float* next = map_shared_rank(mine, (rank + 1) % size);
    p.out[block * n + tid] = next[tid];
    cluster_sync();                // the next block has read this one's shared memory
}

}  // namespace

extern "C" int probe_next_block(float* out, int32_t* ranks, int blocks, int threads, int cluster, int sync_first,
                                int exit_early) {
    Params p{out, ranks, sync_first, exit_early};
    emu::launch(next_block_kernel, dim3(static_cast<unsigned>(blocks)), dim3(static_cast<unsigned>(threads)),
                static_cast<size_t>(threads) * 4, p, static_cast<unsigned>(cluster));
    return cudaGetLastError();
}
