// llama_moe's knobs of the CPU backend (moe-knobs.h)

#include "moe-knobs.h"

#include "ggml-impl.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

int ggml_mmid_chunk_rows(void) {
    static int rows = -1;
    if (rows < 0) {
        rows = 32;
        const char * env = getenv("GGML_MMID_CHUNK");
        if (env != NULL && *env != '\0') {
            // strictly a count: atoi would take "2junk" as 2 and "-1" as a count
            char * end = NULL;
            errno = 0;
            const long long v = strtoll(env, &end, 10);
            if (end == env || *end != '\0' || errno == ERANGE || v < 0 || v > (1 << 16)) {
                GGML_LOG_WARN("%s: GGML_MMID_CHUNK=%s is not a whole number from 0 to 65536; using 32\n", __func__, env);
            } else {
                rows = (int) v;
            }
        }
    }
    return rows;
}

static int64_t  g_cpu_op_us[GGML_OP_COUNT];
static uint64_t g_cpu_op_n[GGML_OP_COUNT];

static void ggml_cpu_op_profile_print(void) {
    int64_t total = 0;
    for (int op = 0; op < GGML_OP_COUNT; ++op) {
        total += g_cpu_op_us[op];
    }
    fprintf(stderr, "ggml_cpu_op_profile: %.3f ms on thread 0, by op (the op and the barrier after it)\n", total / 1e3);
    for (int op = 0; op < GGML_OP_COUNT; ++op) {
        if (g_cpu_op_n[op] > 0) {
            fprintf(stderr, "ggml_cpu_op_profile: %-16s %10" PRIu64 " ops %10.3f ms %5.1f %%\n", ggml_op_name((enum ggml_op) op),
                    g_cpu_op_n[op], g_cpu_op_us[op] / 1e3, total > 0 ? 100.0 * g_cpu_op_us[op] / total : 0.0);
        }
    }
}

bool ggml_cpu_op_profile_on(void) {
    static int on = -1; // thread 0 of one graph at a time reads and sets it
    if (on < 0) {
        const char * env = getenv("GGML_CPU_OP_PROFILE");
        on = env != NULL && atoi(env) != 0;
        if (on) {
            atexit(ggml_cpu_op_profile_print);
        }
    }
    return on;
}

void ggml_cpu_op_profile_add(enum ggml_op op, int64_t us) {
    g_cpu_op_us[op] += us;
    g_cpu_op_n[op]  += 1;
}
