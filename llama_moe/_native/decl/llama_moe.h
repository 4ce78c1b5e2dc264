// What llama_moe's patch series declares in include/llama-moe.h (included by include/llama.h), as cffi declarations.

int32_t llama_moe_abi_version(void);
size_t  llama_moe_context_params_size(void);
size_t  llama_moe_model_params_size(void);
struct llama_moe_cache_params llama_moe_cache_default_params(void);

struct llama_moe_cache_stats {
    uint64_t n_hit;
    uint64_t n_hit_profile;
    uint64_t n_miss;
    uint64_t n_bytes_upload;
    uint64_t n_bytes_cpu;
    bool     hybrid;
    uint64_t n_copy;
    uint64_t n_bytes_copy;
    uint64_t n_slots;
    uint64_t n_prefilled;
    uint64_t n_bytes_cache;
    uint64_t n_swap;
    uint64_t n_refused;
    uint64_t n_resident;
    uint64_t n_admit;
    uint64_t n_cpu;
    uint64_t n_repartition;
    uint64_t n_moved;
    uint64_t n_hit_peer;
    uint64_t n_slots_peer;
    uint64_t n_upload;
    uint64_t n_admitted;
    uint64_t n_bytes_peer;
    bool     ram_tier;
    uint64_t n_disk_reads;
    uint64_t n_bytes_disk;
    uint64_t disk_wait_us;
    uint64_t n_bytes_disk_prompt;
    bool     ram_below;
    uint64_t n_ram_hit;
    uint64_t n_ram_miss;
};

// the enums as include/llama-moe.h declares them: the binding reads their names from here
enum llama_moe_cache_state {
    LLAMA_MOE_CACHE_STATE_OFF     = 0,
    LLAMA_MOE_CACHE_STATE_ON      = 1,
    LLAMA_MOE_CACHE_STATE_PARTIAL = 2,
};

enum llama_moe_cache_reason {
    LLAMA_MOE_CACHE_REASON_NONE            = 0,
    LLAMA_MOE_CACHE_REASON_NO_SIZE         = 1,
    LLAMA_MOE_CACHE_REASON_NO_DEVICE       = 2,
    LLAMA_MOE_CACHE_REASON_NO_LAYER        = 4,
    LLAMA_MOE_CACHE_REASON_TOO_SMALL       = 8,
    LLAMA_MOE_CACHE_REASON_NO_ROOM         = 16,
    LLAMA_MOE_CACHE_REASON_FEWER_SLOTS     = 32,
    LLAMA_MOE_CACHE_REASON_LAYERS_SKIPPED  = 64,
    LLAMA_MOE_CACHE_REASON_PROFILE_REFUSED = 128,
    LLAMA_MOE_CACHE_REASON_OPTION_IGNORED  = 256,
    LLAMA_MOE_CACHE_REASON_STAYS_EMPTY     = 512,
    LLAMA_MOE_CACHE_REASON_DRAFT           = 1024,
    LLAMA_MOE_CACHE_REASON_SLOW_LINK       = 2048,
    LLAMA_MOE_CACHE_REASON_NO_TIER         = 4096,
};

enum llama_moe_cache_choice {
    LLAMA_MOE_CACHE_CHOICE_FLAGS    = 0,
    LLAMA_MOE_CACHE_CHOICE_AUTO     = 1,
    LLAMA_MOE_CACHE_CHOICE_UPLOAD   = 2,
    LLAMA_MOE_CACHE_CHOICE_HYBRID   = 3,
    LLAMA_MOE_CACHE_CHOICE_ADAPTIVE = 4,
    LLAMA_MOE_CACHE_CHOICE_ADMIT    = 5,
};

enum llama_moe_cache_mode {
    LLAMA_MOE_CACHE_MODE_NONE     = 0,
    LLAMA_MOE_CACHE_MODE_UPLOAD   = 1,
    LLAMA_MOE_CACHE_MODE_HYBRID   = 2,
    LLAMA_MOE_CACHE_MODE_ADAPTIVE = 3,
};

struct llama_moe_cache_status {
    int32_t  state;
    int32_t  reason;
    uint32_t reasons;
    int32_t  mode;
    bool     mailbox;
    int32_t  n_slots;
    int32_t  n_slots_asked;
    int32_t  n_layers;
    int32_t  n_layers_whole;
    uint64_t n_bytes;
    char     device[128];
    char     text[1024];
    char     profile_error[256];
    char     peer[128];
    int32_t  admit;
    bool     mode_auto;
    bool     size_auto;
    double   link_gbps;
    double   cpu_gbps;
    char     choice[1024];
    bool     ram_tier;
    bool     disk_direct;
};

size_t  llama_moe_cache_status_size(void);
bool    llama_moe_cache_get_status(const struct llama_context * ctx, struct llama_moe_cache_status * status);

struct llama_moe_cache_device_status {
    char     name[128];
    char     description[128];
    int32_t  n_layers;
    int32_t  n_slots;
    uint64_t n_slots_total;
    uint64_t n_bytes;
    uint64_t n_hit;
    uint64_t n_miss;
    uint64_t n_cpu;
};

int32_t llama_moe_cache_get_devices(const struct llama_context * ctx, struct llama_moe_cache_device_status * devices, int32_t n_max);
int32_t llama_moe_cache_get_layer_device(const struct llama_context * ctx, int32_t il);

struct llama_moe_cache_layer_stats {
    int32_t  il;
    int32_t  n_slots;
    uint64_t n_hit;
    uint64_t n_hit_profile;
    uint64_t n_miss;
    uint64_t n_refused;
    uint64_t n_cpu;
    int32_t  n_slots_peer;
    uint64_t n_hit_peer;
    uint64_t n_bytes_disk;
    uint64_t disk_wait_us;
};

bool    llama_moe_cache_get_stats(const struct llama_context * ctx, struct llama_moe_cache_stats * stats);
double  llama_moe_cache_hit_rate(uint64_t n_hit, uint64_t n_miss, uint64_t n_refused);
int32_t llama_moe_cache_get_layer_stats(const struct llama_context * ctx, struct llama_moe_cache_layer_stats * stats, int32_t n_max);
int32_t llama_moe_cache_get_resident(const struct llama_context * ctx, int32_t il, int32_t * experts, int32_t n_max);
int32_t llama_moe_cache_rebalance(struct llama_context * ctx, int32_t max_swaps);
int32_t llama_moe_cache_admit_experts(struct llama_context * ctx, int32_t il, const int32_t * experts, int32_t n);

struct llama_moe_cache_seq_stats {
    uint64_t n_hit;
    uint64_t n_miss;
    uint64_t n_refused;
    uint64_t n_bytes_upload;
    uint64_t n_bytes_cpu;
    uint64_t n_upload;
    uint64_t n_cpu;
    uint64_t n_hit_peer;
};

bool llama_moe_cache_get_seq_stats(const struct llama_context * ctx, int32_t seq_id, struct llama_moe_cache_seq_stats * stats);

void    llama_moe_trace_start(struct llama_context * ctx);
void    llama_moe_trace_stop(struct llama_context * ctx);
int64_t llama_moe_trace_get(const struct llama_context * ctx, int32_t * data, int64_t n_max);

struct llama_moe_bandwidth {
    double h2d_pageable_gbps;
    double h2d_pinned_gbps;
    double d2d_gbps;
};

bool    llama_moe_measure_bandwidth(int32_t dev_index, size_t n_bytes, struct llama_moe_bandwidth * out);

struct llama_moe_layer_shape {
    int32_t  il;
    int32_t  n_expert;
    int32_t  n_used;
    int32_t  group;
    uint64_t expert_bytes;
    uint64_t bias_bytes;
};

int32_t llama_moe_cache_size_slots(const struct llama_moe_layer_shape * layers, int32_t n_layers, uint64_t size, bool hybrid,
                                   const uint32_t * layer_slots, int32_t n_layer_slots, int32_t * slots, char * err, size_t err_size);
int32_t llama_moe_cache_max_ubatch(void);
double  llama_moe_cache_adaptive_half_life(void);

struct llama_moe_replay_params {
    int32_t mode;
    int32_t admit;
    int32_t admit_auto;
    bool    admit_background;
    int32_t repartition;
    const uint16_t * ranked;
    int32_t n_ranked;
};

struct llama_moe_replay;

struct llama_moe_replay * llama_moe_replay_init(const struct llama_moe_replay_params * params, const struct llama_moe_layer_shape * layers,
                                                const int32_t * slots, const int32_t * peer_slots, int32_t n_layers, char * err, size_t err_size);
void    llama_moe_replay_free(struct llama_moe_replay * replay);
int32_t llama_moe_replay_feed(struct llama_moe_replay * replay, const int32_t * data, int64_t n, char * err, size_t err_size);

struct llama_moe_replay_layer_stats {
    int32_t  il;
    int32_t  n_slots;
    int32_t  n_resident;
    int32_t  n_slots_peer;
    uint64_t n_hit;
    uint64_t n_hit_profile;
    uint64_t n_miss;
    uint64_t n_upload;
    uint64_t n_cpu;
    uint64_t n_hit_peer;
    uint64_t n_admit;
    uint64_t n_swap;
    uint64_t n_fill;
    uint64_t n_lookup;
    uint64_t n_split;
    uint64_t n_large;
    uint64_t n_token;
    uint64_t n_token_resident;
    uint64_t n_ram_hit;
    uint64_t n_ram_miss;
};

struct llama_moe_replay_stats {
    uint64_t n_decodes;
    uint64_t n_prefilled;
    uint64_t n_bytes_upload;
    uint64_t n_bytes_cpu;
    uint64_t n_admit;
    uint64_t n_swap;
    uint64_t n_repartition;
    uint64_t n_repart_rounds;
    uint64_t n_moved;
    uint64_t n_demoted;
    uint64_t n_ram_demoted;
    uint64_t n_ram_fill;
    uint64_t n_bytes_disk;
    uint64_t n_bytes_ram_fill;
};

int32_t llama_moe_replay_set_ram_tier(struct llama_moe_replay * replay, const int32_t * ram_slots, char * err, size_t err_size);
int32_t llama_moe_replay_get_layer_stats(const struct llama_moe_replay * replay, struct llama_moe_replay_layer_stats * stats, int32_t n_max);
void    llama_moe_replay_get_stats(const struct llama_moe_replay * replay, struct llama_moe_replay_stats * stats);
int32_t llama_moe_replay_get_slots(const struct llama_moe_replay * replay, int32_t il, int32_t * experts, int32_t n_max);
