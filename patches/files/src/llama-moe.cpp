// llama_moe's C API: the ABI check and the MoE cache's statistics.

#include "llama.h"
#include "llama-context.h"
#include "llama-moe-cache.h"

#include <algorithm>

int32_t llama_moe_abi_version(void) {
    return LLAMA_MOE_ABI_VERSION;
}

size_t llama_moe_context_params_size(void) {
    return sizeof(struct llama_context_params);
}

size_t llama_moe_model_params_size(void) {
    return sizeof(struct llama_model_params);
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

void llama_moe_trace_start(struct llama_context * ctx) {
    ctx->get_moe_trace().start();
}

void llama_moe_trace_stop(struct llama_context * ctx) {
    ctx->get_moe_trace().stop();
}

int64_t llama_moe_trace_get(const struct llama_context * ctx, int32_t * data, int64_t n_max) {
    return ctx->get_moe_trace().get(data, n_max);
}
