// CPU stand-ins for the CUDA builtins and PTX helpers that kernels/verify/verify_attention.cu uses, so
// its kernels run, unchanged, on a machine without a GPU (tests only; build with -DTVA_EMULATE).
//
// - Every CUDA thread of a block is a fiber (ucontext) on one OS thread; a scheduler runs them
//   round-robin between barriers. __syncthreads is a barrier of the block's live threads;
//   warp-wide operations are barriers of the warp's 32 lanes around an exchange of values.
//   (On x86-64 the fibers switch with a few instructions of assembly; elsewhere with
//   swapcontext, which also saves the signal mask: correct, only slower.)
// - ldmatrix (.x4, plain and .trans), mma.sync.m16n8k16.row.col bf16->fp32 and shfl.xor follow
//   the fragment layouts of the PTX ISA: the emulator reassembles whole matrices from the
//   lanes' registers, so a kernel that indexes them wrongly computes the wrong numbers here too.
// - wgmma.mma_async m64n64k16 (A in registers, B through a K-major 128-byte-swizzle shared-memory
//   descriptor), m64n128k16 with an MN-major B (imm-trans-b 1), m64n32k16 and m64n64k16 with both
//   operands by descriptor, m64n256k16 with both by descriptor, B MN-major, and m64n8k16 with
//   both by descriptor, A K-major or MN-major (imm-trans-a 1), are asynchronous, as on the GPU: the issue is a barrier of the
//   warpgroup's 128 threads that reads the A registers (and checks the descriptors agree); each
//   thread queues its share and runs it at its own wgmma.wait_group that retires the group: only
//   there are the shared-memory operands read and the accumulator written. An operand value that
//   changed between issue and that wait (a stage overwritten by a warp already past its own wait,
//   a tile still landing, or the thread's own A registers written before the wait) turns the
//   outputs it feeds into NaN, since the GPU may read it at either time. A thread that exits
//   with MMAs never waited for aborts. The descriptor is decoded bit by bit and the swizzle
//   applied to absolute shared addresses.
// - cp.async copies are queued per thread and land as late as the rules allow: at the
//   cp.async.wait_group that retires their group (TVA_EMU_EARLY=1: at issue instead). A kernel
//   that reads a tile before waiting for it reads the poison (0xff bytes: bf16 NaN).
// - mbarriers (init, arrive, arrive.expect_tx, try_wait.parity as mbar_wait) keep their phase,
//   pending arrivals and transaction bytes per shared address; tensor copies (TMA,
//   cp.async.bulk.tensor as tma_load, through a CUtensorMap from cuTensorMapEncodeTiled, which
//   refuses what the driver refuses) read their box at issue, zeros outside the tensor, and land
//   it, 128-byte swizzle applied to absolute shared addresses, at the first wait on their
//   barrier (the latest a waiter that sees the phase complete allows; TVA_EMU_EARLY=1: at
//   issue). A phase that can never complete is a deadlock, reported as one.
// - Bulk copies: cp.async.bulk (bulk_load, contiguous bytes) land like tensor copies; tensor
//   stores (tma_store, 2-d, unswizzled) read shared memory and write the tensor, clipped to it, at
//   the bulk_wait_read that retires their group (the latest the rules allow); a thread that
//   exits before that wait aborts.
// - Thread block clusters (emu::launch's `cluster`, along x): a cluster's blocks run together,
//   their fibers interleaved by one scheduler; cluster_ctarank / cluster_nctarank, the cluster
//   barrier (cluster_arrive / cluster_wait: the threads not exited), map_shared_rank (another
//   block's shared memory by plain loads and stores) and arrivals on another block's mbarrier
//   (mbar_arrive_cluster) follow sm_90's rules.
// - Named barriers 1..15 (named_barrier_sync / _arrive: bar.sync / bar.arrive with a thread
//   count) and setmaxnreg_inc / _dec (every thread of the warpgroup executes it; the block's
//   warpgroups may not budget more than 64 K registers): warp specialisation's pieces.
// - Skew (a non-zero seed) makes the scheduler skip random warps in each round, so warps drift
//   apart between barriers and a missing __syncthreads shows up as wrong numbers.
// - emu_skew_bits(k): a skewed warp runs one round in 2^k (default k = 1); emu_slow_rank(r, n,
//   first): every warp (first = 0: but the first) of the block of rank r in every cluster runs
//   one round in n, so the other blocks (and that first warp) race ahead of them: handshakes
//   between CTAs that only break when one side lags many rounds.
// - emu_configure(early, skew_seed) (extern "C") sets both; the environment variables
//   TVA_EMU_EARLY=1 and TVA_EMU_SKEW=<seed> give the defaults.
// - Shared memory is a poisoned buffer of the launch's dynamic size; every access is bounds
//   checked. A deadlock (threads stuck at different barriers) aborts with a message.
// - Alignment is checked as strictly as the hardware does (a misaligned access there is
//   cudaErrorMisalignedAddress): cp.async 16 (both addresses), ldmatrix row addresses, 4-byte
//   shared stores, and every plain C++ load or store the kernels make through a typed pointer
//   (float2 in shared or global memory, uint32_t output stores, ...): the test build adds
//   -fsanitize=alignment, whose reports land in __ubsan_handle_type_mismatch_v1 below. The
//   dynamic shared window starts where CUDA guarantees no more than its declared 128-byte
//   alignment (shared address 128 modulo 1024), so a kernel assuming 1024 without rounding up
//   misses too. A fault is recorded (the first one's message: emu_last_fault()) and the
//   launcher's cudaGetLastError() returns cudaErrorMisalignedAddress, as on the GPU.
// - Launch configurations are checked as the runtime checks them on an H200: block size, grid
//   y / z <= 65535, and dynamic shared memory <= the kernel's own
//   cudaFuncAttributeMaxDynamicSharedMemorySize (48 KB unless raised; at most 232448), kept per
//   kernel address. A refused launch runs nothing and its cudaGetLastError() is
//   cudaErrorInvalidValue. emu_dry_run(1) validates launches without running any block.
#pragma once

#include <ucontext.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(8) float2 {      // as CUDA's: an 8-byte vector type
    float x, y;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
inline int min(int a, int b) { return a < b ? a : b; }

struct __nv_bfloat16 {
    uint16_t bits;
};
struct __nv_bfloat162 {
    __nv_bfloat16 x, y;
};
inline uint16_t emu_f2bf(float f) {       // round to nearest even, NaN stays NaN
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}
inline float emu_bf2f(uint16_t h) {
    uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) { return {{emu_f2bf(lo)}, {emu_f2bf(hi)}}; }
inline float __log2f(float x) { return std::log2(x); }
template <typename T>
inline T __ldg(const T* p) { return *p; }

// The CUDA runtime, as far as the launchers use it.
typedef int cudaError_t;
typedef void* cudaStream_t;
enum { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMisalignedAddress = 716 };
enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
    cudaFuncAttributeNonPortableClusterSizeAllowed = 12,
};
inline cudaError_t cudaGetDevice(int* d) { *d = 0; return cudaSuccess; }
namespace emu {
// The launch-configuration rules of the CUDA runtime on an H200 (sm_90): a launch that breaks one
// does not run and its cudaGetLastError() is cudaErrorInvalidValue ("invalid argument"), as there.
constexpr int kDefaultDynamicSmem = 48 * 1024;    // without cudaFuncAttributeMaxDynamicSharedMemorySize
constexpr int kOptinDynamicSmem = 232448;         // sharedMemPerBlockOptin on sm_90
constexpr unsigned kMaxGridYZ = 65535, kMaxBlockThreads = 1024;
// The first alignment fault since the last cudaGetLastError() (empty: none).
inline std::string& fault() {
    static std::string first;
    return first;
}
inline void misaligned(const char* what) {
    if (fault().empty()) fault() = what;
}
// A kernel breaking a rule the GPU would fault or hang on, recorded like a misaligned access
// (the launch then returns an error, its message from emu_last_fault()).
inline void fail(const char* what) { misaligned(what); }
// A refused launch since the last cudaGetLastError() (empty: none), and why.
inline std::string& launch_refused() {
    static std::string why;
    return why;
}
inline void refuse(const std::string& why) {
    if (launch_refused().empty()) launch_refused() = why;
    if (fault().empty()) fault() = "launch refused: " + why;
}
// cudaFuncAttributeMaxDynamicSharedMemorySize per kernel (by address), as the runtime keeps it.
inline std::vector<std::pair<const void*, int>>& smem_attributes() {
    static std::vector<std::pair<const void*, int>> a;
    return a;
}
inline int max_dynamic_smem(const void* kernel) {
    for (const auto& kv : smem_attributes())
        if (kv.first == kernel) return kv.second;
    return kDefaultDynamicSmem;
}
// The kernels allowed clusters past the portable 8 (cudaFuncAttributeNonPortableClusterSizeAllowed:
// up to 16 on sm_90).
inline std::vector<const void*>& non_portable_clusters() {
    static std::vector<const void*> k;
    return k;
}
inline unsigned max_cluster(const void* kernel) {
    for (const void* k : non_portable_clusters())
        if (k == kernel) return 16;
    return 8;
}
inline bool& reverse_blocks() {   // run a grid's blocks last to first (kernels whose blocks meet)
    static bool reverse = false;
    return reverse;
}
inline bool& dry_run() {      // validate launches, run no blocks (launch-parameter tests)
    static bool on = false;
    return on;
}
inline long& launches() {     // launches that passed validation
    static long n = 0;
    return n;
}
inline long& tensor_copies() {     // boxes issued through a tensor map (tma_load)
    static long n = 0;
    return n;
}
}  // namespace emu
template <typename K>
inline cudaError_t cudaFuncSetAttribute(K kernel, cudaFuncAttribute attribute, int value) {
    const void* key = reinterpret_cast<const void*>(kernel);
    if (attribute == cudaFuncAttributeNonPortableClusterSizeAllowed) {
        if (value != 0 && value != 1) return cudaErrorInvalidValue;
        auto& k = emu::non_portable_clusters();
        for (size_t i = 0; i < k.size(); ++i)
            if (k[i] == key) k.erase(k.begin() + static_cast<long>(i));
        if (value) k.push_back(key);
        return cudaSuccess;
    }
    if (value < 0 || value > emu::kOptinDynamicSmem) return cudaErrorInvalidValue;
    for (auto& kv : emu::smem_attributes())
        if (kv.first == key) {
            kv.second = value;
            return cudaSuccess;
        }
    emu::smem_attributes().push_back({key, value});
    return cudaSuccess;
}
inline cudaError_t cudaGetLastError() {
    if (!emu::launch_refused().empty()) {
        emu::launch_refused().clear();
        return cudaErrorInvalidValue;
    }
    const bool faulted = !emu::fault().empty();
    return faulted ? cudaErrorMisalignedAddress : cudaSuccess;
}
inline const char* cudaGetErrorString(cudaError_t e) {
    return e == cudaErrorMisalignedAddress ? "misaligned address"
           : e == cudaErrorInvalidValue    ? "invalid argument"
           : e                             ? "emulated error"
                                           : "no error";
}
template <typename K>
inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* n, K, int, size_t) {
    *n = 2;
    return cudaSuccess;
}

#if defined(__x86_64__)
// emu_switch(save, to): push the callee-saved registers, store the stack pointer in *save,
// continue on stack `to` (popping what its own emu_switch pushed, or a fresh fiber's frame).
asm(R"(
.text
.globl emu_switch
.type emu_switch,@function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size emu_switch, .-emu_switch
)");
extern "C" void emu_switch(void** save, void* to);
#define EMU_FAST_SWITCH 1
#endif

namespace emu {

[[noreturn]] inline void die(const char* what) {
    std::fprintf(stderr, "cuda emulation: %s\n", what);
    std::abort();
}

struct Copy {
    uint32_t dst;
    const void* src;
    int bytes;
};

// A thread's share of a warpgroup MMA, queued at issue and run at the wgmma.wait_group that
// retires its group: the A values of the thread's two rows (registers are read at issue; the
// thread's own A registers are also kept, by address and value, and compared when it runs), the
// shared-memory operands by descriptor (read when it runs, and fingerprinted at issue), the
// accumulator it writes.
struct Wgmma {
    // B K-major / B MN-major / A and B K-major / A K-major and B MN-major, both in shared memory
    // / A MN-major and B K-major, both in shared memory
    enum Kind { kRegA, kRegATransB, kSmemA, kSmemATransB, kSmemATransA } kind;
    int n;                    // N of m64nNk16
    int accumulate;
    long group;               // commit groups of this thread before its issue
    float* d;                 // the thread's fragment: N / 8 x 4 floats
    uint64_t desc_a, desc_b;
    float a[2][16];           // rows 16w + lane/4 and + 8, k = 0..15 (kRegA, kRegATransB)
    const uint32_t* a_regs;   // kRegA, kRegATransB: this thread's four A registers, and their
    uint32_t a_seen[4];       // values at issue
    uint64_t seen_a[2];       // kSmemA: fingerprints of those rows of A in shared memory at issue
    uint64_t seen_b[64];      // fingerprints of the thread's columns of B (2 per n-tile) at issue
};

// A tensor store (cp.async.bulk.tensor global.shared::cta): its map's bytes, the box's
// coordinates and shared source, performed (shared memory read, global memory written) at the
// bulk_wait_read that retires its group: the latest the rules allow, so a kernel that writes
// the source again before that wait stores the new bytes here.
struct BulkStore {
    uint64_t map[16];
    int32_t c[2];
    uint32_t src;
};

struct Fiber {
    ucontext_t ctx;
    void* sp = nullptr;
    char* stack = nullptr;
    int tid = 0;
    bool done = false;
    std::vector<Copy> open;
    std::deque<std::vector<Copy>> groups;
    std::deque<Wgmma> mmas;   // issued, not yet run (issue order)
    long mma_commits = 0;     // wgmma.commit_group calls so far
    std::vector<struct BulkStore> stores_open;             // tensor stores of the open bulk group
    std::deque<std::vector<struct BulkStore>> store_groups;   // committed, shared memory not read yet
    bool cluster_arrived = false;   // barrier.cluster.arrive done, its wait not yet
    long cluster_gen = 0;           // the cluster barrier's phase it arrived in
};

// An mbarrier (PTX mbarrier.*): the arrivals still expected in the current phase, the
// transaction bytes still expected, the current phase's parity. A phase completes when both
// reach zero; the arrivals are then expected again.
struct MBarrier {
    uint32_t addr = 0, expected = 0, pending = 0, parity = 0;
    int64_t tx = 0;
};
// A tensor copy (cp.async.bulk.tensor) read from global memory at issue, landing in shared
// memory as late as the rules allow: when a thread waits on its mbarrier, whose transaction
// count it completes then.
struct BulkCopy {
    uint32_t dst = 0, bar = 0;
    std::vector<uint8_t> bytes;    // the box as it lands from `dst` on (swizzle applied)
};

// Shared address of the first byte of dynamic shared memory: 128-byte aligned (what
// `extern __shared__ __align__(128)` promises), not 1024.
constexpr uint32_t kSmemBase = 128;

struct Block {
    dim3 idx, dim;
    std::vector<uint8_t> smem_store;   // host bytes; smem is their 1024-byte aligned part
    uint8_t* smem = nullptr;           // host address of shared address kSmemBase
    size_t smem_size = 0;
    std::vector<Fiber> fibers;
    ucontext_t sched;
    void* sched_sp = nullptr;
    int cur = 0, live = 0;
    long progress = 0;
    int bar_count = 0;
    long bar_gen = 0;
    std::vector<int> warp_count, group_count;
    std::vector<long> warp_gen, group_gen;
    // Named barriers 1..15 (bar.sync / bar.arrive with a thread count; 0 is __syncthreads):
    // arrivals in the current generation, the generation, the count they were given.
    std::array<int, 16> named_count{}, named_threads{};
    std::array<long, 16> named_gen{};
    std::vector<int> group_regs;                    // setmaxnreg's count per warpgroup (0: unset)
    std::vector<std::array<uint32_t, 16>> slots;   // per thread: values it shares with its warp
    std::vector<struct MBarrier> mbarriers;         // by shared address (mbarrier.init)
    std::vector<struct BulkCopy> bulk_copies;       // tensor copies issued, not landed yet
    void (*body)(const void*) = nullptr;
    const void* arg = nullptr;
    struct Cluster* cluster = nullptr;
    unsigned rank = 0;                              // within its cluster (%cluster_ctarank)
};

// A thread block cluster (sm_90): its blocks run together, their threads' fibers interleaved by
// one scheduler, so they can meet at the cluster barrier and read and write each other's shared
// memory. A launch without cluster dimensions runs each block as a cluster of one.
struct Cluster {
    std::vector<Block*> blocks;
    int live = 0;          // threads of all its blocks not exited
    int arrived = 0;       // barrier.cluster arrivals of those threads in this phase
    long gen = 0;          // the barrier's phase
};

inline Block*& current_block() {
    static thread_local Block* b = nullptr;
    return b;
}
inline uint64_t& skew_state() {
    static uint64_t state = [] {
        const char* s = std::getenv("TVA_EMU_SKEW");
        return s ? std::strtoull(s, nullptr, 10) : 0ull;
    }();
    return state;
}
// How hard skew holds warps back: a warp sits out a round unless `bits` random bits are all zero
// (1: about half the warps sit out; 3: seven in eight, so some lag many rounds behind).
inline int& skew_bits() {
    static int bits = 1;
    return bits;
}
// A slow CTA: in the block of this rank in every cluster, every warp (or every warp but the
// first, where a kernel's thread 0 signals for the block) runs one round in `every` (0: none),
// so the other blocks, and that first warp, race ahead of them through every handshake that
// lets them.
struct SlowRank {
    unsigned rank = 0, every = 0;
    bool first_warp_too = true;
};
inline SlowRank& slow_rank() {
    static SlowRank slow;
    return slow;
}
// With skew on: does warp w run in this round? (xorshift)
inline bool skip_warp() {
    uint64_t& x = skew_state();
    if (!x) return false;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return ((x >> 11) & ((1u << skew_bits()) - 1)) != 0;
}
inline bool& late_copies() {
    static bool late = !std::getenv("TVA_EMU_EARLY") || std::getenv("TVA_EMU_EARLY")[0] != '1';
    return late;
}

inline Fiber& me() { return current_block()->fibers[current_block()->cur]; }
inline void to_scheduler(Fiber& f) {
    Block* b = current_block();
#ifdef EMU_FAST_SWITCH
    emu_switch(&f.sp, b->sched_sp);
#else
    swapcontext(&f.ctx, &b->sched);
#endif
}
inline void yield() { to_scheduler(current_block()->fibers[current_block()->cur]); }

inline void barrier(int& count, long& gen, int participants) {
    Block* b = current_block();
    const long mine = gen;
    ++b->progress;
    if (++count == participants) {
        count = 0;
        ++gen;
        return;
    }
    while (gen == mine) yield();
}

inline void syncthreads() {
    Block* b = current_block();
    barrier(b->bar_count, b->bar_gen, b->live);
}
inline int lane() { return me().tid & 31; }
inline int warp() { return me().tid >> 5; }
inline void warp_sync() {
    Block* b = current_block();
    barrier(b->warp_count[warp()], b->warp_gen[warp()], 32);
}
inline std::array<uint32_t, 16>& slot(int l) { return current_block()->slots[warp() * 32 + l]; }
inline void warpgroup_sync() {
    Block* b = current_block();
    barrier(b->group_count[warp() / 4], b->group_gen[warp() / 4], 128);
}

// bar.sync id, threads (wait: true) and bar.arrive id, threads (false): the barrier completes
// when `threads` threads have arrived; a sync waits for that, an arrive does not (a producer
// signals consumers that wait). Refused: an id outside 1..15 (0 is __syncthreads), a count not
// a positive multiple of the warp, arrivals that disagree on the count within one generation.
inline void named_barrier(int id, int threads, bool wait) {
    Block* b = current_block();
    if (id < 1 || id > 15) die("named barrier: id outside 1..15 (0 is __syncthreads)");
    if (threads <= 0 || threads % 32 || threads > static_cast<int>(b->dim.x))
        die("named barrier: thread count not a positive multiple of 32 within the block");
    if (b->named_count[id] > 0 && b->named_threads[id] != threads)
        die("named barrier: arrivals disagree on its thread count");
    b->named_threads[id] = threads;
    const long mine = b->named_gen[id];
    ++b->progress;
    if (++b->named_count[id] == threads) {
        b->named_count[id] = 0;
        ++b->named_gen[id];
        return;
    }
    while (wait && b->named_gen[id] == mine) yield();
}

// setmaxnreg.{inc,dec}.sync.aligned.u32 regs: every thread of the warpgroup executes it (a
// warpgroup barrier here, so a warp that does not hangs the emulation as it would the GPU).
// Refused (the launch reports a fault): a count outside 24..256 or not a multiple of 8, and
// warpgroups whose counts, once all are set, need more than the multiprocessor's 64 K registers.
inline void setmaxnreg(int regs) {
    if (regs < 24 || regs > 256 || regs % 8) fail("setmaxnreg: count outside 24..256 or not a multiple of 8");
    warpgroup_sync();
    Block* b = current_block();
    b->group_regs[warp() / 4] = regs;
    long total = 0;
    for (int r : b->group_regs) {
        if (r == 0) return;
        total += 128L * r;
    }
    if (total > 65536) fail("setmaxnreg: the warpgroups' registers exceed 64 K");
}

inline uint8_t* smem_at(uint32_t addr, uint32_t bytes) {
    Block* b = current_block();
    if (addr < kSmemBase || static_cast<size_t>(addr - kSmemBase) + bytes > b->smem_size)
        die("shared-memory access out of bounds");
    return b->smem + (addr - kSmemBase);
}

// -- cp.async --------------------------------------------------------------------------------
inline void perform(const Copy& c) {
    uint8_t* dst = smem_at(c.dst, 16);
    if (c.bytes) std::memcpy(dst, c.src, 16);
    else std::memset(dst, 0, 16);
}
inline void retire(size_t keep) {
    Fiber& f = me();
    while (f.groups.size() > keep) {
        for (const Copy& c : f.groups.front()) perform(c);
        f.groups.pop_front();
    }
}

// -- launching -------------------------------------------------------------------------------
inline void fiber_main() {
    Block* b = current_block();
    b->body(b->arg);
    Fiber& f = me();
    if (!f.open.empty() || !f.groups.empty()) {   // cp.async never waited for: lands anyway
        f.groups.push_back(f.open);
        f.open.clear();
        retire(0);
    }
    if (!f.mmas.empty()) die("a thread exited with wgmma operations it never waited for (wgmma_wait)");
    if (!f.stores_open.empty() || !f.store_groups.empty())
        die("a thread exited with tensor stores whose shared memory it never waited for (bulk_wait_read)");
    f.done = true;
    --b->live;
    ++b->progress;
    if (b->bar_count > 0 && b->bar_count >= b->live) {   // the exited thread was awaited
        b->bar_count = 0;
        ++b->bar_gen;
    }
    // A block whose threads have all exited has no shared memory any more: poisoned (and its
    // mbarriers gone), so another block of its cluster that reads or arrives there after that
    // sees the poison or dies, as a kernel must not rely on.
    if (b->live == 0) {
        std::fill(b->smem, b->smem + b->smem_size, static_cast<uint8_t>(0xff));
        b->mbarriers.clear();
    }
    // The cluster barrier awaits the threads not exited: an arrival of this phase stops counting.
    Cluster& c = *b->cluster;
    --c.live;
    if (f.cluster_arrived && f.cluster_gen == c.gen) --c.arrived;
    if (c.live > 0 && c.arrived > 0 && c.arrived == c.live) {
        c.arrived = 0;
        ++c.gen;
    }
    to_scheduler(f);
    die("a finished fiber was resumed");
}

// Fiber stacks, reused by every block (allocating and zeroing them per block costs more than
// the emulated kernel).
constexpr size_t kStackBytes = 128 * 1024;
inline char* fiber_stack(unsigned t) {
    static thread_local std::vector<std::unique_ptr<char[]>> pool;
    while (pool.size() <= t) pool.emplace_back(new char[kStackBytes]);
    return pool[t].get();
}

// A block's fibers, ready to run; `stack0`: the first of the fiber stacks its threads take (the
// blocks of a cluster run at once, so each takes its own).
inline void start_block(Block& b, unsigned stack0) {
    b.live = static_cast<int>(b.dim.x);
    b.fibers.resize(b.dim.x);
    b.slots.assign(b.dim.x, {});
    b.warp_count.assign((b.dim.x + 31) / 32, 0);
    b.warp_gen.assign((b.dim.x + 31) / 32, 0);
    b.group_count.assign((b.dim.x + 127) / 128, 0);
    b.group_gen.assign((b.dim.x + 127) / 128, 0);
    b.group_regs.assign((b.dim.x + 127) / 128, 0);
    for (unsigned t = 0; t < b.dim.x; ++t) {
        Fiber& f = b.fibers[t];
        f.tid = static_cast<int>(t);
        f.stack = fiber_stack(stack0 + t);
#ifdef EMU_FAST_SWITCH
        // A frame emu_switch can return into: six zeroed registers, then fiber_main as the
        // return address, placed so fiber_main starts with the stack alignment of a call.
        uintptr_t top = reinterpret_cast<uintptr_t>(f.stack + kStackBytes) & ~uintptr_t(15);
        void** frame = reinterpret_cast<void**>(top - 64);
        for (int i = 0; i < 6; ++i) frame[i] = nullptr;
        frame[6] = reinterpret_cast<void*>(&fiber_main);
        frame[7] = nullptr;
        f.sp = frame;
#else
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack;
        f.ctx.uc_stack.ss_size = kStackBytes;
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, fiber_main, 0);
#endif
    }
}

// Every thread of the cluster's blocks round-robin between barriers, block after block, until
// all have exited.
inline void run_cluster(Cluster& c) {
    c.live = 0;
    for (size_t i = 0; i < c.blocks.size(); ++i) {
        c.blocks[i]->cluster = &c;
        c.blocks[i]->rank = static_cast<unsigned>(i);
        start_block(*c.blocks[i], static_cast<unsigned>(i) * c.blocks[i]->dim.x);
        c.live += c.blocks[i]->live;
    }
    bool all_warps = false;              // after a round without progress, run everyone
    for (long round = 0; c.live > 0; ++round) {
        long before = 0;
        for (Block* b : c.blocks) before += b->progress;
        for (Block* b : c.blocks) {
            const SlowRank& slow = slow_rank();
            const bool slowed = !all_warps && slow.every > 1 && b->rank == slow.rank;
            current_block() = b;
            bool skip = false;
            for (unsigned t = 0; t < b->dim.x; ++t) {
                if (t % 32 == 0)
                    skip = slowed ? (t >= 32 || slow.first_warp_too) && round % slow.every != 0
                                  : !all_warps && skip_warp();
                if (skip || b->fibers[t].done) continue;
                b->cur = static_cast<int>(t);
#ifdef EMU_FAST_SWITCH
                emu_switch(&b->sched_sp, b->fibers[t].sp);
#else
                swapcontext(&b->sched, &b->fibers[t].ctx);
#endif
            }
        }
        long after = 0;
        for (Block* b : c.blocks) after += b->progress;
        if (after == before && all_warps) die("deadlock: threads wait at barriers that cannot complete");
        all_warps = after == before;
    }
    current_block() = nullptr;
}

// A launch of clusters of `cluster` blocks along x (cudaLaunchAttributeClusterDimension; 1: a
// plain launch): the grid's x a multiple of it, at most 8 (the portable cluster size) or 16 for a
// kernel allowed non-portable sizes.
template <typename P>
inline void launch(void (*kernel)(const P), dim3 grid, dim3 block, size_t smem_bytes, const P& p,
                   unsigned cluster = 1) {
    struct Call {
        void (*kernel)(const P);
        const P* p;
        static void body(const void* self) {
            const Call* c = static_cast<const Call*>(self);
            c->kernel(*c->p);
        }
    } call{kernel, &p};
    const unsigned threads = block.x * block.y * block.z;
    const int smem_limit = max_dynamic_smem(reinterpret_cast<const void*>(kernel));
    if (threads == 0 || threads > kMaxBlockThreads)
        return refuse("block of " + std::to_string(threads) + " threads");
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > kMaxGridYZ || grid.z > kMaxGridYZ)
        return refuse("grid " + std::to_string(grid.x) + " x " + std::to_string(grid.y) + " x " +
                      std::to_string(grid.z) + " (y and z at most 65535)");
    if (smem_bytes > static_cast<size_t>(smem_limit))
        return refuse(std::to_string(smem_bytes) + " bytes of dynamic shared memory, the kernel's limit is " +
                      std::to_string(smem_limit) + " (cudaFuncAttributeMaxDynamicSharedMemorySize)");
    const unsigned cluster_limit = max_cluster(reinterpret_cast<const void*>(kernel));
    if (cluster == 0 || cluster > cluster_limit || grid.x % cluster)
        return refuse("clusters of " + std::to_string(cluster) + " blocks over a grid of " + std::to_string(grid.x) +
                      " (at most " + std::to_string(cluster_limit) + ", dividing the grid's x)");
    ++launches();
    if (dry_run()) return;
    const unsigned blocks = grid.x * grid.y * grid.z;
    for (unsigned n = 0; n < blocks; n += cluster) {
        const unsigned first = reverse_blocks() ? blocks - cluster - n : n;
        std::vector<Block> members(cluster);
        Cluster c;
        for (unsigned r = 0; r < cluster; ++r) {
            Block& b = members[r];
            const unsigned i = first + r;
            b.idx = dim3(i % grid.x, i / grid.x % grid.y, i / (grid.x * grid.y));
            b.dim = block;
            // Host address == shared address modulo 1024, so typed accesses through
            // `smem` have the alignment their shared addresses have.
            b.smem_store.assign(smem_bytes + 2048, 0xff);   // poison: bf16 NaN, fp32 NaN
            const uintptr_t raw = reinterpret_cast<uintptr_t>(b.smem_store.data());
            b.smem = reinterpret_cast<uint8_t*>(((raw + 1023) & ~uintptr_t(1023)) + kSmemBase);
            b.smem_size = smem_bytes;
            b.body = &Call::body;
            b.arg = &call;
            c.blocks.push_back(&b);
        }
        run_cluster(c);
    }
}

inline uint8_t* shared_memory() { return current_block()->smem; }

}  // namespace emu

// -- thread block clusters (sm_90) ----------------------------------------------------------------
// %cluster_ctarank and %cluster_nctarank.
inline unsigned cluster_ctarank() { return emu::current_block()->rank; }
inline unsigned cluster_nctarank() { return static_cast<unsigned>(emu::current_block()->cluster->blocks.size()); }
// barrier.cluster.arrive (release) and barrier.cluster.wait (acquire): a thread's wait returns
// once every thread of the cluster that has not exited has arrived in the phase it arrived in.
inline void cluster_arrive() {
    emu::Cluster& c = *emu::current_block()->cluster;
    emu::Fiber& f = emu::me();
    if (f.cluster_arrived && f.cluster_gen == c.gen) emu::die("barrier.cluster.arrive twice in one phase");
    f.cluster_arrived = true;
    f.cluster_gen = c.gen;
    ++emu::current_block()->progress;
    if (++c.arrived == c.live) {
        c.arrived = 0;
        ++c.gen;
    }
}
inline void cluster_wait() {
    emu::Fiber& f = emu::me();
    if (!f.cluster_arrived) emu::die("barrier.cluster.wait without an arrive before it");
    while (emu::current_block()->cluster->gen == f.cluster_gen) emu::yield();
    f.cluster_arrived = false;
}
inline void cluster_sync() {
    cluster_arrive();
    cluster_wait();
}
// The same place of dynamic shared memory in block `rank` of the cluster (mapa on a generic
// address: distributed shared memory, read and written by plain loads and stores).
template <typename T>
inline T* map_shared_rank(T* p, unsigned rank) {
    emu::Block* b = emu::current_block();
    const auto& blocks = b->cluster->blocks;
    if (rank >= blocks.size()) emu::die("mapa: rank outside the cluster");
    const auto* at = reinterpret_cast<const uint8_t*>(p);
    if (at < b->smem || at >= b->smem + b->smem_size) emu::die("mapa: not an address of this block's shared memory");
    return reinterpret_cast<T*>(blocks[rank]->smem + (at - b->smem));
}

inline dim3 emu_thread_idx() { return dim3(static_cast<unsigned>(emu::me().tid)); }
#define threadIdx (emu_thread_idx())
#define blockIdx (emu::current_block()->idx)
#define blockDim (emu::current_block()->dim)

inline void __syncthreads() { emu::syncthreads(); }

inline float __shfl_xor_sync(unsigned, float v, int mask) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    emu::slot(emu::lane())[0] = u;
    emu::warp_sync();
    const uint32_t r = emu::slot(emu::lane() ^ mask)[0];
    emu::warp_sync();
    float out;
    std::memcpy(&out, &r, 4);
    return out;
}

// -- warp collectives and shared-memory atomics of kernels/tree/tree_build.cu ----------------------
// Each is a barrier of the warp's 32 lanes around an exchange of values, like __shfl_xor_sync
// above (so all 32 lanes must reach it, as the full-mask intrinsics require on the GPU). Values
// of up to 8 bytes travel in two 32-bit slots. Atomics need no care: fibers switch only at
// barriers, so a read-modify-write is never interleaved with another thread's.
namespace emu {
enum class Shfl { index, xor_lane, up, down };

template <typename T>
inline T shfl_from(T v, int arg, Shfl mode) {
    static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
    uint32_t u[2] = {0, 0};
    std::memcpy(u, &v, sizeof(T));
    slot(lane())[0] = u[0];
    slot(lane())[1] = u[1];
    warp_sync();
    // up / down: a lane whose source falls outside the warp keeps its own value, as on the GPU.
    const int me = lane();
    const int src = mode == Shfl::xor_lane ? (me ^ arg) & 31
                    : mode == Shfl::up     ? (me - arg >= 0 ? me - arg : me)
                    : mode == Shfl::down   ? (me + arg < 32 ? me + arg : me)
                                           : arg & 31;
    const uint32_t r[2] = {slot(src)[0], slot(src)[1]};
    warp_sync();
    T out;
    std::memcpy(&out, r, sizeof(T));
    return out;
}
}  // namespace emu
inline int __shfl_xor_sync(unsigned, int v, int mask) { return emu::shfl_from(v, mask, emu::Shfl::xor_lane); }
inline unsigned __shfl_xor_sync(unsigned, unsigned v, int mask) { return emu::shfl_from(v, mask, emu::Shfl::xor_lane); }
inline double __shfl_xor_sync(unsigned, double v, int mask) { return emu::shfl_from(v, mask, emu::Shfl::xor_lane); }
inline int __shfl_sync(unsigned, int v, int src) { return emu::shfl_from(v, src, emu::Shfl::index); }
inline unsigned __shfl_sync(unsigned, unsigned v, int src) { return emu::shfl_from(v, src, emu::Shfl::index); }
inline double __shfl_sync(unsigned, double v, int src) { return emu::shfl_from(v, src, emu::Shfl::index); }
inline unsigned __shfl_up_sync(unsigned, unsigned v, unsigned delta) { return emu::shfl_from(v, static_cast<int>(delta), emu::Shfl::up); }
inline double __shfl_up_sync(unsigned, double v, unsigned delta) { return emu::shfl_from(v, static_cast<int>(delta), emu::Shfl::up); }
inline unsigned __shfl_down_sync(unsigned, unsigned v, unsigned delta) { return emu::shfl_from(v, static_cast<int>(delta), emu::Shfl::down); }
inline double __shfl_down_sync(unsigned, double v, unsigned delta) { return emu::shfl_from(v, static_cast<int>(delta), emu::Shfl::down); }
inline unsigned __ballot_sync(unsigned, int predicate) {
    emu::slot(emu::lane())[0] = predicate ? 1u : 0u;
    emu::warp_sync();
    unsigned bits = 0;
    for (int l = 0; l < 32; ++l) bits |= emu::slot(l)[0] << l;
    emu::warp_sync();
    return bits;
}
inline int __any_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline void __syncwarp(unsigned = 0xFFFFFFFFu) { emu::warp_sync(); }
inline unsigned __reduce_max_sync(unsigned, unsigned value) {
    emu::slot(emu::lane())[0] = value;
    emu::warp_sync();
    unsigned m = 0;
    for (int l = 0; l < 32; ++l) m = emu::slot(l)[0] > m ? emu::slot(l)[0] : m;
    emu::warp_sync();
    return m;
}
inline int atomicAdd(int* address, int value) {
    const int old = *address;
    *address = old + value;
    return old;
}
struct alignas(16) uint4 {      // as CUDA's: a 16-byte vector type
    unsigned x, y, z, w;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
// Blocks run one after another here, so a global load past L1 (ld.global.cg) is a plain load
// and a memory fence orders nothing more than program order already does.
template <typename T>
inline T __ldcg(const T* p) { return *p; }
inline void __threadfence() {}

// -- the PTX helpers of verify_attention.cu ---------------------------------------------------------
inline uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(static_cast<const uint8_t*>(p) - emu::shared_memory()) + emu::kSmemBase;
}

inline void cp_async16(uint32_t dst, const void* src, bool valid) {
    emu::Copy c{dst, src, valid ? 16 : 0};
    emu::smem_at(dst, 16);                          // bounds check at issue
    if (dst % 16) emu::misaligned("cp.async 16: shared address not 16-byte aligned");
    if (reinterpret_cast<uintptr_t>(src) % 16) emu::misaligned("cp.async 16: global address not 16-byte aligned");
    if (emu::late_copies()) emu::me().open.push_back(c);
    else emu::perform(c);
}
inline void cp_async_commit() {
    emu::Fiber& f = emu::me();
    f.groups.push_back(f.open);
    f.open.clear();
}
template <int N>
inline void cp_async_wait() {
    emu::retire(N);
}

inline uint16_t emu_ld16(uint32_t addr) {
    if (addr % 2) emu::misaligned("2-byte shared load not 2-byte aligned");
    uint16_t v;
    std::memcpy(&v, emu::smem_at(addr, 2), 2);
    return v;
}

// ldmatrix.x4: lanes 8i..8i+7 give the row addresses of matrix i; lane l receives row l/4,
// columns 2(l%4), 2(l%4)+1 of each matrix (with .trans: rows 2(l%4), 2(l%4)+1 of column l/4).
inline void emu_ldsm(uint32_t (&r)[4], uint32_t addr, bool trans) {
    const int l = emu::lane();
    if (addr % 16) emu::misaligned("ldmatrix row address not 16-byte aligned");
    emu::slot(l)[0] = addr;
    emu::warp_sync();
    for (int i = 0; i < 4; ++i) {
        uint16_t lo, hi;
        if (!trans) {
            const uint32_t row = emu::slot(8 * i + l / 4)[0];
            lo = emu_ld16(row + 4 * (l % 4));
            hi = emu_ld16(row + 4 * (l % 4) + 2);
        } else {
            lo = emu_ld16(emu::slot(8 * i + 2 * (l % 4))[0] + 2 * (l / 4));
            hi = emu_ld16(emu::slot(8 * i + 2 * (l % 4) + 1)[0] + 2 * (l / 4));
        }
        r[i] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
    }
    emu::warp_sync();
}
inline void ldsm_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, uint32_t a) {
    uint32_t r[4];
    emu_ldsm(r, a, false);
    r0 = r[0], r1 = r[1], r2 = r[2], r3 = r[3];
}
inline void ldsm_x4_t(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, uint32_t a) {
    uint32_t r[4];
    emu_ldsm(r, a, true);
    r0 = r[0], r1 = r[1], r2 = r[2], r3 = r[3];
}

inline bool current_warp_count_check(int tid) {
    return static_cast<int>(emu::current_block()->dim.x) < (tid & ~127) + 128;
}

inline float emu_half(uint32_t reg, int hi) { return emu_bf2f(static_cast<uint16_t>(hi ? reg >> 16 : reg)); }

// mma.m16n8k16.row.col: A row r, col k is in lane (r%8)*4 + (k%8)/2, register (r>=8) + 2(k>=8),
// half k%2; B row k, col n in lane n*4 + (k%8)/2, register (k>=8), half k%2; C/D row r, col n
// in lane (r%8)*4 + n/2, element 2(r>=8) + n%2.
inline void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    const int l = emu::lane();
    auto& s = emu::slot(l);
    for (int i = 0; i < 4; ++i) s[i] = a[i];
    s[4] = b0, s[5] = b1;
    emu::warp_sync();
    float out[4];
    for (int e = 0; e < 4; ++e) {
        const int r = l / 4 + 8 * (e >> 1), n = 2 * (l % 4) + (e & 1);
        float acc = d[e];
        for (int k = 0; k < 16; ++k) {
            const auto& sa = emu::slot((r % 8) * 4 + (k % 8) / 2);
            const auto& sb = emu::slot(n * 4 + (k % 8) / 2);
            acc += emu_half(sa[(r >= 8) + 2 * (k >= 8)], k % 2) * emu_half(sb[4 + (k >= 8)], k % 2);
        }
        out[e] = acc;
    }
    emu::warp_sync();
    for (int e = 0; e < 4; ++e) d[e] = out[e];
}

inline float fast_exp2(float x) { return std::exp2(x); }
// max.NaN / min.NaN: a NaN operand gives NaN.
inline float clamp_keep_nan(float x, float lo, float hi) { return x != x ? x : std::fmin(std::fmax(x, lo), hi); }
inline uint32_t __float_as_uint(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
}
inline float __uint_as_float(uint32_t u) {
    float x;
    std::memcpy(&x, &u, 4);
    return x;
}

inline void fence_proxy_async() {}
inline void wgmma_fence() {}
// Programmatic dependent launch: kernels run one after another here, so there is nothing to wait for.
inline void griddep_wait() {}
inline void griddep_launch_dependents() {}

// Element (row r, column k), as bf16 bits, of a K-major 128-byte-swizzle operand described by
// `desc`: rows in groups of 8, the groups SBO bytes apart, rows 128 bytes apart; the swizzle XORs
// address bits [4, 7) with bits [7, 10) of the absolute shared address.
inline uint16_t emu_desc_at(uint64_t desc, int r, int k) {
    if ((desc >> 62) != 1) emu::die("emulated wgmma supports the 128-byte swizzle only");
    const uint32_t start = static_cast<uint32_t>(desc & 0x3FFF) << 4;
    const uint32_t sbo = static_cast<uint32_t>((desc >> 32) & 0x3FFF) << 4;
    uint32_t addr = start + (r / 8) * sbo + (r % 8) * 128 + 2 * k;
    addr ^= ((addr >> 7) & 7u) << 4;
    return emu_ld16(addr);
}

// Element (k, n) of an MN-major (imm-trans 1) 128-byte-swizzle operand described by `desc`: rows
// of 128 bytes along N (64 bf16), one per k; groups of 8 rows SBO bytes apart along K, blocks of
// 64 columns LBO bytes apart along N; the same swizzle on absolute addresses.
inline uint16_t emu_desc_mn_at(uint64_t desc, int k, int n) {
    if ((desc >> 62) != 1) emu::die("emulated wgmma supports the 128-byte swizzle only");
    const uint32_t start = static_cast<uint32_t>(desc & 0x3FFF) << 4;
    const uint32_t lbo = static_cast<uint32_t>((desc >> 16) & 0x3FFF) << 4;
    const uint32_t sbo = static_cast<uint32_t>((desc >> 32) & 0x3FFF) << 4;
    uint32_t addr = start + (k / 8) * sbo + (k % 8) * 128 + (n / 64) * lbo + 2 * (n % 64);
    addr ^= ((addr >> 7) & 7u) << 4;
    return emu_ld16(addr);
}

// The issue: every thread of the warpgroup gives its A registers and descriptors (a barrier of
// the 128 threads); the descriptors must agree.
inline void emu_wgmma_enter(uint64_t d0, uint64_t d1, const uint32_t* a) {
    const int tid = emu::me().tid, group0 = tid & ~127;
    if (current_warp_count_check(tid)) emu::die("wgmma needs a whole warpgroup of 128 threads");
    auto& mine = emu::current_block()->slots[tid];
    for (int i = 0; i < 4; ++i) mine[i] = a ? a[i] : 0;
    mine[4] = static_cast<uint32_t>(d0), mine[5] = static_cast<uint32_t>(d0 >> 32);
    mine[6] = static_cast<uint32_t>(d1), mine[7] = static_cast<uint32_t>(d1 >> 32);
    emu::warpgroup_sync();
    const auto& first = emu::current_block()->slots[group0];
    for (int i = 4; i < 8; ++i)
        if (first[i] != mine[i]) emu::die("wgmma descriptor differs across the warpgroup");
}

// A from registers: element (r, k) from warp r / 16 of the group, in the mma.m16n8k16 A layout.
inline float emu_wgmma_reg_a(int group0, int r, int k) {
    const int rr = r % 16;
    const auto& sl = emu::current_block()->slots[group0 + (r / 16) * 32 + (rr % 8) * 4 + (k % 8) / 2];
    return emu_half(sl[(rr >= 8) + 2 * (k >= 8)], k % 2);
}

// The 16 bf16 values (k = 0..15) of one shared-memory operand row of A (h: row 16w + lane/4 + 8h)
// or column of B (i: column 8(i/2) + 2(lane%4) + i%2) of this thread's fragment, and a
// fingerprint of their bits.
inline uint64_t emu_wgmma_row_a(const emu::Wgmma& op, int h, uint16_t (&v)[16]) {
    const int tid = emu::me().tid, row = 16 * ((tid >> 5) & 3) + (tid & 31) / 4 + 8 * h;
    uint64_t fp = 0;
    for (int k = 0; k < 16; ++k) {
        v[k] = op.kind == emu::Wgmma::kSmemATransA ? emu_desc_mn_at(op.desc_a, k, row) : emu_desc_at(op.desc_a, row, k);
        fp = (fp ^ v[k]) * 0x100000001b3ull;
    }
    return fp;
}
inline uint64_t emu_wgmma_col_b(const emu::Wgmma& op, int i, uint16_t (&v)[16]) {
    const int n = 8 * (i / 2) + 2 * (emu::me().tid & 3) + i % 2;
    uint64_t fp = 0;
    for (int k = 0; k < 16; ++k) {
        v[k] = op.kind == emu::Wgmma::kRegATransB || op.kind == emu::Wgmma::kSmemATransB
                   ? emu_desc_mn_at(op.desc_b, k, n)
                   : emu_desc_at(op.desc_b, n, k);
        fp = (fp ^ v[k]) * 0x100000001b3ull;
    }
    return fp;
}

// Queue this thread's share of a warpgroup-wide d[64 x N] (+)= A[64 x 16] B[16 x N] (warp w of
// the group: rows 16w + lane/4 (+8), n-tile j columns 8j + 2(lane%4) (+1)). A from registers is
// taken now; a second barrier keeps the slots until every thread has its rows. The shared-memory
// operands are fingerprinted now and read at the wait.
inline void emu_wgmma_issue(emu::Wgmma::Kind kind, int n, float* d, uint64_t desc_a, uint64_t desc_b,
                            const uint32_t* a, int accumulate) {
    const bool smem_a = kind == emu::Wgmma::kSmemA || kind == emu::Wgmma::kSmemATransB ||
                        kind == emu::Wgmma::kSmemATransA;
    if ((desc_b >> 62) != 1 || (smem_a && (desc_a >> 62) != 1))
        emu::die("emulated wgmma supports the 128-byte swizzle only");
    emu_wgmma_enter(smem_a ? desc_a : desc_b, smem_a ? desc_b : 0, a);
    emu::Fiber& f = emu::me();
    emu::Wgmma op{kind, n, accumulate, f.mma_commits, d, desc_a, desc_b, {}, smem_a ? nullptr : a, {}, {}, {}};
    uint16_t v[16];
    if (!smem_a) {
        for (int r = 0; r < 4; ++r) op.a_seen[r] = a[r];
        const int group0 = f.tid & ~127, w = (f.tid >> 5) & 3, lane = f.tid & 31;
        for (int h = 0; h < 2; ++h)
            for (int k = 0; k < 16; ++k) op.a[h][k] = emu_wgmma_reg_a(group0, 16 * w + lane / 4 + 8 * h, k);
    } else {
        for (int h = 0; h < 2; ++h) op.seen_a[h] = emu_wgmma_row_a(op, h, v);
    }
    for (int i = 0; i < n / 4; ++i) op.seen_b[i] = emu_wgmma_col_b(op, i, v);
    emu::warpgroup_sync();
    f.mmas.push_back(op);
}

// Run one queued share: shared-memory operands are read now, the accumulator written now. An
// operand value that is not what it was at issue (its stage overwritten, or a copy into it
// landing, while the MMA was in flight; or the thread's A registers written before the wait
// that retires it, which the GPU reads asynchronously too) makes the outputs it feeds NaN: the
// GPU may have read either.
inline void emu_wgmma_run(const emu::Wgmma& op) {
    float a[2][16], b[16];
    bool a_changed[2] = {false, false};
    uint16_t v[16];
    for (int h = 0; h < 2; ++h) {
        if (op.kind == emu::Wgmma::kRegA || op.kind == emu::Wgmma::kRegATransB) {
            for (int k = 0; k < 16; ++k) a[h][k] = op.a[h][k];
            for (int r = 0; r < 4; ++r) a_changed[h] = a_changed[h] || op.a_regs[r] != op.a_seen[r];
            continue;
        }
        a_changed[h] = emu_wgmma_row_a(op, h, v) != op.seen_a[h];
        for (int k = 0; k < 16; ++k) a[h][k] = emu_bf2f(v[k]);
    }
    for (int j = 0; j < op.n / 8; ++j)
        for (int c = 0; c < 2; ++c) {
            const bool b_changed = emu_wgmma_col_b(op, 2 * j + c, v) != op.seen_b[2 * j + c];
            for (int k = 0; k < 16; ++k) b[k] = emu_bf2f(v[k]);
            for (int h = 0; h < 2; ++h) {
                float& out = op.d[4 * j + 2 * h + c];
                float acc = op.accumulate ? out : 0.f;
                for (int k = 0; k < 16; ++k) acc += a[h][k] * b[k];
                out = b_changed || a_changed[h] ? NAN : acc;
            }
        }
}

inline void wgmma_commit() { ++emu::me().mma_commits; }
// Run, in issue order, this thread's queued MMAs but those of the newest N groups (MMAs issued
// since the last commit count as one group newer than every committed one). Per thread: no
// barrier, so each thread reads shared memory as it is at its own wait.
template <int N>
inline void wgmma_wait() {
    emu::Fiber& f = emu::me();
    const bool open = !f.mmas.empty() && f.mmas.back().group == f.mma_commits;
    const long retire_below = f.mma_commits + (open ? 1 : 0) - N;
    while (!f.mmas.empty() && f.mmas.front().group < retire_below) {
        emu_wgmma_run(f.mmas.front());
        f.mmas.pop_front();
    }
}

inline void wgmma_m64n64k16(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc, int accumulate) {
    emu_wgmma_issue(emu::Wgmma::kRegA, 64, &d[0][0], 0, desc, a, accumulate);
}
// A from registers, B MN-major (imm-trans-b 1), always accumulating (the P V of the GQA kernel).
inline void wgmma_m64n128k16_tb(float (&d)[16][4], const uint32_t (&a)[4], uint64_t desc) {
    emu_wgmma_issue(emu::Wgmma::kRegATransB, 128, &d[0][0], 0, desc, a, 1);
}
inline void wgmma_m64n32k16_ss(float (&d)[4][4], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    emu_wgmma_issue(emu::Wgmma::kSmemA, 32, &d[0][0], desc_a, desc_b, nullptr, accumulate);
}
inline void wgmma_m64n64k16_ss(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    emu_wgmma_issue(emu::Wgmma::kSmemA, 64, &d[0][0], desc_a, desc_b, nullptr, accumulate);
}
// A K-major and B MN-major, both by descriptor, always accumulating (the MLA kernel's P V).
inline void wgmma_m64n256k16_ss_tb(float (&d)[32][4], uint64_t desc_a, uint64_t desc_b) {
    emu_wgmma_issue(emu::Wgmma::kSmemATransB, 256, &d[0][0], desc_a, desc_b, nullptr, 1);
}
// N = 8, both by descriptor: A and B K-major, or A MN-major (imm-trans-a 1, always accumulating);
// the pipelined kernel's tail row (S^T = K Q_tail^T, O_tail^T += V^T P^T).
inline void wgmma_m64n8k16_ss(float (&d)[1][4], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    emu_wgmma_issue(emu::Wgmma::kSmemA, 8, &d[0][0], desc_a, desc_b, nullptr, accumulate);
}
inline void wgmma_m64n8k16_ss_ta(float (&d)[1][4], uint64_t desc_a, uint64_t desc_b) {
    emu_wgmma_issue(emu::Wgmma::kSmemATransA, 8, &d[0][0], desc_a, desc_b, nullptr, 1);
}

inline void st_shared_b32(uint32_t a, uint32_t v) {
    if (a % 4) emu::misaligned("st.shared.b32 not 4-byte aligned");
    std::memcpy(emu::smem_at(a, 4), &v, 4);
}

// -- mbarrier and tensor copies (TMA), for kernels that feed shared memory through them -----
// The driver's tensor map (cuda.h: 128 opaque bytes) and cuTensorMapEncodeTiled, checked as the
// driver documents it; the map keeps what the emulated copy needs.
typedef uint64_t cuuint64_t;
typedef uint32_t cuuint32_t;
typedef int CUresult;
enum { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_NOT_FOUND = 500 };
enum CUtensorMapDataType { CU_TENSOR_MAP_DATA_TYPE_UINT8 = 0, CU_TENSOR_MAP_DATA_TYPE_UINT16 = 1,
                           CU_TENSOR_MAP_DATA_TYPE_FLOAT32 = 7, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9 };
enum CUtensorMapInterleave { CU_TENSOR_MAP_INTERLEAVE_NONE = 0 };
enum CUtensorMapSwizzle { CU_TENSOR_MAP_SWIZZLE_NONE = 0, CU_TENSOR_MAP_SWIZZLE_128B = 3 };
enum CUtensorMapL2promotion { CU_TENSOR_MAP_L2_PROMOTION_NONE = 0, CU_TENSOR_MAP_L2_PROMOTION_L2_128B = 2,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3 };
enum CUtensorMapFloatOOBfill { CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0 };
struct alignas(128) CUtensorMap {
    cuuint64_t opaque[16];
};
#define __grid_constant__
namespace emu {
struct TensorMap {              // what an emulated CUtensorMap holds
    const uint8_t* base;
    uint64_t dim[5], stride[5]; // stride[0] = the element size; bytes
    uint32_t box[5];
    uint32_t rank, elem, swizzle;
};
static_assert(sizeof(TensorMap) <= sizeof(CUtensorMap), "an emulated map fits the driver's");
inline size_t element_bytes(CUtensorMapDataType t) {
    return t == CU_TENSOR_MAP_DATA_TYPE_UINT8 ? 1 : t == CU_TENSOR_MAP_DATA_TYPE_FLOAT32 ? 4 : 2;
}
}  // namespace emu

inline CUresult cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* address,
                                       const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                       const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                                       CUtensorMapSwizzle swizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
    const uint32_t elem = static_cast<uint32_t>(emu::element_bytes(type));
    if (rank < 1 || rank > 5 || interleave != CU_TENSOR_MAP_INTERLEAVE_NONE) return CUDA_ERROR_INVALID_VALUE;
    if (reinterpret_cast<uintptr_t>(address) % 16) return CUDA_ERROR_INVALID_VALUE;
    if (swizzle != CU_TENSOR_MAP_SWIZZLE_NONE && swizzle != CU_TENSOR_MAP_SWIZZLE_128B) return CUDA_ERROR_INVALID_VALUE;
    emu::TensorMap t{};
    t.base = static_cast<const uint8_t*>(address);
    t.rank = rank, t.elem = elem, t.swizzle = swizzle;
    t.stride[0] = elem;
    for (uint32_t i = 0; i < rank; ++i) {
        if (dims[i] == 0 || dims[i] > (1ull << 32)) return CUDA_ERROR_INVALID_VALUE;
        if (box[i] == 0 || box[i] > 256 || element_strides[i] != 1) return CUDA_ERROR_INVALID_VALUE;
        t.dim[i] = dims[i], t.box[i] = box[i];
        if (i > 0) {          // strides of dims 1.. in bytes: multiples of 16 below 2^40
            if (strides[i - 1] % 16 || strides[i - 1] >= (1ull << 40)) return CUDA_ERROR_INVALID_VALUE;
            t.stride[i] = strides[i - 1];
        }
    }
    const uint64_t inner = static_cast<uint64_t>(box[0]) * elem;
    if (inner % 16 || (swizzle == CU_TENSOR_MAP_SWIZZLE_128B && inner > 128)) return CUDA_ERROR_INVALID_VALUE;
    std::memset(map, 0, sizeof *map);
    std::memcpy(map, &t, sizeof t);
    return CUDA_SUCCESS;
}

namespace emu {
inline MBarrier& mbarrier_at(uint32_t addr) {
    for (MBarrier& m : current_block()->mbarriers)
        if (m.addr == addr) return m;
    die("mbarrier used before mbarrier.init");
}
// Land the tensor copies of barrier `bar` (all of them: a copy may land at any time after its
// issue), completing their transaction bytes; then the phase if nothing more is expected.
inline void land_copies(uint32_t bar) {
    Block* b = current_block();
    MBarrier& m = mbarrier_at(bar);
    for (size_t i = 0; i < b->bulk_copies.size();) {
        BulkCopy& c = b->bulk_copies[i];
        if (c.bar != bar) {
            ++i;
            continue;
        }
        std::memcpy(smem_at(c.dst, static_cast<uint32_t>(c.bytes.size())), c.bytes.data(), c.bytes.size());
        m.tx -= static_cast<int64_t>(c.bytes.size());
        b->bulk_copies.erase(b->bulk_copies.begin() + static_cast<long>(i));
    }
}
// The transaction count may dip below zero while arrivals are pending (a copy completing before
// its expect_tx, as PTX allows), never once they are all in.
inline void complete_phase_if_done(MBarrier& m) {
    if (m.pending == 0 && m.tx < 0) die("mbarrier: more transaction bytes completed than expected");
    if (m.pending == 0 && m.tx == 0) {
        m.parity ^= 1u;
        m.pending = m.expected;
        ++current_block()->progress;
    }
}
}  // namespace emu

inline void mbar_init(uint32_t bar, uint32_t count) {
    if (bar % 8) emu::misaligned("mbarrier not 8-byte aligned");
    emu::smem_at(bar, 8);
    for (emu::MBarrier& m : emu::current_block()->mbarriers)
        if (m.addr == bar) {
            m = emu::MBarrier{bar, count, count, 0, 0};
            return;
        }
    emu::current_block()->mbarriers.push_back(emu::MBarrier{bar, count, count, 0, 0});
}
inline void fence_mbarrier_init() {}
// Warp specialisation's other two pieces: named barriers (a kernel's bar.sync / bar.arrive with
// an id and a thread count) and setmaxnreg (a warpgroup's register budget moved to another).
inline void named_barrier_sync(int id, int threads) { emu::named_barrier(id, threads, true); }
inline void named_barrier_arrive(int id, int threads) { emu::named_barrier(id, threads, false); }
template <int REGS>
inline void setmaxnreg_inc() { emu::setmaxnreg(REGS); }
template <int REGS>
inline void setmaxnreg_dec() { emu::setmaxnreg(REGS); }
// One arrival that also expects `bytes` more transaction bytes in this phase.
inline void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    emu::MBarrier& m = emu::mbarrier_at(bar);
    m.tx += bytes;
    if (m.pending == 0) emu::die("mbarrier: more arrivals than its count in one phase");
    --m.pending;
    emu::complete_phase_if_done(m);
}
// A plain arrival (a consumer releasing a stage) then a switch to another thread: on the GPU the
// producer waiting on that barrier may run, and its next copy land, before this thread's next
// instruction, so a stage released before the MMAs reading it retire is overwritten under them.
inline void mbar_arrive(uint32_t bar) {
    mbar_arrive_expect_tx(bar, 0);
    emu::yield();
}
// Until the phase of parity `parity` has completed (mbarrier.try_wait.parity in a loop).
inline void mbar_wait(uint32_t bar, uint32_t parity) {
    for (;;) {
        emu::land_copies(bar);
        emu::MBarrier& m = emu::mbarrier_at(bar);
        emu::complete_phase_if_done(m);
        if (m.parity != (parity & 1u)) return;
        emu::yield();
    }
}

// mbarrier.arrive.release.cluster.shared::cluster on the barrier at `bar` of block `rank` of the
// cluster (the address mapa.shared::cluster maps there): one arrival in its current phase; then
// a switch to another thread, as a plain arrival does. The wait with cluster scope
// (try_wait.parity.acquire.cluster) is mbar_wait's.
inline void mbar_arrive_cluster(uint32_t bar, unsigned rank) {
    emu::Block* self = emu::current_block();
    const auto& blocks = self->cluster->blocks;
    if (rank >= blocks.size()) emu::die("mapa.shared::cluster: rank outside the cluster");
    emu::current_block() = blocks[rank];
    emu::MBarrier& m = emu::mbarrier_at(bar);
    if (m.pending == 0) emu::die("mbarrier: more arrivals than its count in one phase");
    --m.pending;
    emu::complete_phase_if_done(m);
    emu::current_block() = self;
    emu::yield();
}
inline void mbar_wait_cluster(uint32_t bar, uint32_t parity) { mbar_wait(bar, parity); }

// cp.async.bulk.tensor.Nd.shared::cluster.global.mbarrier::complete_tx::bytes: the box at
// `coords` (innermost first) into shared memory at `dst`, rows of the box's inner extent one
// after another, elements outside the tensor as zeros; with the 128-byte swizzle each 16-byte
// chunk lands at address bits [4, 7) XOR [7, 10) of its absolute shared address (the layout
// wgmma's 128-byte-swizzle descriptors read). Read at issue, landing later (land_copies).
// prefetch.tensormap: a hint; nothing to model.
inline void prefetch_tensormap(const CUtensorMap*) {}

inline void tma_load(uint32_t dst, const CUtensorMap* map, const int32_t* coords, uint32_t bar) {
    emu::TensorMap t;
    std::memcpy(&t, map, sizeof t);
    ++emu::tensor_copies();
    if (dst % 128) emu::misaligned("cp.async.bulk.tensor: shared address not 128-byte aligned");
    if (t.swizzle == CU_TENSOR_MAP_SWIZZLE_128B && dst % 1024)
        emu::misaligned("cp.async.bulk.tensor: 128-byte swizzle needs a 1024-byte aligned destination");
    emu::mbarrier_at(bar);
    uint64_t n = t.elem;
    for (uint32_t i = 0; i < t.rank; ++i) n *= t.box[i];
    emu::smem_at(dst, static_cast<uint32_t>(n));
    if (t.swizzle == CU_TENSOR_MAP_SWIZZLE_128B && n % 128)
        emu::die("cp.async.bulk.tensor: a 128-byte-swizzled box must be whole 128-byte rows");
    emu::BulkCopy c;
    c.dst = dst, c.bar = bar;
    c.bytes.assign(n, 0);
    std::vector<uint8_t> flat(n, 0);
    uint32_t idx[5] = {0, 0, 0, 0, 0};
    for (uint64_t e = 0; e < n / t.elem; ++e) {
        uint64_t rest = e;
        bool inside = true;
        uint64_t off = 0;
        for (uint32_t i = 0; i < t.rank; ++i) {
            idx[i] = static_cast<uint32_t>(rest % t.box[i]);
            rest /= t.box[i];
            const int64_t g = static_cast<int64_t>(coords[i]) + idx[i];
            if (g < 0 || static_cast<uint64_t>(g) >= t.dim[i]) inside = false;
            else off += static_cast<uint64_t>(g) * t.stride[i];
        }
        if (inside) std::memcpy(&flat[e * t.elem], t.base + off, t.elem);
    }
    for (uint64_t o = 0; o < n; o += 16) {      // place 16-byte chunks at their swizzled addresses
        uint32_t a = dst + static_cast<uint32_t>(o);
        if (t.swizzle == CU_TENSOR_MAP_SWIZZLE_128B) a ^= ((a >> 7) & 7u) << 4;
        std::memcpy(&c.bytes[a - dst], &flat[o], 16);
    }
    emu::current_block()->bulk_copies.push_back(std::move(c));
    if (!emu::late_copies()) {            // TVA_EMU_EARLY: landed at issue
        emu::land_copies(bar);
        emu::complete_phase_if_done(emu::mbarrier_at(bar));
    }
}

// cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes: `bytes` contiguous bytes
// from global `src` to shared `dst`, read at issue, landing with the barrier's other copies.
inline void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
    if (dst % 16 || reinterpret_cast<uintptr_t>(src) % 16 || bytes % 16 || bytes == 0)
        emu::misaligned("cp.async.bulk: addresses and size must be multiples of 16 bytes");
    emu::mbarrier_at(bar);
    emu::smem_at(dst, bytes);
    emu::BulkCopy c;
    c.dst = dst, c.bar = bar;
    c.bytes.assign(static_cast<const uint8_t*>(src), static_cast<const uint8_t*>(src) + bytes);
    emu::current_block()->bulk_copies.push_back(std::move(c));
    if (!emu::late_copies()) {
        emu::land_copies(bar);
        emu::complete_phase_if_done(emu::mbarrier_at(bar));
    }
}

namespace emu {
// A tensor store performed: the box read from shared memory as it is now, each element inside
// the tensor written to global memory (those outside are dropped, as the hardware drops them).
inline void perform(const BulkStore& st) {
    TensorMap t;
    std::memcpy(&t, st.map, sizeof t);
    uint64_t n = t.elem;
    for (uint32_t i = 0; i < t.rank; ++i) n *= t.box[i];
    const uint8_t* box = smem_at(st.src, static_cast<uint32_t>(n));
    for (uint64_t e = 0; e < n / t.elem; ++e) {
        uint64_t rest = e, off = 0;
        bool inside = true;
        for (uint32_t i = 0; i < t.rank; ++i) {
            const int64_t g = static_cast<int64_t>(st.c[i]) + static_cast<int64_t>(rest % t.box[i]);
            rest /= t.box[i];
            if (g < 0 || static_cast<uint64_t>(g) >= t.dim[i]) inside = false;
            else off += static_cast<uint64_t>(g) * t.stride[i];
        }
        if (inside) std::memcpy(const_cast<uint8_t*>(t.base) + off, box + e * t.elem, t.elem);
    }
}
}  // namespace emu

// cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group (2-d maps only, no swizzle: the
// box is rows of its inner extent one after another from `src`).
inline void tma_store(const CUtensorMap* map, const int32_t (&c)[2], uint32_t src) {
    emu::TensorMap t;
    std::memcpy(&t, map, sizeof t);
    if (t.rank != 2 || t.swizzle != CU_TENSOR_MAP_SWIZZLE_NONE) emu::die("emulated tensor stores: 2-d, unswizzled");
    if (src % 128) emu::misaligned("cp.async.bulk.tensor: shared address not 128-byte aligned");
    emu::smem_at(src, t.elem * t.box[0] * t.box[1]);
    emu::BulkStore st;
    std::memcpy(st.map, map, sizeof st.map);
    st.c[0] = c[0], st.c[1] = c[1], st.src = src;
    emu::me().stores_open.push_back(st);
}
inline void bulk_commit() {
    emu::Fiber& f = emu::me();
    f.store_groups.push_back(std::move(f.stores_open));
    f.stores_open.clear();
}
// cp.async.bulk.wait_group.read N: every committed group but the N newest performed.
template <int N>
inline void bulk_wait_read() {
    emu::Fiber& f = emu::me();
    while (f.store_groups.size() > static_cast<size_t>(N)) {
        for (const emu::BulkStore& st : f.store_groups.front()) emu::perform(st);
        f.store_groups.pop_front();
    }
}
inline void fence_proxy_async_global() {}

extern "C" void emu_configure(int early, unsigned long long skew_seed) {
    emu::late_copies() = !early;
    emu::skew_state() = skew_seed;
}
// In the block of rank `rank` of every cluster, every warp (first_warp_too = 0: but the first) runs
// one round in `every` (0 or 1: as the others).
extern "C" void emu_slow_rank(unsigned rank, unsigned every, int first_warp_too) {
    emu::slow_rank() = emu::SlowRank{rank, every, first_warp_too != 0};
}
// bits (1..8): how hard skew holds warps back (skew_bits above); 1 is the default.
extern "C" void emu_skew_bits(int bits) { emu::skew_bits() = bits < 1 ? 1 : bits > 8 ? 8 : bits; }

extern "C" const char* emu_last_fault() { return emu::fault().c_str(); }
extern "C" void emu_clear_fault() {
    emu::fault().clear();
    emu::launch_refused().clear();
}
// dry = 1: launches are validated (and counted) but run no blocks.
extern "C" void emu_dry_run(int dry) { emu::dry_run() = dry != 0; }
// reverse = 1: a grid's blocks run last to first (blocks run one after another here, so which
// block of a group meeting at a counter arrives last follows the order).
extern "C" void emu_reverse_blocks(int reverse) { emu::reverse_blocks() = reverse != 0; }
extern "C" long emu_launch_count() { return emu::launches(); }
extern "C" long emu_tensor_copy_count() { return emu::tensor_copies(); }

// -fsanitize=alignment reports (the UBSan ABI of GCC and Clang): a typed load or store through a
// pointer not aligned for its type. Recorded as a misaligned-address fault with the source line.
struct EmuUbsanLocation {
    const char* file;
    uint32_t line, column;
};
struct EmuUbsanType {
    uint16_t kind, info;
    char name[1];
};
struct EmuUbsanMismatch {
    EmuUbsanLocation loc;
    const EmuUbsanType* type;
    unsigned char log_alignment, check_kind;
};
extern "C" void __ubsan_handle_type_mismatch_v1(EmuUbsanMismatch* data, uintptr_t ptr) {
    const uintptr_t align = uintptr_t(1) << data->log_alignment;
    if (ptr == 0 || ptr % align == 0) return;      // (null and object-size checks are not enabled)
    static const char* kinds[] = {"load of", "store to", "reference binding to", "member access within",
                                  "member call on", "constructor call on", "downcast of", "downcast of",
                                  "upcast of", "cast to virtual base of", "_Nonnull binding to",
                                  "dynamic operation on"};
    char msg[512];
    std::snprintf(msg, sizeof msg, "%s:%u: %s misaligned address (%lu mod %lu) for type %s",
                  data->loc.file, data->loc.line,
                  data->check_kind < 12 ? kinds[data->check_kind] : "access to",
                  static_cast<unsigned long>(ptr % align), static_cast<unsigned long>(align),
                  data->type ? data->type->name : "?");
    emu::misaligned(msg);
}
extern "C" void __ubsan_handle_type_mismatch_v1_abort(EmuUbsanMismatch* data, uintptr_t ptr) {
    __ubsan_handle_type_mismatch_v1(data, ptr);
}
