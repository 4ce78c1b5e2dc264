#pragma once

// What llama_moe runs between a layer's router and its expert matmuls, through the scheduler's eval
// callback: the MoE cache's lookups and the routing trace. The user's cb_eval still sees every node.

#include "ggml-backend.h"

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

struct llama_moe_cache;

// The experts the router selected, for every ubatch and MoE layer while recording: a flat int32 stream of
// records {il, n_tokens, k, n_tokens x k expert ids}.
struct llama_moe_trace {
    std::atomic<bool> recording{false};
    std::vector<int32_t> data;
    mutable std::mutex mutex;

    void start();
    void stop();
    int64_t get(int32_t * out, int64_t n_max) const;
    void record(const ggml_tensor * topk, int il);
};

struct llama_moe_eval {
    llama_moe_cache * cache = nullptr;
    llama_moe_trace   trace;

    ggml_backend_sched_eval_callback user_cb = nullptr;
    void * user_cb_data = nullptr;

    bool active() const { return cache != nullptr || trace.recording; }

    static bool callback(ggml_tensor * t, bool ask, void * user_data);

    // the scheduler's eval callback before a graph: ours, chaining to the user's, while the cache or the trace
    // needs it, else the user's alone
    void install(ggml_backend_sched_t sched, llama_moe_cache * moe_cache, ggml_backend_sched_eval_callback cb, void * cb_data);
};
