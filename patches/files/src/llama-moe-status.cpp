#include "llama-moe-status.h"

#include "llama-impl.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <vector>

void llama_moe_cache_report::warn(enum llama_moe_cache_reason reason, const char * fmt, ...) {
    va_list args;
    va_start(args, fmt);
    va_list copy;
    va_copy(copy, args);
    const int n = vsnprintf(nullptr, 0, fmt, copy);
    va_end(copy);
    std::vector<char> buf(n > 0 ? n + 1 : 1, '\0');
    vsnprintf(buf.data(), buf.size(), fmt, args);
    va_end(args);
    LLAMA_LOG_WARN("llama_moe_cache: %s\n", buf.data());
    if (first == LLAMA_MOE_CACHE_REASON_NONE) {
        first = reason;
    }
    reasons |= (uint32_t) reason;
    text += (text.empty() ? "" : "; ") + std::string(buf.data());
}

void llama_moe_cache_report::set_cache(enum llama_moe_cache_mode mode, const std::string & device, int32_t n_slots,
                                       int32_t n_slots_asked, int32_t n_layers, int32_t n_layers_whole, uint64_t n_bytes) {
    made                 = true;
    this->mode           = mode;
    this->device         = device;
    this->n_slots        = n_slots;
    this->n_slots_asked  = n_slots_asked;
    this->n_layers       = n_layers;
    this->n_layers_whole = n_layers_whole;
    this->n_bytes        = n_bytes;
}

// a C string field: truncated where it must be, never unterminated
static void llama_moe_copy_text(char * dst, size_t n, const std::string & src) {
    const size_t len = std::min(src.size(), n - 1);
    memcpy(dst, src.data(), len);
    dst[len] = '\0';
    if (src.size() > len && n > 4) {
        memcpy(dst + n - 4, "...", 4); // said to be cut, not silently shorter
    }
}

void llama_moe_cache_report::get(struct llama_moe_cache_status * out) const {
    *out = {};
    out->state          = !made ? LLAMA_MOE_CACHE_STATE_OFF : reasons ? LLAMA_MOE_CACHE_STATE_PARTIAL : LLAMA_MOE_CACHE_STATE_ON;
    out->reason         = first;
    out->reasons        = reasons;
    out->mode           = made ? mode : LLAMA_MOE_CACHE_MODE_NONE;
    out->mailbox        = made && mailbox;
    out->n_slots        = n_slots;
    out->n_slots_asked  = n_slots_asked;
    out->n_layers       = n_layers;
    out->n_layers_whole = n_layers_whole;
    out->n_bytes        = n_bytes;
    llama_moe_copy_text(out->device, sizeof(out->device), made ? device : "");
    llama_moe_copy_text(out->text, sizeof(out->text), text);
}
