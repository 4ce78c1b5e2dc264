#ifndef LLAMA_MOE_H
#define LLAMA_MOE_H

// llama_moe [EXPERIMENTAL]: a VRAM cache for the MoE experts kept in host RAM. Included by llama.h; its fields
// in llama_context_params are there (moe_cache_*).

#include "llama.h"

#ifdef __cplusplus
extern "C" {
#endif

    // Bumped whenever a struct or function below, or a field llama_moe adds to llama.h's structs, changes;
    // a binding compares it, and the struct sizes, with what it was written for before any other call.
    #define LLAMA_MOE_ABI_VERSION 6

    LLAMA_API int32_t llama_moe_abi_version(void);
    LLAMA_API size_t  llama_moe_context_params_size(void);
    LLAMA_API size_t  llama_moe_model_params_size(void);

    struct llama_moe_cache_stats {
        uint64_t n_hit;          // selected experts the cache held (ubatches of up to 32 tokens)
        uint64_t n_hit_profile;  // of them, experts the profile put there and that were never evicted since
        uint64_t n_miss;         // selected experts the cache did not hold: uploaded, or computed on the CPU (hybrid)
        uint64_t n_bytes_upload; // bytes of those uploads
        uint64_t n_bytes_cpu;    // bytes of the experts the CPU computed (hybrid; upload mode: n_cpu's)
        bool     hybrid;
        uint64_t n_copy;         // experts large batches copied from the cache instead of from RAM
        uint64_t n_bytes_copy;
        uint64_t n_slots;        // expert slots, all devices
        uint64_t n_prefilled;    // slots the profile filled at load
        uint64_t n_bytes_cache;  // device memory of the cache
        uint64_t n_swap;         // adaptive: experts swapped into the cache
        uint64_t n_refused;      // selected experts of the lookups refused (below): none any more
        uint64_t n_resident;     // slots that hold an expert now
        uint64_t n_admit;        // hybrid admission: missed experts uploaded between decodes
        uint64_t n_cpu;          // upload mode: of the misses, those the CPU computed (below)
    };

    enum llama_moe_cache_state {
        LLAMA_MOE_CACHE_STATE_OFF     = 0, // no cache: none was asked for, or none could be made (reasons say why)
        LLAMA_MOE_CACHE_STATE_ON      = 1, // the cache as asked
        LLAMA_MOE_CACHE_STATE_PARTIAL = 2, // a cache, but other than asked (reasons say how)
    };

    // the conditions that leave the cache other than asked, as bits of llama_moe_cache_status.reasons
    enum llama_moe_cache_reason {
        LLAMA_MOE_CACHE_REASON_NONE            = 0,
        LLAMA_MOE_CACHE_REASON_NO_SIZE         = 1 << 0, // cache options without a size: there is no cache
        LLAMA_MOE_CACHE_REASON_NO_DEVICE       = 1 << 1, // no GPU to hold it, or LLAMA_MOE_CACHE_DEVICE names none
        LLAMA_MOE_CACHE_REASON_NO_LAYER        = 1 << 2, // no layer keeps its experts in RAM in a form the cache can copy
        LLAMA_MOE_CACHE_REASON_TOO_SMALL       = 1 << 3, // the size cannot hold one expert per layer
        LLAMA_MOE_CACHE_REASON_NO_ROOM         = 1 << 4, // the device's free memory cannot hold one expert per layer
        LLAMA_MOE_CACHE_REASON_FEWER_SLOTS     = 1 << 5, // the device's free memory holds fewer slots than the size asks
        LLAMA_MOE_CACHE_REASON_LAYERS_SKIPPED  = 1 << 6, // some layers in RAM keep llama.cpp's path (scales, biases)
        LLAMA_MOE_CACHE_REASON_PROFILE_REFUSED = 1 << 7, // the profile was refused: the cache starts empty
        LLAMA_MOE_CACHE_REASON_OPTION_IGNORED  = 1 << 8, // an option that cannot apply with the others is ignored
        LLAMA_MOE_CACHE_REASON_STAYS_EMPTY     = 1 << 9, // a hybrid with nothing to fill it: the CPU computes every expert
    };

    enum llama_moe_cache_mode {
        LLAMA_MOE_CACHE_MODE_NONE     = 0,
        LLAMA_MOE_CACHE_MODE_UPLOAD   = 1, // misses uploaded (an LRU)
        LLAMA_MOE_CACHE_MODE_HYBRID   = 2, // misses computed on the CPU
        LLAMA_MOE_CACHE_MODE_ADAPTIVE = 3, // the hybrid, swapping the hottest experts in while generating
    };

    // What became of the cache asked for, decided when the context was created.
    struct llama_moe_cache_status {
        int32_t  state;           // enum llama_moe_cache_state
        int32_t  reason;          // the first condition met (enum llama_moe_cache_reason), NONE when as asked
        uint32_t reasons;         // every condition met, as bits
        int32_t  mode;            // enum llama_moe_cache_mode of the cache made (NONE when off)
        bool     mailbox;         // hybrid: one-token decoding hands the CPU's experts over through the mailbox
        int32_t  n_slots;         // slots per layer (a layer with fewer experts holds them all)
        int32_t  n_slots_asked;   // what the size asked for would give, before the device's free memory
        int32_t  n_layers;        // layers the cache serves
        int32_t  n_layers_whole;  // of them, layers it holds whole
        uint64_t n_bytes;         // device memory of the cache
        char     device[128];     // the device that holds it ("" when off)
        char     text[1024];      // every condition, in words, "; " between them ("" when as asked)
    };

    LLAMA_API size_t llama_moe_cache_status_size(void);

    // Fills status for any context, with or without a cache; false only for a null argument.
    LLAMA_API bool   llama_moe_cache_get_status(const struct llama_context * ctx, struct llama_moe_cache_status * status);

    // The devices that hold the cache's slots: one, or one per device the model's layers are split across
    // (each layer's slots on the device that computes it, --moe-cache-mib bytes on each).
    struct llama_moe_cache_device_status {
        char     name[128];        // the device ("CUDA1", "RPC0")
        char     description[128]; // what ggml says of it (an RPC server's host:port)
        int32_t  n_layers;         // layers whose slots it holds
        int32_t  n_slots;          // slots per layer (a layer with fewer experts holds them all)
        uint64_t n_slots_total;    // slots of all its layers
        uint64_t n_bytes;          // its memory for the cache
        uint64_t n_hit;            // its layers' counters (llama_moe_cache_layer_stats)
        uint64_t n_miss;
        uint64_t n_cpu;
    };

    // Fills up to n_max devices; returns how many there are (0 without a cache).
    LLAMA_API int32_t llama_moe_cache_get_devices(const struct llama_context * ctx, struct llama_moe_cache_device_status * devices, int32_t n_max);
    // The index (in llama_moe_cache_get_devices) of the device that holds layer il's slots; -1 for a layer without.
    LLAMA_API int32_t llama_moe_cache_get_layer_device(const struct llama_context * ctx, int32_t il);

    struct llama_moe_cache_layer_stats {
        int32_t  il;
        int32_t  n_slots;
        uint64_t n_hit;
        uint64_t n_hit_profile;
        uint64_t n_miss;
        uint64_t n_refused;
        uint64_t n_cpu;
    };

    // The counters run from context creation; "hits" and "misses" count distinct experts per ubatch and layer.
    // hits + misses + refused are the distinct experts selected per ubatch (of up to 32 tokens) and layer the cache
    // serves and does not hold whole, and the hit ratio is hits / (hits + misses + refused). "refused" counted the
    // experts of the lookups upload mode once refused (a ubatch whose tokens x n_expert_used exceed a layer's
    // slots); it now refuses none, and the field stays for the API, always 0. Such a ubatch is split instead: its
    // hits come from the cache, its misses are uploaded into the slots the ubatch does not use, and those left
    // without one are computed on the CPU from RAM, counted as misses and in "n_cpu".
    // false (stats untouched) when the context has no MoE cache
    LLAMA_API bool    llama_moe_cache_get_stats(const struct llama_context * ctx, struct llama_moe_cache_stats * stats);

    // one entry per layer the cache serves; fills at most n_max and returns how many there are (n_max = 0 sizes the array)
    LLAMA_API int32_t llama_moe_cache_get_layer_stats(const struct llama_context * ctx, struct llama_moe_cache_layer_stats * stats, int32_t n_max);

    // the expert ids the cache holds in layer il now; same sizing convention (0 for a layer it does not serve)
    LLAMA_API int32_t llama_moe_cache_get_resident(const struct llama_context * ctx, int32_t il, int32_t * experts, int32_t n_max);

    // Routing traces: while started, the experts the router selects in every MoE layer of every ubatch are
    // recorded (at the cost of one device sync per layer). start clears what was recorded.
    LLAMA_API void    llama_moe_trace_start(struct llama_context * ctx);
    LLAMA_API void    llama_moe_trace_stop (struct llama_context * ctx);

    // the records since start as int32: per ubatch and MoE layer, {il, n_tokens, k, n_tokens x k expert ids};
    // copies at most n_max values and returns how many there are (n_max = 0 sizes the buffer)
    LLAMA_API int64_t llama_moe_trace_get(const struct llama_context * ctx, int32_t * data, int64_t n_max);

    // adaptive cache: upload at most max_swaps of the hottest experts the cache lacks, into free slots first, then in
    // place of the coldest it holds, now.
    // Waits for the device, so call it between decodes. Returns the number of swaps, or -1 when the context has
    // no adaptive MoE cache.
    LLAMA_API int32_t llama_moe_cache_rebalance(struct llama_context * ctx, int32_t max_swaps);

    // Upload the given experts of layer il that the cache lacks, first given first, into its free or least
    // recently used slots, now (at most its slots): a saved working set brought back before the next token.
    // Waits for the device, so call it between decodes. Counted as admissions (n_admit). Returns how many were
    // uploaded (0 for a layer the cache does not look up), or -1 without a cache or for an id out of range.
    LLAMA_API int32_t llama_moe_cache_admit_experts(struct llama_context * ctx, int32_t il, const int32_t * experts, int32_t n);

    // A sequence's share of the counters (llama-server: a slot's), since context creation. Each distinct expert a
    // ubatch selects in a layer counts once in llama_moe_cache_stats, and goes whole to the sequence of the first
    // token (in ubatch order) that selected it, so the sequences' shares add up exactly to the context's hits,
    // misses, refused selections, bytes uploaded for misses and bytes the CPU computed. The uploads between
    // decodes (admissions, adaptive swaps) are no sequence's. false (stats untouched) without a MoE cache.
    struct llama_moe_cache_seq_stats {
        uint64_t n_hit;
        uint64_t n_miss;
        uint64_t n_refused;
        uint64_t n_bytes_upload;
        uint64_t n_bytes_cpu;
    };
    LLAMA_API bool llama_moe_cache_get_seq_stats(const struct llama_context * ctx, llama_seq_id seq_id, struct llama_moe_cache_seq_stats * stats);

    struct llama_moe_cache_info {
        char    device[128];        // the device that holds the cache ("CPU" with LLAMA_MOE_CACHE_DEVICE=CPU)
        char    profile_error[256]; // why the profile was refused; "" when it was used or none was given
        bool    profile_refused;
        int32_t n_slots_layer;      // slots per cached layer (every layer has as many, or all its experts)
        int32_t n_layers;           // layers the cache serves
    };
    // false (info untouched) without a MoE cache
    LLAMA_API bool llama_moe_cache_get_info(const struct llama_context * ctx, struct llama_moe_cache_info * info);

    struct llama_moe_bandwidth {
        double h2d_pageable_gbps; // host to device from ordinary (pageable) memory, as from an mmap'd model
        double h2d_pinned_gbps;   // host to device from page-locked memory; 0 when the device has none
        double d2d_gbps;          // a copy within the device, bytes copied per second (each is read and written)
    };

    // Measures the copy bandwidths of backend device dev_index (ggml_backend_dev_get) with buffers of n_bytes,
    // best of a few tries. false when the device is not a GPU or the buffers cannot be allocated.
    LLAMA_API bool    llama_moe_measure_bandwidth(int32_t dev_index, size_t n_bytes, struct llama_moe_bandwidth * out);

#ifdef __cplusplus
}
#endif

#endif // LLAMA_MOE_H
