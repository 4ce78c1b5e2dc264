#pragma once

// What became of the MoE cache asked for (llama_moe_cache_get_status): each condition that leaves it other than
// asked is recorded with its reason and said once in the log, so that a binding reads it rather than the log.

#include "llama.h"

#include <cstdint>
#include <string>

struct llama_moe_cache_report {
    // a condition met: logged as a warning ("llama_moe_cache: " and the text) and kept with its reason
    void warn(enum llama_moe_cache_reason reason, const char * fmt, ...)
#ifdef __GNUC__
        __attribute__((format(printf, 3, 4)))
#endif
        ;

    // the cache made (after create): its mode, device, slots and layers
    void set_cache(enum llama_moe_cache_mode mode, const std::string & device, int32_t n_slots, int32_t n_slots_asked,
                   int32_t n_layers, int32_t n_layers_whole, uint64_t n_bytes);
    void set_mailbox(bool on) { mailbox = on; }

    bool has(enum llama_moe_cache_reason reason) const { return (reasons & (uint32_t) reason) != 0; }
    void get(struct llama_moe_cache_status * out) const;

private:
    uint32_t    reasons = 0;
    int32_t     first   = LLAMA_MOE_CACHE_REASON_NONE;
    std::string text;
    bool        made    = false;
    int32_t     mode    = LLAMA_MOE_CACHE_MODE_NONE;
    bool        mailbox = false;
    std::string device;
    int32_t     n_slots = 0, n_slots_asked = 0, n_layers = 0, n_layers_whole = 0;
    uint64_t    n_bytes = 0;
};
