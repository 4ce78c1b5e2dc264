// llama_moe's C API: the ABI check, the MoE cache's status and statistics, the routing trace and the bandwidth probe.

#include "llama.h"
#include "llama-context.h"
#include "llama-moe-cache.h"

#include "ggml-backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

int32_t llama_moe_abi_version(void) {
    return LLAMA_MOE_ABI_VERSION;
}

size_t llama_moe_context_params_size(void) {
    return sizeof(struct llama_context_params);
}

size_t llama_moe_model_params_size(void) {
    return sizeof(struct llama_model_params);
}

size_t llama_moe_cache_status_size(void) {
    return sizeof(struct llama_moe_cache_status);
}

bool llama_moe_cache_get_status(const struct llama_context * ctx, struct llama_moe_cache_status * status) {
    if (ctx == nullptr || status == nullptr) {
        return false;
    }
    ctx->get_moe_report().get(status);
    return true;
}

bool llama_moe_cache_get_stats(const struct llama_context * ctx, struct llama_moe_cache_stats * stats) {
    const llama_moe_cache * cache = ctx ? ctx->get_moe_cache() : nullptr;
    if (cache == nullptr || stats == nullptr) {
        return false;
    }
    cache->get_stats(stats);
    return true;
}

int32_t llama_moe_cache_get_layer_stats(const struct llama_context * ctx, struct llama_moe_cache_layer_stats * stats, int32_t n_max) {
    const llama_moe_cache * cache = ctx ? ctx->get_moe_cache() : nullptr;
    return cache ? cache->get_layer_stats(stats, n_max) : 0;
}

int32_t llama_moe_cache_get_resident(const struct llama_context * ctx, int32_t il, int32_t * experts, int32_t n_max) {
    const llama_moe_cache * cache = ctx ? ctx->get_moe_cache() : nullptr;
    return cache ? cache->get_resident(il, experts, n_max) : 0;
}

int32_t llama_moe_cache_rebalance(struct llama_context * ctx, int32_t max_swaps) {
    llama_moe_cache * cache = ctx ? ctx->get_moe_cache() : nullptr;
    if (cache == nullptr || !cache->adaptive()) {
        return -1; // only an adaptive cache swaps
    }
    ctx->synchronize(); // the swaps overwrite slots a computation in flight may read
    return cache->rebalance(std::max(max_swaps, 0));
}

int32_t llama_moe_cache_admit_experts(struct llama_context * ctx, int32_t il, const int32_t * experts, int32_t n) {
    llama_moe_cache * cache = ctx ? ctx->get_moe_cache() : nullptr;
    if (cache == nullptr || (n > 0 && experts == nullptr) || n < 0) {
        return -1;
    }
    ctx->synchronize(); // the uploads overwrite slots a computation in flight may read
    return cache->admit_experts(il, experts, n);
}

void llama_moe_trace_start(struct llama_context * ctx) {
    ctx->get_moe_trace().start();
}

void llama_moe_trace_stop(struct llama_context * ctx) {
    ctx->get_moe_trace().stop();
}

int64_t llama_moe_trace_get(const struct llama_context * ctx, int32_t * data, int64_t n_max) {
    return ctx->get_moe_trace().get(data, n_max);
}

// seconds of the fastest of a few runs of fn: the first run also pays for first-touch and driver set-up
template <typename F>
static double llama_moe_best_seconds(F && fn) {
    double best = 1e30;
    for (int i = 0; i < 4; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        fn();
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
}

bool llama_moe_measure_bandwidth(int32_t dev_index, size_t n_bytes, struct llama_moe_bandwidth * out) {
    if (out == nullptr || dev_index < 0 || (size_t) dev_index >= ggml_backend_dev_count() || n_bytes == 0) {
        return false;
    }
    *out = {};
    ggml_backend_dev_t dev = ggml_backend_dev_get(dev_index);
    const auto type = ggml_backend_dev_type(dev);
    if (type != GGML_BACKEND_DEVICE_TYPE_GPU && type != GGML_BACKEND_DEVICE_TYPE_IGPU) {
        return false;
    }
    ggml_init_params ip = { 2 * ggml_tensor_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(ip);
    if (ctx == nullptr) {
        return false;
    }
    ggml_tensor * a = ggml_new_tensor_1d(ctx, GGML_TYPE_I8, (int64_t) n_bytes);
    ggml_tensor * b = ggml_new_tensor_1d(ctx, GGML_TYPE_I8, (int64_t) n_bytes);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, ggml_backend_dev_buffer_type(dev));
    if (buf == nullptr) {
        ggml_free(ctx);
        return false;
    }
    std::vector<uint8_t> pageable(n_bytes, 1); // written, so that every page is backed before timing
    const double gb = n_bytes / 1e9;
    // ggml_backend_tensor_set and _copy return when the copy is done
    out->h2d_pageable_gbps = gb / llama_moe_best_seconds([&] { ggml_backend_tensor_set(a, pageable.data(), 0, n_bytes); });
    ggml_backend_buffer_type_t host_buft = ggml_backend_dev_host_buffer_type(dev);
    ggml_backend_buffer_t pinned = host_buft ? ggml_backend_buft_alloc_buffer(host_buft, n_bytes) : nullptr;
    if (pinned != nullptr) {
        void * base = ggml_backend_buffer_get_base(pinned);
        memset(base, 1, n_bytes);
        out->h2d_pinned_gbps = gb / llama_moe_best_seconds([&] { ggml_backend_tensor_set(a, base, 0, n_bytes); });
        ggml_backend_buffer_free(pinned);
    }
    out->d2d_gbps = gb / llama_moe_best_seconds([&] { ggml_backend_tensor_copy(a, b); });
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return true;
}
