#pragma once

// Background uploads of experts into the MoE cache's slots (the hybrid's admission on a GPU): the copies run
// on a second backend instance of the cache's device, so on a stream of their own, while the next token
// computes on the first. A worker thread queues each expert's copy, from where it is when that is the device's
// page-locked memory, else from a staging copy in such memory (a copy from pageable memory is not asynchronous),
// and marks the end of a round with an event. The
// cache reads a slot written this way only after wait() (llama-moe-cache.h).
//
// Only ggml's public backend API: nothing here is specific to one backend.

#include "ggml-backend.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

struct ggml_tensor;

// one copy: size bytes from host memory src into dst at offset; pinned: src is in the device's page-locked
// memory (a model loaded without mmap on a GPU build), from which the device copies asynchronously as it is
struct llama_moe_upload_piece {
    const void  * src;
    ggml_tensor * dst;
    size_t        offset;
    size_t        size;
    bool          pinned;
};

struct llama_moe_uploader {
    // staging_bytes: the most one round copies. Returns nullptr, after saying why, when the device cannot take
    // copies in the background (no second backend instance, no events or no page-locked memory on a GPU).
    // On the CPU device (tests) the worker copies synchronously into plain memory: the same rounds, in order.
    static std::unique_ptr<llama_moe_uploader> create(ggml_backend_dev_t dev, size_t staging_bytes);

    ~llama_moe_uploader();

    // Hands a round's copies to the worker and returns at once. The caller has waited for the round before
    // (wait()), and its pieces fit the staging memory.
    void submit(std::vector<llama_moe_upload_piece> pieces);

    // Waits until the round submitted last is on the device (normally long done); returns the microseconds waited.
    int64_t wait();

    // The microseconds the round waited for last took, from its submission to its last byte on the device
    // (the worker waits for the copies itself to know), for choosing how many experts a round may copy.
    int64_t last_round_us() const { return round_us.load(); }

    size_t staging_size() const { return staging_bytes; }

    // whether t's memory is the device's page-locked host memory, so its copies need no staging
    bool is_pinned(const ggml_tensor * t) const;

private:
    llama_moe_uploader() = default;
    void run();

    ggml_backend_t        backend = nullptr;
    ggml_backend_buffer_t staging = nullptr;
    ggml_backend_buffer_type_t host_buft = nullptr; // the staging memory's type
    ggml_backend_event_t  event   = nullptr;
    ggml_backend_buffer_t device_probe = nullptr; // a few bytes on the device, cleared by the worker at its start
    uint8_t *             staging_base  = nullptr;
    size_t                staging_bytes = 0;

    std::thread             worker;
    std::mutex              mutex;
    std::condition_variable cv;
    std::vector<llama_moe_upload_piece> job; // the round the worker has to copy
    bool has_job = false;                    // a round submitted and not yet on the device
    std::chrono::steady_clock::time_point submitted;
    std::atomic<int64_t> round_us{0};
    bool stop    = false;
};

// How many missed experts per layer an admission round may upload (--moe-cache-admit N, or "auto": chosen by
// the engine). With a fixed N it is N. Chosen, it is the most whose copies fit in half the time between two
// decodes, from the measured copy time of an expert and the measured decode interval (both averaged), at most
// n_max; 0 when even one a layer would not fit, and then a round of one a layer every probe_every decodes
// measures again. Starts at 1.
struct llama_moe_admit_budget {
    static constexpr int32_t n_auto_max  = 4;
    static constexpr int32_t probe_every = 32;

    llama_moe_admit_budget() = default;
    llama_moe_admit_budget(int32_t admit, int32_t n_layers); // admit > 0: fixed; -1: chosen

    // at each admission: the budget of this round (the decode interval is measured from call to call)
    int32_t next_round();
    // a round uploaded n experts in us microseconds (its copies, in the background or not)
    void    round_done(int32_t n, int64_t us);

    bool    chosen = false;
    int32_t n      = 0;
    int32_t n_max  = 0;
    int32_t n_lo   = 0, n_hi = 0; // the range the chosen budget took
    double  expert_us = 0.0;      // averaged copy time of one expert
    double  decode_us = 0.0;      // averaged time from one admission to the next

private:
    int32_t n_layers = 0;
    int32_t probe_in = 0;
    std::chrono::steady_clock::time_point last{};
};
