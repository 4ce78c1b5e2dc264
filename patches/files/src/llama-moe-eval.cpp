#include "llama-moe-eval.h"

#include "llama-moe-cache.h"

#include "ggml.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

static constexpr char LLAMA_MOE_TOPK_NAME[] = "ffn_moe_topk-";

// the layer of a graph's "ffn_moe_topk-<il>" node, or -1
static int llama_moe_topk_layer(const ggml_tensor * t) {
    if (strncmp(t->name, LLAMA_MOE_TOPK_NAME, sizeof(LLAMA_MOE_TOPK_NAME) - 1) != 0) {
        return -1;
    }
    // only the node itself: views and copies of it are named "ffn_moe_topk-<il> (cont)" and so on
    const char * digits = t->name + sizeof(LLAMA_MOE_TOPK_NAME) - 1;
    char * end = nullptr;
    const long il = strtol(digits, &end, 10);
    return end != digits && *end == '\0' ? (int) il : -1;
}

void llama_moe_trace::start() {
    std::lock_guard<std::mutex> lock(mutex);
    data.clear();
    recording = true;
}

void llama_moe_trace::stop() {
    std::lock_guard<std::mutex> lock(mutex);
    recording = false;
}

int64_t llama_moe_trace::get(int32_t * out, int64_t n_max) const {
    std::lock_guard<std::mutex> lock(mutex);
    const int64_t n = (int64_t) data.size();
    if (out != nullptr && n_max > 0) {
        memcpy(out, data.data(), std::min(n, n_max) * sizeof(int32_t));
    }
    return n;
}

void llama_moe_trace::record(const ggml_tensor * topk, int il) {
    GGML_ASSERT(topk->type == GGML_TYPE_I32);
    const int64_t k = topk->ne[0], n_tokens = topk->ne[1];
    // the top-k is a strided view of the argsort: read its whole span, then pick by stride
    std::vector<int32_t> raw(ggml_nbytes(topk) / sizeof(int32_t) + 1);
    ggml_backend_tensor_get(topk, raw.data(), 0, ggml_nbytes(topk));
    std::lock_guard<std::mutex> lock(mutex);
    data.push_back(il);
    data.push_back((int32_t) n_tokens);
    data.push_back((int32_t) k);
    for (int64_t t = 0; t < n_tokens; ++t) {
        for (int64_t i = 0; i < k; ++i) {
            data.push_back(raw[(t * topk->nb[1] + i * topk->nb[0]) / sizeof(int32_t)]);
        }
    }
}

bool llama_moe_eval::callback(ggml_tensor * t, bool ask, void * user_data) {
    auto * ev = (llama_moe_eval *) user_data;
    const int  il_trace = ev->trace.recording ? llama_moe_topk_layer(t) : -1;
    const bool ours     = il_trace >= 0 || (ev->cache && ev->cache->wants(t));
    if (ask) {
        const bool user = ev->user_cb && ev->user_cb(t, true, ev->user_cb_data);
        return ours || user;
    }
    if (il_trace >= 0) {
        ev->trace.record(t, il_trace);
    }
    if (ev->cache && ev->cache->wants(t)) {
        ev->cache->on_computed(t);
    }
    // the user's callback decides whether the graph goes on; asking again keeps it unaware of us
    if (ev->user_cb && ev->user_cb(t, true, ev->user_cb_data)) {
        return ev->user_cb(t, false, ev->user_cb_data);
    }
    return true;
}

void llama_moe_eval::install(ggml_backend_sched_t sched, llama_moe_cache * moe_cache, ggml_backend_sched_eval_callback cb, void * cb_data) {
    cache = moe_cache;
    if (active()) {
        user_cb      = cb;
        user_cb_data = cb_data;
        ggml_backend_sched_set_eval_callback(sched, llama_moe_eval::callback, this);
    } else {
        ggml_backend_sched_set_eval_callback(sched, cb, cb_data);
    }
}
