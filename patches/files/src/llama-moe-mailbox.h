#pragma once

// The hybrid MoE cache's mailbox (ggml-mailbox.h): in one-token decoding, each layer the cache holds only in
// part hands the experts it lacks to CPU threads through page-locked host memory, while the GPU computes the
// ones it holds, instead of the scheduler's synchronous copies out and back. CUDA only (and, for tests, the
// CPU as the cache device with LLAMA_MOE_MAILBOX_ON_CPU=1); LLAMA_MOE_CACHE_NO_MAILBOX=1 turns it off.

#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-mailbox.h"
#include "llama-moe-cpu-part.h"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

struct llama_moe_cache;
struct llama_model;
struct llama_batch;
struct llama_memory_i;
struct llama_moe_cache_layer;
struct ggml_gallocr;
struct ggml_threadpool;

// how long the device waits for the CPU's part of one layer before it gives up (the decode then fails);
// LLAMA_MOE_MAILBOX_TIMEOUT_MS overrides it
static constexpr int32_t LLAMA_MOE_MAILBOX_TIMEOUT_MS = 10000;

// of a layer's misses in one token, the share the device reads from the host copy of the experts itself (at least
// one) while the CPU computes the rest, where it can (page-locked experts, no biases). None by default: on the
// H200 the GPU's reads in MMVQ were no faster than the CPU's products (docs/benchmarks.md);
// LLAMA_MOE_MAILBOX_GPU_SHARE sets it
static constexpr float LLAMA_MOE_MAILBOX_GPU_SHARE = 0.0f;

struct llama_moe_mailbox {
    // nullptr, after saying why, when the mailbox cannot or should not run (not CUDA, switched off, no layer).
    // It takes n_threads - 1 CPU threads (LLAMA_MOE_MAILBOX_THREADS overrides). all_on_gpu: every layer and
    // the output run on the GPU, so a one-token graph's CPU work outside the mailbox is its input rows, which
    // context_threads gives one thread: a second team of threads, spinning between its parallel regions
    // (OpenMP's habit), would compete with the mailbox's for the cores.
    static std::unique_ptr<llama_moe_mailbox> create(llama_moe_cache & cache, int n_threads, bool all_on_gpu);
    int context_threads(int n_threads, bool one_token) const {
        return one_token && all_on_gpu ? 1 : n_threads;
    }

    ~llama_moe_mailbox(); // stops the CPU side

    // Graph building. A layer with a slot hands over through it; the CPU part of each such layer is built in
    // cpu_ctx() on cpu_x/cpu_ids (by the same code as the graph's) and given back with set_cpu_part.
    ggml_mailbox_slot * slot(int il) const; // nullptr outside begin_graph/end_graph (llama.cpp's reserve graphs)
    int32_t timeout_ms() const { return timeout; }
    bool    fused() const { return fuse; } // the send repeats the input rows, the recv adds (LLAMA_MOE_MAILBOX_FUSE=0: not)
    // layer il's send of x and the token's selected ids, [n_x, n_rep], that also routes (ggml_mailbox_send_routed):
    // it writes route(il), the ids the device's experts are looked up with, its misses split between the CPU
    // and the device's own reads of the host copy (LLAMA_MOE_MAILBOX_GPU_SHARE)
    ggml_tensor * send_routed(ggml_context * ctx, int il, ggml_tensor * x, ggml_tensor * ids, int64_t n_rep) const;
    ggml_tensor * route(int il) const { return parts[part_of_il.at(il)].route; }
    void           begin_graph();
    ggml_context * cpu_ctx() const { return ctx_cpu; }
    ggml_tensor  * cpu_x  (int il);
    ggml_tensor  * cpu_ids(int il);
    void           set_cpu_part(int il, ggml_tensor * out);
    void           end_graph();

    // Decoding: the CPU side polls from wake (before a graph that hands over runs); end_decode (after the
    // device is done) says whether every hand-over was answered in time and clears the errors; idle, for a decode
    // that returned early, logs and clears them. Either way the CPU side goes back to sleep.
    bool hands_over() const { return graph_hands_over; }
    void wake();
    bool end_decode();
    void idle();

    // whether the model's layers and output are all on GPUs (create's all_on_gpu)
    static bool model_on_gpu(const llama_model & model);

private:
    llama_moe_mailbox() = default;
    void run();                        // the CPU side's thread
    void answer(size_t i, uint64_t step, bool latest); // one step's record, and the CPU's part where it is the latest
    void drain();                      // after the device is done: until the CPU side has read every step
    bool take_errors();                // false where a slot failed (logged), then clears the slots and the abort flag
    bool set_host_reads(int32_t share_milli, bool cuda, std::string & why); // the device's reads of the host copy

    struct layer_part {
        int il = -1;
        ggml_mailbox_slot * slot = nullptr;
        ggml_tensor * x   = nullptr;    // in the slot
        ggml_tensor * ids = nullptr;    // the CPU's ids (-1 for the experts the cache holds)
        ggml_tensor * y   = nullptr;    // in the slot
        ggml_cgraph  * gf     = nullptr;  // its CPU part
        ggml_gallocr * galloc = nullptr;  // that part's memory, kept from graph to graph
        std::unique_ptr<llama_moe_cpu_part> steps; // gf cut for the team, or nullptr: gf whole on one thread
        bool ready = false;
        const llama_moe_cache_layer * layer = nullptr; // the cache's layer il
        ggml_tensor * slot_map = nullptr; // the cache's expert -> slot on the device
        ggml_tensor * route    = nullptr; // the send's lookups, in the device's memory
        int32_t miss_slot  = 0;           // the null slot: the experts the device lacks
        int32_t host_first = 0;           // the first id of the host copy (route)
        int32_t share_milli = 0;          // of its misses the device reads itself, in 1/1000
    };

    llama_moe_cache * cache = nullptr;
    int n_threads   = 1;
    bool all_on_gpu = false;
    int64_t n_used = 0;
    int32_t timeout = LLAMA_MOE_MAILBOX_TIMEOUT_MS;
    bool fuse = true;
    std::atomic<int> stall_il{-1}; // LLAMA_MOE_MAILBOX_TEST_STALL=il: that layer unanswered until a decode fails (tests the timeout)
    int test_delay_us = 0; // LLAMA_MOE_MAILBOX_TEST_DELAY_US: a slow CPU side (tests the ring)
    bool test_empty = false; // LLAMA_MOE_MAILBOX_TEST_EMPTY=1: answer without computing (wrong output; times the hand-over alone)

    ggml_backend_buffer_t buf = nullptr;  // the slots, page-locked where the device has such memory
    ggml_backend_buffer_t buf_slots_cpu = nullptr; // the same memory as the CPU graph's buffer
    ggml_backend_buffer_t buf_steps = nullptr;     // the device's step counts (CUDA), one per slot
    ggml_context        * ctx_routes = nullptr;    // the parts' route tensors,
    ggml_backend_buffer_t buf_routes = nullptr;    // in the device's memory
    std::vector<layer_part> parts;
    std::unique_ptr<std::atomic<uint64_t>[]> done; // per part: the last step the CPU side read
    std::vector<int> part_of_il;          // model layer -> index in parts, -1 for none
    int32_t * cpu_ids_data = nullptr;     // the ids tensors' memory, after the slots: n_used per part
    int32_t * abort_flag   = nullptr;     // after them: the slots' shared abort flag (ggml-mailbox.h)

    // the CPU parts of the graph being decoded, a graph per layer
    std::mutex graph_mutex;
    ggml_context * ctx_cpu = nullptr;
    std::vector<uint8_t> work;
    std::unique_ptr<llama_moe_cpu_team> team; // computes the parts' expert products
    ggml_threadpool * tp_one = nullptr;       // ggml's nodes of the parts, on the team's first thread
    bool building    = false;
    bool graph_hands_over = false; // the graph built last hands over
    bool warned_slow = false;
    bool said_scheduler = false; // the log says once that graphs of several tokens take the scheduler's path

    std::thread worker;
    std::mutex mutex;
    std::condition_variable cv;
    std::atomic<bool> stop{false};
    std::atomic<bool>    in_decode{false}; // between wake and end_decode the CPU side polls
    std::atomic<bool>    new_graph{false}; // set by wake: the CPU side's wait timing starts again
    std::atomic<int64_t> wake_until_us{0}; // and a little after its last answer, for the next token

    // for the exit line
    std::atomic<uint64_t> n_handover{0};
    std::atomic<uint64_t> t_compute_us{0};
    std::atomic<uint64_t> n_empty{0};      // hand-overs whose experts the cache all held
    std::atomic<uint64_t> t_busy_us{0};    // the others: their whole part
    std::atomic<uint64_t> t_products_us{0}; // and their expert products on the team
    std::atomic<uint64_t> n_products_bytes{0};
    std::atomic<uint64_t> t_lookup_us{0};   // and their serial rest: the cache's lookup of the ids,
    std::atomic<uint64_t> t_prepare_us{0};  // quantizing inputs and listing rows,
    std::atomic<uint64_t> t_nodes_us{0};    // the other nodes through ggml
    std::atomic<uint64_t> t_wait_us{0};
    std::atomic<uint64_t> n_wait{0};
    std::atomic<uint64_t> n_rows_gpu{0}; // misses the device read from the host copy itself
    std::atomic<uint64_t> n_no_wait{0};  // routed hand-overs with nothing for the CPU: the device did not wait
    std::atomic<uint64_t> n_lost{0};     // records overwritten after a timeout (not counted; the decode failed)
    std::atomic<bool> failed{false};
    int32_t gpu_share_milli = 0;         // LLAMA_MOE_MAILBOX_GPU_SHARE, where the device can read the host copy
};

// Whichever way a decode returns, the mailbox's CPU side stops polling after it, once the device has finished what
// it queued (it may still hand over); a no-op without a mailbox.
struct llama_moe_mailbox_idle_on_return {
    llama_moe_mailbox  * mailbox;
    ggml_backend_sched_t sched;
    ~llama_moe_mailbox_idle_on_return();
};

// After a hand-over the CPU did not answer in time: the memory of every sequence of the batch as it was before it
// (as for a failed ubatch, but for every ubatch of the call).
void llama_moe_mailbox_forget_batch(const llama_batch & batch, llama_memory_i & memory);
