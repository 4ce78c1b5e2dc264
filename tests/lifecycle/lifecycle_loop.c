// The lifecycle loop of issue 10: creates and frees models and contexts with every MoE cache mode, decodes
// in each (a prompt, a small multi-token ubatch, single tokens), reads every statistic the patches export
// and frees everything, ITERATIONS times. Built with -fsanitize=address by tests/test_lifecycle.py (LeakSanitizer
// then reports what libllama leaks, uninstrumented as it is: ASan intercepts malloc and operator new in the
// whole process), and without it by tests/gpu/lifecycle_cuda.sh, under compute-sanitizer.
//
//   lifecycle_loop MODEL PROFILE ITERATIONS [MODES]
//
// MODES is a comma-separated subset of none,upload,upload-profile,hybrid,hybrid-adaptive (default: all).
// Exit status: 0 done, 1 a failure (printed), 2 usage, 77 the header this was built with is not the library's.
// The driver's own variables: LIFECYCLE_CACHE_DEVICE names the cache's device (CPU on a machine without a GPU;
// unset: the GPU), LIFECYCLE_MAILBOX_ON_CPU=1 runs the mailbox with the CPU as the device, LIFECYCLE_VERBOSE=1
// prints llama.cpp's log.
#include "llama.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// llama.cpp's pattern of the expert tensors (common/common.h's LLM_FFN_EXPS_REGEX): --cpu-moe
#define EXPERTS_REGEX "\\.ffn_(up|down|gate|gate_up)_(ch|)exps"
#define CACHE_BYTES ((size_t) (1.5 * 1024 * 1024)) // the tiny model: 10 of each layer's 32 experts

struct mode {
    const char * name;
    size_t       cache;
    int          profile;
    int          hybrid;
    int          adaptive;
};

static const struct mode MODES[] = {
    { "none",            0,           0, 0, 0 },
    { "upload",          CACHE_BYTES, 0, 0, 0 },
    { "upload-profile",  CACHE_BYTES, 1, 0, 0 },
    { "hybrid",          CACHE_BYTES, 1, 1, 0 },
    { "hybrid-adaptive", CACHE_BYTES, 0, 1, 1 },
};
#define N_MODES ((int) (sizeof(MODES) / sizeof(MODES[0])))

static int verbose;
static int n_warnings;

static void log_cb(enum ggml_log_level level, const char * text, void * user) {
    (void) user;
    if (level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR) {
        n_warnings++;
    }
    if (verbose || level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

static int fail(const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("lifecycle_loop: FAILED: ", stdout);
    vprintf(fmt, ap);
    fputc('\n', stdout);
    va_end(ap);
    return 1;
}

static llama_token argmax(struct llama_context * ctx, int32_t n_vocab) {
    const float * logits = llama_get_logits_ith(ctx, -1);
    llama_token best = 0;
    for (int32_t i = 1; i < n_vocab; ++i) {
        if (logits[i] > logits[best]) {
            best = i;
        }
    }
    return best;
}

// decodes n tokens at positions pos.. as one batch, logits for the last
static int decode(struct llama_context * ctx, struct llama_batch * b, const llama_token * tokens, int n, int pos) {
    b->n_tokens = n;
    for (int i = 0; i < n; ++i) {
        b->token[i]     = tokens[i];
        b->pos[i]       = pos + i;
        b->n_seq_id[i]  = 1;
        b->seq_id[i][0] = 0;
        b->logits[i]    = i == n - 1;
    }
    return llama_decode(ctx, *b);
}

// everything the patches export about the cache, read and checked for consistency
static int read_stats(struct llama_context * ctx, const struct mode * m, int32_t n_layer, uint64_t * n_seen) {
    struct llama_moe_cache_stats s;
    memset(&s, 0, sizeof(s));
    const bool has = llama_moe_cache_get_stats(ctx, &s);
    if (has != (m->cache > 0)) {
        return fail("%s: llama_moe_cache_get_stats says %s", m->name, has ? "a cache" : "no cache");
    }
    const int32_t n = llama_moe_cache_get_layer_stats(ctx, NULL, 0);
    if (n < 0 || n > n_layer || (m->cache > 0) != (n > 0)) {
        return fail("%s: %d cached layers", m->name, n);
    }
    struct llama_moe_cache_layer_stats * layers = calloc((size_t) n + 1, sizeof(*layers));
    const int32_t got = llama_moe_cache_get_layer_stats(ctx, layers, n);
    uint64_t hits = 0;
    for (int32_t i = 0; i < got && i < n; ++i) {
        hits += layers[i].n_hit + layers[i].n_miss;
    }
    int rc = 0;
    for (int32_t il = 0; il < n_layer && rc == 0; ++il) {
        const int32_t k = llama_moe_cache_get_resident(ctx, il, NULL, 0);
        int32_t * experts = malloc(((size_t) k + 1) * sizeof(int32_t));
        const int32_t k2 = llama_moe_cache_get_resident(ctx, il, experts, k);
        if (k < 0 || k2 != k) {
            rc = fail("%s: layer %d: resident %d then %d", m->name, il, k, k2);
        }
        free(experts);
    }
    if (rc == 0 && (got != n || hits != s.n_hit + s.n_miss)) {
        rc = fail("%s: layer stats (%d layers, %llu lookups) disagree with the totals (%d, %llu)", m->name, got,
                  (unsigned long long) hits, n, (unsigned long long) (s.n_hit + s.n_miss));
    }
    *n_seen += s.n_hit + s.n_miss + s.n_swap;
    free(layers);
    return rc;
}

static int run_mode(const char * model_path, const char * profile, const struct mode * m, uint64_t * n_seen) {
    struct llama_model_tensor_buft_override overrides[2] = {
        { EXPERTS_REGEX, ggml_backend_cpu_buffer_type() },
        { NULL, NULL },
    };
    struct llama_model_params mp = llama_model_default_params();
    mp.tensor_buft_overrides = overrides; // the experts in RAM (--cpu-moe)
    mp.use_extra_bufts       = false;     // --no-repack: the cache copies experts out of the file's layout
    struct llama_model * model = llama_model_load_from_file(model_path, mp);
    if (!model) {
        return fail("%s: cannot load %s", m->name, model_path);
    }
    const struct llama_vocab * vocab = llama_model_get_vocab(model);
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    const int32_t n_layer = llama_model_n_layer(model);

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx              = 256;
    cp.n_batch            = 64;
    cp.n_ubatch           = 64;
    cp.n_threads          = 2;
    cp.n_threads_batch    = 2;
    cp.moe_cache.size           = m->cache;
    cp.moe_cache.profile        = m->profile ? profile : NULL;
    cp.moe_cache.hybrid         = m->hybrid;
    cp.moe_cache.adaptive       = m->adaptive;
    cp.moe_cache.device         = getenv("LIFECYCLE_CACHE_DEVICE");
    cp.moe_cache.mailbox_on_cpu = getenv("LIFECYCLE_MAILBOX_ON_CPU") != NULL;
    int rc = 0;
    // two contexts on the model one after the other: the second finds whatever the first left behind
    for (int c = 0; c < 2 && rc == 0; ++c) {
        struct llama_context * ctx = llama_init_from_model(model, cp);
        if (!ctx) {
            rc = fail("%s: cannot create a context", m->name);
            break;
        }
        struct llama_batch batch = llama_batch_init(64, 0, 1);
        llama_token prompt[64];
        const char * text = "The ship left the harbour at dawn, and the gulls followed it out past the lighthouse.";
        int n = llama_tokenize(vocab, text, (int32_t) strlen(text), prompt, 64, true, false);
        if (n <= 8) {
            rc = fail("%s: tokenize gave %d", m->name, n);
        }
        if (c == 1 && rc == 0) {
            llama_moe_trace_start(ctx); // the second context records its routing
        }
        int pos = 0;
        if (rc == 0 && decode(ctx, &batch, prompt, n, pos) != 0) { // the prompt: one large ubatch
            rc = fail("%s: decoding the prompt", m->name);
        }
        pos += n;
        llama_token next[3];
        for (int i = 0; i < 3 && rc == 0; ++i) {
            next[i] = argmax(ctx, n_vocab);
        }
        if (rc == 0 && decode(ctx, &batch, next, 3, pos) != 0) { // a small multi-token ubatch
            rc = fail("%s: decoding 3 tokens", m->name);
        }
        pos += 3;
        for (int i = 0; i < 12 && rc == 0; ++i) { // generation: single-token ubatches
            llama_token t = argmax(ctx, n_vocab);
            if (decode(ctx, &batch, &t, 1, pos++) != 0) {
                rc = fail("%s: decoding token %d", m->name, i);
            }
            const int32_t swaps = llama_moe_cache_rebalance(ctx, 4);
            if ((swaps >= 0) != (m->hybrid && m->adaptive)) {
                rc = fail("%s: llama_moe_cache_rebalance returned %d", m->name, swaps);
            }
        }
        if (rc == 0) {
            rc = read_stats(ctx, m, n_layer, n_seen);
        }
        if (c == 1) {
            llama_moe_trace_stop(ctx);
            const int64_t nt = llama_moe_trace_get(ctx, NULL, 0);
            int32_t * data = malloc(((size_t) (nt > 0 ? nt : 0) + 1) * sizeof(int32_t));
            if (rc == 0 && (nt <= 0 || llama_moe_trace_get(ctx, data, nt) != nt)) {
                rc = fail("%s: the routing trace holds %lld values", m->name, (long long) nt);
            }
            free(data);
        }
        llama_memory_clear(llama_get_memory(ctx), true);
        llama_batch_free(batch);
        llama_free(ctx);
    }
    llama_model_free(model);
    return rc;
}

int main(int argc, char ** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL PROFILE ITERATIONS [MODES]\n", argv[0]);
        return 2;
    }
    const char * model_path = argv[1];
    const char * profile    = argv[2];
    const int iterations    = atoi(argv[3]);
    const char * only       = argc > 4 ? argv[4] : NULL;
    verbose = getenv("LIFECYCLE_VERBOSE") != NULL;

    llama_log_set(log_cb, NULL);
    if (llama_moe_abi_version() != LLAMA_MOE_ABI_VERSION ||
        llama_moe_context_params_size() != sizeof(struct llama_context_params) ||
        llama_moe_model_params_size() != sizeof(struct llama_model_params)) {
        printf("lifecycle_loop: built against another llama.h (ABI %d, the library's %d)\n", LLAMA_MOE_ABI_VERSION,
               llama_moe_abi_version());
        return 77;
    }
    llama_backend_init();
    int rc = 0, runs = 0;
    uint64_t n_seen = 0;
    for (int it = 0; it < iterations && rc == 0; ++it) {
        for (int i = 0; i < N_MODES && rc == 0; ++i) {
            if (only) { // a whole word of the list
                const char * p = strstr(only, MODES[i].name);
                const size_t len = strlen(MODES[i].name);
                if (!p || (p != only && p[-1] != ',') || (p[len] != '\0' && p[len] != ',')) {
                    continue;
                }
            }
            rc = run_mode(model_path, profile, &MODES[i], &n_seen);
            runs++;
        }
    }
    if (getenv("LIFECYCLE_PLANT_LEAK")) {
        // the test's proof that leaks inside the uninstrumented libllama are seen: a batch (malloc) and a
        // model (operator new, and ggml's buffers) that are never freed
        struct llama_batch leaked = llama_batch_init(512, 0, 1);
        (void) leaked;
        if (!llama_model_load_from_file(model_path, llama_model_default_params())) {
            rc = fail("cannot load %s", model_path);
        }
    }
    llama_backend_free();
    if (rc == 0) {
        printf("lifecycle_loop: %d iterations, %d model+context cycles, %llu cache lookups and swaps, %d warnings\n",
               iterations, runs, (unsigned long long) n_seen, n_warnings);
    }
    return rc;
}
