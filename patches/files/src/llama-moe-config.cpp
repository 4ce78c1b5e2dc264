#include "llama-moe-config.h"

#include "llama-impl.h"

#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <strings.h>

const char * llama_moe_env_str(const char * name) {
    const char * v = getenv(name);
    return v != nullptr && *v != '\0' ? v : nullptr;
}

int64_t llama_moe_env_int(const char * name, int64_t def, int64_t lo, int64_t hi) {
    const char * v = llama_moe_env_str(name);
    if (v == nullptr) {
        return def;
    }
    errno = 0;
    char * end = nullptr;
    const long long x = strtoll(v, &end, 10);
    // strtoll alone would take "2junk" as 2, and clamp what overflows
    if (end == v || *end != '\0' || errno == ERANGE || x < lo || x > hi) {
        LLAMA_LOG_WARN("%s: %s=%s is not a whole number from %" PRId64 " to %" PRId64 "; using %" PRId64 "\n",
                       __func__, name, v, lo, hi, def);
        return def;
    }
    return x;
}

bool llama_moe_env_flag(const char * name, bool def) {
    const char * v = llama_moe_env_str(name);
    if (v == nullptr) {
        return def;
    }
    for (const char * t : { "1", "true", "on", "yes" }) {
        if (strcasecmp(v, t) == 0) {
            return true;
        }
    }
    for (const char * f : { "0", "false", "off", "no" }) {
        if (strcasecmp(v, f) == 0) {
            return false;
        }
    }
    LLAMA_LOG_WARN("%s: %s=%s is not 1 or 0 (true/false, on/off, yes/no); using %d\n", __func__, name, v, def ? 1 : 0);
    return def;
}

float llama_moe_env_float(const char * name, float def, float lo, float hi) {
    const char * v = llama_moe_env_str(name);
    if (v == nullptr) {
        return def;
    }
    char * end = nullptr;
    const float x = strtof(v, &end);
    if (end == v || *end != '\0' || !std::isfinite(x) || x < lo || x > hi) {
        LLAMA_LOG_WARN("%s: %s=%s is not a number from %g to %g; using %g\n", __func__, name, v, lo, hi, def);
        return def;
    }
    return x;
}

llama_moe_test_switches llama_moe_test_switches_read() {
    llama_moe_test_switches t;
    t.mailbox_stall_il = (int) llama_moe_env_int("LLAMA_MOE_MAILBOX_TEST_STALL", -1, 0, 1 << 20);
    t.mailbox_delay_us = (int) llama_moe_env_int("LLAMA_MOE_MAILBOX_TEST_DELAY_US", 0, 0, 10 * 1000 * 1000);
    t.mailbox_empty    = llama_moe_env_flag("LLAMA_MOE_MAILBOX_TEST_EMPTY", false);
    t.device_free_kib  = llama_moe_env_int("LLAMA_MOE_TEST_DEVICE_FREE_KIB", -1, 0, INT64_C(1) << 40);
    return t;
}
