// How fast the GPU reads page-locked host memory itself (zero-copy, over PCIe), against cudaMemcpyAsync of the
// same bytes, alone and while CPU threads stream from RAM: the measurement docs/design-miss-sharing.md asks for
// before a layer's missed experts are shared between the CPU and the GPU.
//   nvcc -O2 -std=c++17 -arch=sm_90 benchmarks/cuda/zero_copy_probe.cu -o /tmp/zcp -lpthread && /tmp/zcp [cpu_threads]
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

// every thread streams 16-byte words, coalesced across the grid
static __global__ void k_read16(const uint4 * p, size_t n, unsigned * out) {
    unsigned acc = 0;
    for (size_t i = blockIdx.x * (size_t) blockDim.x + threadIdx.x; i < n; i += (size_t) gridDim.x * blockDim.x) {
        const uint4 v = p[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) { *out = acc; }
}

// MMVQ's pattern: one warp per row of row_bytes (Q4_0: 18-byte blocks), 4-byte loads
static __global__ void k_read_rows(const int * p, int n_rows, int row_ints, unsigned * out) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= n_rows) { return; }
    unsigned acc = 0;
    for (int i = threadIdx.x % 32; i < row_ints; i += 32) {
        acc ^= p[(size_t) row * row_ints + i];
    }
    if (acc == 0x12345678u) { *out = acc; }
}

int main(int argc, char ** argv) {
    const int cpu_threads = argc > 1 ? atoi(argv[1]) : 15;
    const size_t big = 1ull << 30;
    char * ram = (char *) malloc(big); // the CPU threads' own stream
    memset(ram, 1, big);
    const size_t sizes[] = { 1325568, 2651136, 64u << 20 }; // half a Qwen3-30B-A3B Q4_0 expert, one, 64 MiB
    char * host; CHECK(cudaMallocHost((void **) &host, 64u << 20)); memset(host, 3, 64u << 20);
    char * dev;  CHECK(cudaMalloc((void **) &dev, 64u << 20));
    unsigned * out; CHECK(cudaMalloc((void **) &out, 4));
    cudaStream_t st; CHECK(cudaStreamCreate(&st));
    cudaEvent_t e0, e1; CHECK(cudaEventCreate(&e0)); CHECK(cudaEventCreate(&e1));
    int n_sm = 0; CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));

    std::atomic<bool> stop{false}, load{false};
    std::atomic<uint64_t> cpu_bytes{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < cpu_threads; ++t) {
        threads.emplace_back([&, t] {
            const size_t part = big / cpu_threads, off = t * part;
            volatile uint64_t sink = 0;
            while (!stop) {
                if (!load) { std::this_thread::yield(); continue; }
                uint64_t acc = 0;
                const uint64_t * q = (const uint64_t *) (ram + off);
                for (size_t i = 0; i < part / 8; i += 8) { acc += q[i] + q[i+1] + q[i+2] + q[i+3] + q[i+4] + q[i+5] + q[i+6] + q[i+7]; }
                sink = sink + acc;
                cpu_bytes += part;
            }
        });
    }
    const int reps = 20;
    for (int loaded = 0; loaded < 2; ++loaded) {
        load = loaded == 1;
        if (load) { std::this_thread::sleep_for(std::chrono::milliseconds(200)); }
        const uint64_t b0 = cpu_bytes.load();
        const auto t0 = std::chrono::steady_clock::now();
        for (size_t s : sizes) {
            float ms;
            CHECK(cudaEventRecord(e0, st));
            for (int r = 0; r < reps; ++r) { CHECK(cudaMemcpyAsync(dev, host, s, cudaMemcpyHostToDevice, st)); }
            CHECK(cudaEventRecord(e1, st)); CHECK(cudaEventSynchronize(e1)); CHECK(cudaEventElapsedTime(&ms, e0, e1));
            const double copy = s * reps / (ms * 1e6);
            for (int mult : { 1, 4, 16 }) {
                CHECK(cudaEventRecord(e0, st));
                for (int r = 0; r < reps; ++r) { k_read16<<<n_sm * mult, 256, 0, st>>>((const uint4 *) host, s / 16, out); }
                CHECK(cudaEventRecord(e1, st)); CHECK(cudaEventSynchronize(e1)); CHECK(cudaEventElapsedTime(&ms, e0, e1));
                printf("%s %9zu B: copy %5.1f GB/s (%6.1f us); zero-copy 16-B reads, %4d blocks: %5.1f GB/s (%6.1f us)\n",
                       load ? "cpu-loaded" : "alone     ", s, copy, s / copy / 1e3, n_sm * mult, s * reps / (ms * 1e6), ms * 1e3 / reps);
            }
            const int row_ints = 1152 / 4, n_rows = (int) (s / 1152);
            CHECK(cudaEventRecord(e0, st));
            for (int r = 0; r < reps; ++r) { k_read_rows<<<(n_rows + 7) / 8, 256, 0, st>>>((const int *) host, n_rows, row_ints, out); }
            CHECK(cudaEventRecord(e1, st)); CHECK(cudaEventSynchronize(e1)); CHECK(cudaEventElapsedTime(&ms, e0, e1));
            printf("%s %9zu B: zero-copy rows of 1152 B, a warp each, 4-B loads: %5.1f GB/s (%6.1f us)\n",
                   load ? "cpu-loaded" : "alone     ", s, s * reps / (ms * 1e6), ms * 1e3 / reps);
        }
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (load) { printf("the CPU's %d threads meanwhile read %.1f GB/s from RAM\n", cpu_threads, (cpu_bytes.load() - b0) / sec / 1e9); }
    }
    load = true;
    const uint64_t b0 = cpu_bytes.load();
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    printf("the CPU's %d threads alone: %.1f GB/s from RAM\n", cpu_threads, (cpu_bytes.load() - b0) / 0.5 / 1e9);
    stop = true;
    for (auto & t : threads) { t.join(); }
    return 0;
}
