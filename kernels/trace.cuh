// Per-CTA timestamps for a trace build: where a kernel's time goes, CTA by CTA, between its
// start, its wait for the kernel before it (programmatic dependent launch), its phases and its
// end. A profiler gives a kernel's span only, and with PDL the spans of neighbouring kernels
// overlap (a kernel's CTAs start while the one before still runs, and wait), so the span says
// neither how long the work took nor how long the wait.
//
// Built only with -DTVA_TRACE (kernels/build.py: HARNESS_KERNEL_TRACE=1, a cache entry of its
// own); in every other build `begin` returns -1 and `stamp` / `end` are empty, so the kernels'
// machine code is what it is without this file. kernels/verify/anatomy.py reads the rows.
//
// Thread 0 of each traced CTA takes the next row (an atomic counter), writes %globaltimer (ns,
// one clock for the whole GPU: when a CTA started and ended against the others) and %clock64 at
// each stamp (its multiprocessor's cycles: the phases inside a CTA, at a finer grain than the
// global timer's). Rows past ROWS are dropped (and counted: `tva_trace_read` returns the count).
#pragma once

#include <stdint.h>

namespace trace {

constexpr int ROWS = 1 << 15;
constexpr int STAMPS = 6;

// Mirrored by kernels/verify/custom_verify.py (_TraceRow): keep the two in step.
struct Row {
    uint64_t start_ns, end_ns;      // %globaltimer at `begin` and at `end`
    int64_t clock[STAMPS];          // %clock64 at stamp i (0: begin; unset stamps 0)
    uint32_t kernel, sm;            // the caller's kernel id; %smid
    uint32_t block[3];              // blockIdx
    uint32_t pad;
};

#if defined(TVA_TRACE) && !defined(TVA_EMULATE)
__device__ Row rows[ROWS];
__device__ unsigned int count;

__device__ __forceinline__ uint64_t global_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// The row of this CTA (thread 0; -1 for the other threads and past ROWS).
__device__ __forceinline__ int begin(uint32_t kernel) {
    if (threadIdx.x != 0) return -1;
    const unsigned r = atomicAdd(&count, 1u);
    if (r >= ROWS) return -1;
    Row& w = rows[r];
    w.start_ns = global_ns();
    w.clock[0] = clock64();
    for (int i = 1; i < STAMPS; ++i) w.clock[i] = 0;
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    w.kernel = kernel;
    w.sm = sm;
    w.block[0] = blockIdx.x;
    w.block[1] = blockIdx.y;
    w.block[2] = blockIdx.z;
    return static_cast<int>(r);
}

__device__ __forceinline__ void stamp(int row, int i) {
    if (row >= 0) rows[row].clock[i] = clock64();
}

__device__ __forceinline__ void end(int row, int i) {
    if (row >= 0) {
        rows[row].clock[i] = clock64();
        rows[row].end_ns = global_ns();
    }
}
#else
__device__ __forceinline__ constexpr int begin(uint32_t) { return -1; }
__device__ __forceinline__ void stamp(int, int) {}
__device__ __forceinline__ void end(int, int) {}
#endif

}  // namespace trace
