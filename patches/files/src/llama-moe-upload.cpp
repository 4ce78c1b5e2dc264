#include "llama-moe-upload.h"

#include "llama-impl.h"

#include "ggml.h"
#include "ggml-cpu.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

std::unique_ptr<llama_moe_uploader> llama_moe_uploader::create(ggml_backend_dev_t dev, size_t staging_bytes) {
    GGML_ASSERT(dev != nullptr && staging_bytes > 0);
    const bool on_cpu = ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU;
    std::unique_ptr<llama_moe_uploader> up(new llama_moe_uploader());
    // a backend of its own: its copies do not queue behind the token's computation
    up->backend = ggml_backend_dev_init(dev, nullptr);
    if (up->backend == nullptr) {
        LLAMA_LOG_WARN("%s: %s gives no second backend; admission uploads between decodes, synchronously\n",
                       __func__, ggml_backend_dev_name(dev));
        return nullptr;
    }
    // a copy from pageable memory is not asynchronous (the driver stages it and returns when done)
    ggml_backend_buffer_type_t buft = on_cpu ? ggml_backend_cpu_buffer_type() : ggml_backend_dev_host_buffer_type(dev);
    up->event = on_cpu ? nullptr : ggml_backend_event_new(dev);
    if (buft == nullptr || (!on_cpu && up->event == nullptr)) {
        LLAMA_LOG_WARN("%s: %s has no %s; admission uploads between decodes, synchronously\n", __func__,
                       ggml_backend_dev_name(dev), buft == nullptr ? "page-locked host memory" : "events");
        return nullptr;
    }
    up->host_buft = buft;
    up->staging = ggml_backend_buft_alloc_buffer(buft, staging_bytes);
    if (up->staging == nullptr) {
        LLAMA_LOG_WARN("%s: cannot allocate %.2f MiB of page-locked staging memory; admission uploads between decodes, "
                       "synchronously\n", __func__, staging_bytes / (1024.0 * 1024.0));
        return nullptr;
    }
    // a device buffer's clear makes its device the calling thread's current one (ggml's CUDA buffers set it on use):
    // the worker clears this one first, so that its copies and events are issued from the cache's device
    up->device_probe = ggml_backend_buft_alloc_buffer(ggml_backend_dev_buffer_type(dev), 64);
    if (up->device_probe == nullptr) {
        LLAMA_LOG_WARN("%s: cannot allocate on %s; admission uploads between decodes, synchronously\n", __func__,
                       ggml_backend_dev_name(dev));
        return nullptr;
    }
    up->staging_base  = (uint8_t *) ggml_backend_buffer_get_base(up->staging);
    up->staging_bytes = staging_bytes;
    up->worker = std::thread([p = up.get()] { p->run(); });
    return up;
}

llama_moe_uploader::~llama_moe_uploader() {
    if (worker.joinable()) {
        wait();
        {
            std::lock_guard<std::mutex> lock(mutex);
            stop = true;
        }
        cv.notify_all();
        worker.join();
    }
    if (event) {
        ggml_backend_event_free(event);
    }
    if (staging) {
        ggml_backend_buffer_free(staging);
    }
    if (device_probe) {
        ggml_backend_buffer_free(device_probe);
    }
    if (backend) {
        ggml_backend_free(backend);
    }
}

bool llama_moe_uploader::is_pinned(const ggml_tensor * t) const {
    return t->buffer != nullptr && ggml_backend_buffer_get_type(t->buffer) == host_buft;
}

void llama_moe_uploader::submit(std::vector<llama_moe_upload_piece> pieces) {
    {
        std::lock_guard<std::mutex> lock(mutex);
        GGML_ASSERT(!has_job && "a round submitted before the previous one was waited for");
        job       = std::move(pieces);
        has_job   = true;
        submitted = std::chrono::steady_clock::now();
    }
    cv.notify_all();
}

int64_t llama_moe_uploader::wait() {
    const auto t0 = std::chrono::steady_clock::now();
    {
        std::unique_lock<std::mutex> lock(mutex);
        cv.wait(lock, [this] { return !has_job; });
    }
    if (event) {
        ggml_backend_event_synchronize(event);
    }
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
}

void llama_moe_uploader::run() {
    ggml_backend_buffer_clear(device_probe, 0);
    for (;;) {
        std::vector<llama_moe_upload_piece> pieces;
        {
            std::unique_lock<std::mutex> lock(mutex);
            cv.wait(lock, [this] { return stop || has_job; });
            if (stop && !has_job) {
                return;
            }
            pieces = std::move(job);
        }
        // each piece in a region of its own: the copies before it may still be reading theirs
        size_t off = 0;
        for (const auto & p : pieces) {
            if (p.pinned) {
                // no staging: a memcpy of every admitted expert would take the memory bandwidth and a core the
                // token's CPU part needs, for a copy the device's copy engine does by itself
                ggml_backend_tensor_set_async(backend, p.dst, p.src, p.offset, p.size);
                continue;
            }
            GGML_ASSERT(off + p.size <= staging_bytes && "an admission round larger than its staging memory");
            memcpy(staging_base + off, p.src, p.size);
            ggml_backend_tensor_set_async(backend, p.dst, staging_base + off, p.offset, p.size);
            off += GGML_PAD(p.size, 64);
        }
        if (event) {
            ggml_backend_event_record(event, backend);
            ggml_backend_event_synchronize(event); // here, off the token's path: the round's time is then known
        } else {
            ggml_backend_synchronize(backend);
        }
        {
            std::lock_guard<std::mutex> lock(mutex);
            round_us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - submitted).count();
            has_job  = false;
        }
        cv.notify_all();
    }
}

llama_moe_admit_budget::llama_moe_admit_budget(int32_t admit, int32_t n_layers) : n_layers(std::max(1, n_layers)) {
    chosen = admit < 0;
    n      = chosen ? 1 : admit;
    n_max  = chosen ? n_auto_max : admit;
    n_lo   = n_hi = n;
}

int32_t llama_moe_admit_budget::next_round() {
    const auto now = std::chrono::steady_clock::now();
    if (last.time_since_epoch().count() != 0) {
        const double us = std::chrono::duration<double, std::micro>(now - last).count();
        decode_us = decode_us == 0.0 ? us : 0.8 * decode_us + 0.2 * us;
    }
    last = now;
    if (!chosen) {
        return n;
    }
    if (n == 0 && ++probe_in >= probe_every) {
        probe_in = 0;
        return 1; // a round of one a layer, to measure again
    }
    return n;
}

void llama_moe_admit_budget::round_done(int32_t n_round, int64_t us) {
    if (!chosen || n_round <= 0) {
        return;
    }
    const double per_expert = (double) us / n_round;
    expert_us = expert_us == 0.0 ? per_expert : 0.8 * expert_us + 0.2 * per_expert;
    if (decode_us <= 0.0) {
        return; // no interval measured yet: keep the budget
    }
    // a full round copies up to n experts in each of the layers: it must fit in half a decode's interval
    const double fit = 0.5 * decode_us / (expert_us * n_layers);
    n    = (int32_t) std::clamp(std::floor(fit), 0.0, (double) n_max);
    n_lo = std::min(n_lo, n);
    n_hi = std::max(n_hi, n);
}
