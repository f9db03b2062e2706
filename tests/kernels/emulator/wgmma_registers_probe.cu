// Emulator-only kernel for the rule on a warpgroup MMA's register operand: the GPU reads A from
// the issuing threads' registers asynchronously, until the wgmma.wait_group that retires it, so a
// thread that writes them earlier (a P tile packed into the registers a P V product still in
// flight reads) gets an undefined result, which the emulator makes NaN.
// tests/kernels/test_wgmma_registers_emulated.py writes them after the wait (fine) and before it.
#include "cuda_emulation.h"
#include "../../../kernels/sm90.cuh"     // desc_kmajor_sw128

namespace {

struct Params {
    float* out;             // [128]: each thread's first output of D = A B (B zeros: 0 or NaN)
    int write_before_wait;  // 1: thread 0 .. `writers` - 1 change their A registers before the wait
    int writers;
};

__global__ void register_a_kernel(const __grid_constant__ Params p) {
    uint8_t* smem = emu::shared_memory();
    const int tid = static_cast<int>(threadIdx.x);
    const uint32_t base = (smem_addr(smem) + 1023u) & ~1023u;   // B: 64 x 16 bf16 zeros, swizzled
    uint8_t* b = smem + (base - smem_addr(smem));
    for (int i = tid; i < 64 * 128 / 4; i += 128) reinterpret_cast<uint32_t*>(b)[i] = 0u;
    __syncthreads();
    uint32_t a[4] = {0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u};   // bf16 ones
    float d[8][4];
    wgmma_fence();
    wgmma_m64n64k16(d, a, desc_kmajor_sw128(base), 0);
    wgmma_commit();
    const bool writer = tid < p.writers;
    if (p.write_before_wait && writer) a[1] ^= 0x00010000u;
    wgmma_wait<0>();
    if (!p.write_before_wait && writer) a[1] ^= 0x00010000u;
    p.out[tid] = d[0][0];
}

}  // namespace

extern "C" int probe_register_a(float* out, int write_before_wait, int writers) {
    Params p{out, write_before_wait, writers};
    emu::launch(register_a_kernel, dim3(1), dim3(128), 2048 + 64 * 128, p);
    return cudaGetLastError();
}
