#include "llama-moe-accounting.h"

#include "llama-batch.h"
#include "llama-context.h"
#include "llama-moe-cache.h"

#include "ggml-backend.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

void llama_moe_accounting::set_owners(const llama_ubatch & ubatch) {
    owner.resize(ubatch.n_tokens);
    for (uint32_t i = 0; i < ubatch.n_tokens; ++i) {
        const bool has = ubatch.n_seq_id != nullptr && ubatch.seq_id != nullptr && ubatch.n_seq_id[i] > 0;
        owner[i] = has ? ubatch.seq_id[i][0] : -1;
    }
}

void llama_moe_accounting::charge(int64_t i, kind k, uint64_t bytes_upload, uint64_t bytes_cpu) {
    // a token outside the ubatch set last: a graph computed without llama_decode (none of a sequence)
    const llama_seq_id seq = i >= 0 && i < (int64_t) owner.size() ? owner[i] : -1;
    llama_moe_cache_seq_stats * s = &none;
    if (seq >= 0) {
        if ((size_t) seq >= by_seq.size()) {
            by_seq.resize(seq + 1, llama_moe_cache_seq_stats{});
        }
        s = &by_seq[seq];
    }
    s->n_hit     += k == HIT;
    s->n_miss    += k == MISS;
    s->n_refused += k == REFUSED;
    s->n_bytes_upload += bytes_upload;
    s->n_bytes_cpu    += bytes_cpu;
}

llama_moe_cache_seq_stats llama_moe_accounting::get(llama_seq_id seq) const {
    return seq >= 0 && (size_t) seq < by_seq.size() ? by_seq[seq] : llama_moe_cache_seq_stats{};
}

//
// the cache's side (llama-moe-cache.h): under its mutex, like every counter
//

void llama_moe_cache::set_owners(const llama_ubatch & ubatch) {
    std::lock_guard<std::mutex> lock(mutex);
    acct.set_owners(ubatch);
}

llama_moe_cache_seq_stats llama_moe_cache::get_seq_stats(llama_seq_id seq) const {
    std::lock_guard<std::mutex> lock(mutex);
    return acct.get(seq);
}

void llama_moe_cache::get_info(llama_moe_cache_info * out) const {
    std::lock_guard<std::mutex> lock(mutex);
    *out = {};
    // on several devices: each with its layers (llama-moe-devices.h)
    const std::string where = device ? ggml_backend_dev_name(device) : devices.size() > 1 ? llama_moe_cache_devices_describe(devices, layers) : "?";
    snprintf(out->device, sizeof(out->device), "%s", where.c_str());
    snprintf(out->profile_error, sizeof(out->profile_error), "%s", profile_error.c_str());
    out->profile_refused = !profile_error.empty();
    int32_t most = 0;
    for (const auto & l : layers) {
        most = std::max(most, (int32_t) l.n_slots);
    }
    out->n_slots_layer = most;
    out->n_layers      = (int32_t) layers.size();
}

//
// C API
//

bool llama_moe_cache_get_seq_stats(const struct llama_context * ctx, llama_seq_id seq_id, struct llama_moe_cache_seq_stats * stats) {
    const llama_moe_cache * cache = ctx ? ctx->get_moe_cache() : nullptr;
    if (cache == nullptr || stats == nullptr) {
        return false;
    }
    *stats = cache->get_seq_stats(seq_id);
    return true;
}

bool llama_moe_cache_get_info(const struct llama_context * ctx, struct llama_moe_cache_info * info) {
    const llama_moe_cache * cache = ctx ? ctx->get_moe_cache() : nullptr;
    if (cache == nullptr || info == nullptr) {
        return false;
    }
    cache->get_info(info);
    return true;
}
