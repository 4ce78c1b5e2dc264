#pragma once

// The MoE expert cache: device copies of experts that live in host RAM (--cpu-moe, --n-cpu-moe), so that
// small ubatches (generation) read them from VRAM. Each cached layer has its own slots: filling one shared
// pool in arrival order hands every slot to the first layers.

#include "llama.h"
#include "llama-moe-accounting.h"
#include "llama-moe-config.h"
#include "llama-moe-devices.h"
#include "llama-moe-status.h"
#include "llama-moe-upload.h"
#include "ggml-backend.h"

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

struct llama_model;
struct llama_moe_profile;
struct ggml_context;
struct ggml_tensor;

// ubatches of up to this many tokens take the cache; larger ones (prompts) keep llama.cpp's path
static constexpr int64_t LLAMA_MOE_CACHE_MAX_UBATCH = 32;

// The adaptive cache (hybrid + --moe-cache-adaptive). Heat is counted per (layer, expert), once per expert
// and ubatch, and fades so that the set follows the conversation rather than its start.
static constexpr double  LLAMA_MOE_ADAPT_HALF_LIFE  = 350.0; // generated tokens: a topic's experts outlive a paragraph, not the chat
static constexpr int64_t LLAMA_MOE_ADAPT_PERIOD     = 32;    // tokens between swap rounds: a round costs a device sync
static constexpr int32_t LLAMA_MOE_ADAPT_MAX_SWAPS  = 64;    // experts per round: bounds the pause between two tokens
static constexpr double  LLAMA_MOE_ADAPT_RATIO      = 1.5;   // an expert comes in only when hotter than 1.5x the one it evicts
static constexpr double  LLAMA_MOE_ADAPT_MARGIN     = 2.0;   //   plus two picks: no flapping between equals
static constexpr double  LLAMA_MOE_ADAPT_PRIOR_TOKENS = 64.0; // a profile's expert starts as hot as its share of this many
                                                              //   tokens' picks: a few picks of text do not evict it, a topic does
static constexpr int64_t LLAMA_MOE_ADAPT_FILL_EVERY = 8;     // free slots fill faster: a start without a profile warms in ~100 tokens
static constexpr int32_t LLAMA_MOE_ADAPT_MAX_FILLS  = 128;

struct llama_moe_cache_params {
    size_t      size = 0;    // bytes
    std::string profile;     // STRP file, empty = start empty
    bool        hybrid   = false;
    bool        adaptive = false;
    int32_t     admit    = 0;     // hybrid: missed experts uploaded per layer between two decodes (0 = none,
                                  // -1 = as many as the engine measures to fit: llama_moe_admit_budget)
};

// The expert chains a layer's MoE FFN runs for one ubatch: one (the model's experts, or the cache's copies
// indexed by slot), or two in hybrid mode (the cached experts on the device, the others on the CPU; their
// outputs are summed before the router weights are applied, once).
struct llama_moe_cache_route {
    int n = 1;
    ggml_tensor * gate[2] = {nullptr, nullptr}; // gate, or merged gate_up
    ggml_tensor * up  [2] = {nullptr, nullptr};
    ggml_tensor * down[2] = {nullptr, nullptr};
    ggml_tensor * ids [2] = {nullptr, nullptr};
    ggml_tensor * gate_b[2] = {nullptr, nullptr}; // expert biases (gpt-oss), indexed by bias_ids
    ggml_tensor * up_b  [2] = {nullptr, nullptr};
    ggml_tensor * down_b[2] = {nullptr, nullptr};
    ggml_tensor * bias_ids[2] = {nullptr, nullptr};
    ggml_tensor * mask[2] = {nullptr, nullptr};   // [1, n_expert_used, n_tokens], 1 or 0: multiplies the chain's output,
                                                  // zeroing the rows the other chain computes
    bool cpu_only[2] = {false, false};            // the chain must run on the CPU (its ids may be -1)
    bool one_id_per_row[2] = {false, false};      // ids are [1, n_expert_used * n_tokens]: the chain takes one
                                                  // activation row per selected expert
};

// Assigns every MUL_MAT_ID and ADD_ID between out and in (exclusive) to the CPU backend.
void llama_moe_cache_pin_mul_mat_id(ggml_backend_sched_t sched, ggml_backend_t backend_cpu, ggml_tensor * out, const ggml_tensor * in);

struct llama_moe_cache_layer {
    int il    = -1;
    int group = -1;          // layers with the same expert tensor types and shapes share a group

    // the model's expert tensors in host memory: gate, up, down (gate may be null; gate_up merged is in gate)
    ggml_tensor * src[3] = {nullptr, nullptr, nullptr};
    // the device copies, [.., .., n_slots]
    ggml_tensor * dst[3] = {nullptr, nullptr, nullptr};
    // hybrid: the experts' biases (gpt-oss), [n, n_expert] in host memory and [n, n_slots + 1] on the device,
    // where the null slot's stay zero so that its part is exactly zero
    ggml_tensor * src_b[3] = {nullptr, nullptr, nullptr};
    ggml_tensor * dst_b[3] = {nullptr, nullptr, nullptr};
    // expert -> slot on the device; the graph's remap node reads it, so it also marks the node. In hybrid
    // mode an expert the cache lacks maps to the null slot (the last, all zeros)
    ggml_tensor * slot_map = nullptr;
    // hybrid: expert -> itself when the CPU computes it, -1 when the cache holds it (in host memory)
    ggml_tensor * cpu_map = nullptr;
    // upload mode, a ubatch whose experts may not all fit the slots (the split, llama_moe_cache::lookup_split):
    // split_ids maps expert -> itself, and the eval callback rewrites its output in place to one code per
    // selection: the slot s < n_slots that holds the expert, or n_slots + e for an expert e the CPU computes.
    // Three fixed maps of [1, n_slots + n_expert] read the codes: the device's slot (0 for the CPU's), its mask
    // (1 or 0) and the CPU's id (-1 for the device's). All in host memory
    ggml_tensor * split_ids  = nullptr;
    ggml_tensor * split_dev  = nullptr;
    ggml_tensor * split_mask = nullptr;
    ggml_tensor * split_cpu  = nullptr;
    bool has_bias = false;

    int     n_expert = 0;
    int     n_used   = 0;     // experts a token selects here
    int     n_slots  = 0;
    size_t  expert_bytes = 0; // one expert's gate + up + down
    bool    whole = false;    // every expert has a slot: no lookups

    std::vector<int32_t>  slot_of;      // expert -> slot, -1 when not cached
    std::vector<int32_t>  expert_in;    // slot -> expert, -1 when free
    std::vector<uint64_t> last_use;     // slot -> ubatch stamp, for LRU
    std::vector<uint8_t>  from_profile; // slot -> filled by the profile and not evicted since
    std::vector<uint8_t>  in_flight;    // slot -> an admission's background upload, not yet known complete: the
                                        //   slot holds expert_in for the LRU, but slot_of does not point to it

    uint64_t n_hit = 0, n_hit_profile = 0, n_miss = 0;
    uint64_t n_refused = 0; // no longer counted (nothing is refused); kept for the API
    uint64_t n_cpu = 0;     // upload mode: of the misses, those the CPU computed (a split's experts that found
                            //   no slot the ubatch does not use)

    std::vector<double> heat; // adaptive: expert -> faded count of ubatches that selected it
    std::vector<int32_t> admit_queue; // admission: the distinct experts missed since the last admission, first seen first
};

struct llama_moe_cache {
    // Returns nullptr, after saying why, when there is nothing to cache (no experts in RAM, no device).
    // nullptr when the cache is off; report says why, and what became of each option
    static std::unique_ptr<llama_moe_cache> create(const llama_model & model, const llama_moe_cache_params & params,
                                                   llama_moe_cache_report & report);

    ~llama_moe_cache();

    // Graph building: the chains a layer runs for this ubatch (see llama_moe_cache_route); a layer the cache
    // does not serve, a prompt or the warmup get the model's own tensors and ids.
    // model: the model's own route (its tensors, biases and the selected experts as ids)
    llama_moe_cache_route build(ggml_context * ctx, int64_t n_tokens, int64_t n_expert_used, bool warmup,
                                const llama_moe_cache_route & model) const;

    // Between a layer's router and its expert matmuls (the scheduler's eval callback, llama-moe-eval.h):
    // whether t is a remap node of ours, and, once it is computed, the lookups and uploads it needs.
    bool wants(const ggml_tensor * t) const;
    void on_computed(ggml_tensor * t);

    // The scheduler's expert copy callback (ggml-backend.h): a large batch's MUL_MAT_ID on the cache's device
    // takes the experts the cache holds from their slots, a device-to-device copy, instead of from RAM.
    static bool copy_expert(ggml_backend_t backend, const ggml_tensor * src, int32_t expert, ggml_tensor * dst,
                            size_t offset, size_t size, void * user_data);

    void    get_stats(llama_moe_cache_stats * out) const;
    int32_t get_layer_stats(llama_moe_cache_layer_stats * out, int32_t n_max) const;
    int32_t get_resident(int32_t il, int32_t * out, int32_t n_max) const;

    // Adaptive: whether a round is due before the next ubatch, and the round itself (returns the experts
    // swapped in, -1 without an adaptive cache). The caller makes sure the device is idle.
    bool    rebalance_due() const;
    int32_t rebalance(int32_t max_swaps);
    bool    adaptive() const { return params.adaptive && params.hybrid; }

    // Admission (hybrid + --moe-cache-admit N): the experts a decode missed are uploaded before the next one,
    // at most N per layer, into the least recently used slots. Whether this or an adaptive round is due, and
    // the work itself; the caller makes sure the device is idle.
    bool    between_decodes_due() const;
    void    between_decodes();
    bool    admitting() const { return params.admit != 0 && params.hybrid; }

    // Uploads the given experts of layer il that the cache lacks, first given first, into free or least recently
    // used slots, now (at most the layer's slots; the caller makes sure the device is idle). Counted as
    // admissions. Returns how many were uploaded (0 for a layer the cache does not look up), -1 for an id out
    // of range.
    int32_t admit_experts(int32_t il, const int32_t * experts, int32_t n);

    // The mailbox's CPU side (llama-moe-mailbox.h): counts one token's selected experts of layer il like the
    // hybrid's graph does, and gives the CPU's ids (-1 for the experts the cache holds).
    void count_selected(int il, const int32_t * selected, int32_t * cpu_ids);
    const std::vector<llama_moe_cache_layer> & get_layers() const { return layers; }
    ggml_backend_dev_t get_device() const { return device; } // nullptr when the slots are on several devices
    // the devices that hold the slots (llama-moe-devices.h), each with its layers; the device of layer index i
    int32_t get_devices(llama_moe_cache_device_status * out, int32_t n_max) const;
    int32_t get_layer_device(int32_t il) const; // index into get_devices, -1 for a layer the cache does not serve
    ggml_backend_dev_t layer_device(int i) const;
    const llama_moe_test_switches & get_test_switches() const { return test; }
    int64_t get_n_expert_used() const { return n_expert_used; } // the most of any cached layer

    size_t buffer_size() const;
    ggml_backend_buffer_type_t buffer_type() const;

    // Per-sequence accounting (llama-moe-accounting.h): the owners of the ubatch about to be computed, and a
    // sequence's share of the counters. The cache's device and whether its profile was refused, and why.
    void set_owners(const llama_ubatch & ubatch);
    llama_moe_cache_seq_stats get_seq_stats(llama_seq_id seq) const;
    void get_info(llama_moe_cache_info * out) const;

private:
    llama_moe_cache() = default;

    bool upload(llama_moe_cache_layer & layer, int32_t expert, int32_t slot);
    void lookup(llama_moe_cache_layer & layer, ggml_tensor * remap);
    void lookup_split(llama_moe_cache_layer & layer, ggml_tensor * codes);
    bool lookup_locked(llama_moe_cache_layer & layer, const int32_t * ids, int64_t n, int64_t n_per_token,
                       std::vector<uint8_t> * on_cpu); // the caller holds mutex
    void count_hybrid(llama_moe_cache_layer & layer, const ggml_tensor * ids);
    double adapt_prior(const llama_moe_cache_layer & layer) const; // the heat a profile's expert starts with
    void count_hybrid_locked(llama_moe_cache_layer & layer, const int32_t * ids, int64_t n_tokens); // the caller holds mutex
    // reads the profile and checks its slot counts against the cached layers; false (said, and kept for get_info)
    // when refused
    bool load_profile(const std::string & path, uint32_t n_layer, llama_moe_profile & profile, llama_moe_cache_report & report);
    void prefill(const llama_moe_profile & profile, const std::string & path);
    void log_layer_slots(size_t n_groups, int n_whole) const;
    void push_slot_map(llama_moe_cache_layer & layer);
    int32_t do_rebalance(int32_t max_swaps, int32_t max_fills, int32_t max_total);
    int32_t admit(); // the caller holds mutex
    void    finish_admission(); // the background round in flight, if any, becomes hits; the caller holds mutex
    void    place_later(llama_moe_cache_layer & layer, int32_t expert, int32_t slot, std::vector<llama_moe_upload_piece> & pieces);
    void    count_by_size(int64_t n_tokens, uint64_t hits, uint64_t misses, uint64_t refused);
    void    log_summary() const;

    llama_moe_cache_params params;
    std::string device_name;
    llama_moe_test_switches test;

    ggml_context * ctx = nullptr;
    ggml_backend_buffer_t buf = nullptr;
    ggml_context * ctx_host = nullptr;      // hybrid: the CPU maps
    ggml_backend_buffer_t buf_host = nullptr;

    std::vector<llama_moe_cache_layer> layers;
    std::unordered_map<const ggml_tensor *, int> layer_of_weight;   // a down_exps tensor -> index in layers
    std::unordered_map<const ggml_tensor *, std::pair<int, int>> slot_of_weight; // an expert tensor -> (layer index, 0..2)
    ggml_backend_dev_t device = nullptr;
    std::vector<llama_moe_cache_device> devices; // one, or one per device the layers are split across
    bool copy_on = true;
    std::unordered_map<const ggml_tensor *, int> layer_of_slot_map; // a slot map tensor -> index in layers
    std::unordered_map<const ggml_tensor *, int> layer_of_cpu_map;  // a CPU map tensor -> index in layers
    std::unordered_map<const ggml_tensor *, int> layer_of_split_map; // a split's ids map -> index in layers
    std::unordered_map<int, int> layer_of_il;                        // a model layer -> index in layers
    std::vector<uint8_t> missed_host; // scratch of count_hybrid and lookup_split (under the mutex)

    std::vector<int32_t> ids_host;   // scratch: the selected experts of a ubatch
    std::vector<int32_t> remap_host; // scratch: their slots
    uint64_t stamp = 0;              // counts ubatch x layer lookups, for LRU

    uint64_t n_bytes_upload = 0;
    uint64_t n_bytes_cpu = 0;
    uint64_t n_copy = 0, n_bytes_copy = 0;
    uint64_t n_swap = 0;
    uint64_t n_admit = 0;
    bool     admit_pending = false; // an admission queue is not empty
    std::unique_ptr<llama_moe_uploader> uploader; // admission in the background (a GPU device), else synchronous
    bool     round_in_flight = false;
    int32_t  round_n         = 0;   // experts of the round in flight
    llama_moe_admit_budget admit_budget; // how many a round may upload per layer
    uint64_t n_admit_rounds  = 0;
    int64_t  admit_wait_us   = 0;   // what decodes waited for background rounds to complete
    uint64_t n_hit_by[2]  = {0, 0}; // [0] ubatches of up to 8 tokens (generation), [1] larger ones, for the exit summary
    uint64_t n_miss_by[2] = {0, 0};
    uint64_t n_refused_by[2] = {0, 0};
    int64_t  n_tokens_small = 0;    // tokens of ubatches that took the cache, the adaptive clock
    int64_t  n_expert_used  = 0;
    int      clock_layer    = -1;   // the layer whose lookups advance the clock (once per ubatch)
    int64_t  next_fill = LLAMA_MOE_ADAPT_FILL_EVERY, next_swap = LLAMA_MOE_ADAPT_PERIOD;
    uint64_t n_prefilled = 0;
    uint64_t n_slots_total = 0;

    llama_moe_accounting acct;   // the sequences' shares of the counters
    std::string profile_error;   // why the profile was refused, "" when it was used or none was given

    // statistics are read from other threads while a decode runs
    mutable std::mutex mutex;
};
