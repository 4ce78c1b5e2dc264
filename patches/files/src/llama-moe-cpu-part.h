#pragma once

// The CPU's part of one hybrid layer in one-token decoding, as the mailbox computes it (llama-moe-mailbox.h).
//
// Through ggml_graph_compute, a part of a few microseconds of arithmetic cost about 100 us on the H200's host:
// each node ends in an OpenMP barrier, and the team's threads, spinning little while another team (the
// decode's) exists, sleep in the kernel between nodes and must be woken. Here the expert products (the
// MUL_MAT_IDs, nearly all of the work) run on a team of threads that spin while a decode goes on, each thread
// a slice of every product's rows (or chunks taken as they come: GGML_MMID_CHUNK), only for the experts the
// CPU computes; the other nodes
// (activation, biases, a copy into the mailbox where the last node cannot write there itself) run through
// ggml on the team's first thread. Each row is ggml's own
// vec_dot on ggml's own quantization of the input, so the rows of the experts the CPU computes are the bits
// ggml_graph_compute gives; the others are not zeroed on every step (the mailbox's y_rows leaves them out).

#include "ggml.h"
#include "ggml-cpu.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
static inline void llama_moe_cpu_relax() { _mm_pause(); }
#else
static inline void llama_moe_cpu_relax() { std::this_thread::yield(); }
#endif

static inline int64_t llama_moe_now_us() {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// threads that spin on a generation counter between jobs; the caller is thread 0
struct llama_moe_cpu_team {
    explicit llama_moe_cpu_team(int n_threads);
    ~llama_moe_cpu_team();

    int size() const { return (int) workers.size() + 1; }

    // fn(arg, ith, nth) on every thread; returns when all have returned
    void run(void (*fn)(void * arg, int ith, int nth), void * arg);

    // the workers spin (rather than sleep) until this long from now: a decode's next layer comes soon
    void keep_awake(int64_t us);

private:
    void work(int ith);

    std::vector<std::thread> workers;
    void (*job_fn)(void *, int, int) = nullptr;
    void * job_arg = nullptr;
    std::atomic<uint64_t> generation{0};
    std::atomic<int>      n_running{0};
    std::atomic<int64_t>  awake_until_us{0};
    std::atomic<int>      n_sleeping{0};
    std::atomic<bool>     stop{false};
    std::mutex mutex;
    std::condition_variable cv;
};

// one layer's CPU graph, cut into steps: groups of MUL_MAT_IDs for the team, the rest for ggml on one thread
struct llama_moe_cpu_part {
    // false, with why, when a node does not fit the fast path (the caller then computes the graph whole)
    bool plan(ggml_context * ctx, ggml_cgraph * gf, ggml_threadpool * tp_one, std::string & why);

    // bytes of ggml work memory the one-thread steps need
    size_t work_size() const { return work_bytes; }

    ggml_status compute(llama_moe_cpu_team & team, ggml_threadpool * tp_one, uint8_t * work);

    // the last compute's expert products: microseconds on the team, bytes of expert rows read; and its serial
    // rest: quantizing inputs and listing rows, and the other nodes through ggml
    int64_t products_us() const { return t_products_us; }
    size_t  products_bytes() const { return n_products_bytes; }
    int64_t prepare_us() const { return t_prepare_us; }
    int64_t nodes_us() const { return t_nodes_us; }

private:
    struct mmid {
        ggml_tensor * node = nullptr;
        int src1_q = -1;     // its quantized input among inputs, or -1 when src1 is read as it is
    };
    struct input {           // an F32 input of MUL_MAT_IDs, quantized to their vec_dot type
        ggml_tensor * src = nullptr;
        ggml_type type = GGML_TYPE_F32;
        size_t offset = 0;   // in qbuf
        size_t row_bytes = 0;
        std::vector<uint8_t> ready; // per row, in the step being computed
    };
    struct step {
        ggml_cgraph * gf = nullptr; // ggml's nodes, or
        std::vector<mmid> mmids;    // expert products that do not depend on each other
    };
    struct chunk {
        const mmid * m;
        int32_t k;       // the row of ids
        int32_t expert;
        int64_t r0, r1;  // output rows
    };

    static void run_chunks(void * arg, int ith, int nth);
    bool prepare(const step & s);

    std::vector<step>    steps;
    std::vector<input>   inputs;
    std::vector<uint8_t> qbuf;
    size_t work_bytes = 0;
    // GGML_MMID_CHUNK rows a chunk; 0: a slice per thread, which streams each thread's rows whole. On the H200's
    // host at 50%, a part took 82.6 us that way, 87.2 us with chunks of 32, 103.3 with 16 (docs/benchmarks.md)
    int64_t chunk_rows = 0;
    int     team_size  = 1;
    int64_t prefetch_bytes = 0; // ahead of each thread's products

    int64_t t_products_us    = 0;
    size_t  n_products_bytes = 0;
    int64_t t_prepare_us     = 0;
    int64_t t_nodes_us       = 0;

    std::vector<chunk>   chunks;  // of the step being computed
    std::atomic<size_t>  next_chunk{0};
};
