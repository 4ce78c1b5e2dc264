#include "moe-cache.h"

#include "build-info.h"
#include "common.h"
#include "log.h"

#include "hash/hash.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <vector>

#ifdef _WIN32
#include <process.h>
#define llama_moe_getpid _getpid
#else
#include <unistd.h>
#define llama_moe_getpid getpid
#endif

using json = nlohmann::ordered_json;

static constexpr double MiB = 1024.0*1024.0;

static bool profile_refused(const llama_context * ctx) {
    llama_moe_cache_info info;
    return ctx != nullptr && llama_moe_cache_get_info(ctx, &info) && info.profile_refused;
}

//
// metrics
//

std::string common_moe_cache_metrics(const llama_context * ctx) {
    llama_moe_cache_stats s;
    if (ctx == nullptr || !llama_moe_cache_get_stats(ctx, &s)) {
        return "";
    }
    struct item { const char * name; const char * help; double value; };
    const item counters[] = {
        { "moe_cache_hits_total",         "MoE cache: selected experts the cache held (ubatches of up to 32 tokens)", (double) s.n_hit },
        { "moe_cache_hits_profile_total", "MoE cache: hits on experts the profile placed and that were never evicted", (double) s.n_hit_profile },
        { "moe_cache_misses_total",       "MoE cache: selected experts the cache did not hold", (double) s.n_miss },
        { "moe_cache_refused_total",      "MoE cache: selected experts of refused lookups (none: upload mode splits a ubatch its "
                                          "slots cannot hold, moe_cache_cpu_total)", (double) s.n_refused },
        { "moe_cache_upload_bytes_total", "MoE cache: bytes uploaded for misses", (double) s.n_bytes_upload },
        { "moe_cache_cpu_bytes_total",    "MoE cache: bytes of the experts the CPU computed (hybrid)", (double) s.n_bytes_cpu },
        { "moe_cache_copies_total",       "MoE cache: experts large batches copied from the cache instead of from RAM", (double) s.n_copy },
        { "moe_cache_swaps_total",        "MoE cache: experts the adaptive cache swapped in", (double) s.n_swap },
        { "moe_cache_admissions_total",   "MoE cache: missed experts the hybrid uploaded between decodes (--moe-cache-admit)", (double) s.n_admit },
        { "moe_cache_cpu_total",          "MoE cache: upload mode's misses the CPU computed (a ubatch that selects more experts "
                                          "than a layer's slots: the slots serve what they can, the CPU the rest)", (double) s.n_cpu },
    };
    // a refused lookup counts against the ratio: a cache too small for its ubatches must not look like a good one
    const uint64_t n_lookup = s.n_hit + s.n_miss + s.n_refused;
    const item gauges[] = {
        { "moe_cache_hit_ratio", "MoE cache: hits / (hits + misses + refused) since the start, 0 before the first lookup",
          n_lookup ? (double) s.n_hit / n_lookup : 0.0 },
        { "moe_cache_slots",     "MoE cache: expert slots", (double) s.n_slots },
        { "moe_cache_resident",  "MoE cache: slots that hold an expert now", (double) s.n_resident },
        { "moe_cache_prefilled", "MoE cache: slots the profile filled at load", (double) s.n_prefilled },
        { "moe_cache_bytes",     "MoE cache: device memory of the cache", (double) s.n_bytes_cache },
        { "moe_cache_hybrid",    "MoE cache: 1 with --moe-cache-hybrid", s.hybrid ? 1.0 : 0.0 },
        { "moe_cache_profile_refused", "MoE cache: 1 when the profile given was refused (the log and the audit log say why)",
          profile_refused(ctx) ? 1.0 : 0.0 },
    };
    std::ostringstream out;
    out.precision(17);
    auto add = [&](const char * type, const item & it) {
        out << "# HELP llamacpp:" << it.name << " " << it.help << "\n"
            << "# TYPE llamacpp:" << it.name << " " << type << "\n"
            << "llamacpp:" << it.name << " " << it.value << "\n";
    };
    for (const auto & it : counters) {
        add("counter", it);
    }
    for (const auto & it : gauges) {
        add("gauge", it);
    }
    const int32_t n = llama_moe_cache_get_layer_stats(ctx, nullptr, 0);
    std::vector<llama_moe_cache_layer_stats> layers(std::max(n, 1));
    llama_moe_cache_get_layer_stats(ctx, layers.data(), n);
    const struct { const char * name; const char * help; uint64_t llama_moe_cache_layer_stats::* field; } per_layer[] = {
        { "moe_cache_layer_hits_total",         "MoE cache: hits per layer",                   &llama_moe_cache_layer_stats::n_hit },
        { "moe_cache_layer_hits_profile_total", "MoE cache: hits on profile experts per layer", &llama_moe_cache_layer_stats::n_hit_profile },
        { "moe_cache_layer_misses_total",       "MoE cache: misses per layer",                 &llama_moe_cache_layer_stats::n_miss },
        { "moe_cache_layer_refused_total",      "MoE cache: refused selections per layer",     &llama_moe_cache_layer_stats::n_refused },
    };
    for (const auto & series : per_layer) {
        out << "# HELP llamacpp:" << series.name << " " << series.help << "\n"
            << "# TYPE llamacpp:" << series.name << " counter\n";
        for (int32_t i = 0; i < n; ++i) {
            out << "llamacpp:" << series.name << "{layer=\"" << layers[i].il << "\"} " << layers[i].*series.field << "\n";
        }
    }
    // each sequence's share (llama-server: a slot's; the slots' add up to the totals above, admissions aside)
    const uint32_t n_seq = llama_n_seq_max(ctx);
    std::vector<llama_moe_cache_seq_stats> seqs(n_seq);
    for (uint32_t q = 0; q < n_seq; ++q) {
        llama_moe_cache_get_seq_stats(ctx, (llama_seq_id) q, &seqs[q]);
    }
    const struct { const char * name; const char * help; uint64_t llama_moe_cache_seq_stats::* field; } per_seq[] = {
        { "moe_cache_seq_hits_total",         "MoE cache: hits charged to each sequence (llama-server: slot)",    &llama_moe_cache_seq_stats::n_hit },
        { "moe_cache_seq_misses_total",       "MoE cache: misses charged to each sequence",                       &llama_moe_cache_seq_stats::n_miss },
        { "moe_cache_seq_refused_total",      "MoE cache: refused selections charged to each sequence",           &llama_moe_cache_seq_stats::n_refused },
        { "moe_cache_seq_upload_bytes_total", "MoE cache: bytes uploaded for each sequence's misses",             &llama_moe_cache_seq_stats::n_bytes_upload },
        { "moe_cache_seq_cpu_bytes_total",    "MoE cache: bytes the CPU read for each sequence's misses (hybrid)", &llama_moe_cache_seq_stats::n_bytes_cpu },
    };
    for (const auto & series : per_seq) {
        out << "# HELP llamacpp:" << series.name << " " << series.help << "\n"
            << "# TYPE llamacpp:" << series.name << " counter\n";
        for (uint32_t q = 0; q < n_seq; ++q) {
            out << "llamacpp:" << series.name << "{seq=\"" << q << "\"} " << seqs[q].*series.field << "\n";
        }
    }
    return out.str();
}

//
// the audit log
//

namespace {

struct audit_target {
    std::string path;
    bool failed = false; // warn once, not on every record
};

std::mutex                                        g_audit_mutex;
std::map<const llama_context *, audit_target>     g_audit;

std::string utc_now_iso() {
    const auto now = std::chrono::system_clock::now();
    const std::time_t t = std::chrono::system_clock::to_time_t(now);
    const int ms = (int) (std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
    std::tm tm{};
#ifdef _WIN32
    gmtime_s(&tm, &t);
#else
    gmtime_r(&t, &tm);
#endif
    char buf[40];
    std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
    char out[48];
    snprintf(out, sizeof(out), "%s.%03dZ", buf, ms);
    return out;
}

json record(const char * event, const llama_context * ctx) {
    llama_moe_cache_stats s = {};
    llama_moe_cache_get_stats(ctx, &s);
    return json {
        { "event",        event },
        { "time",         utc_now_iso() },
        { "pid",          (int64_t) llama_moe_getpid() },
        { "hybrid",       s.hybrid },
        { "hits",         s.n_hit },
        { "hits_profile", s.n_hit_profile },
        { "misses",       s.n_miss },
        { "refused",      s.n_refused },
        { "bytes_upload", s.n_bytes_upload },
        { "bytes_cpu",    s.n_bytes_cpu },
        { "copies",       s.n_copy },
        { "bytes_copy",   s.n_bytes_copy },
        { "swaps",        s.n_swap },
    };
}

json layers_json(const llama_context * ctx) {
    json out = json::array();
    const int32_t n = llama_moe_cache_get_layer_stats(ctx, nullptr, 0);
    std::vector<llama_moe_cache_layer_stats> layers(std::max(n, 1));
    llama_moe_cache_get_layer_stats(ctx, layers.data(), n);
    for (int32_t i = 0; i < n; ++i) {
        const int32_t n_res = llama_moe_cache_get_resident(ctx, layers[i].il, nullptr, 0);
        std::vector<int32_t> resident(std::max(n_res, 1));
        llama_moe_cache_get_resident(ctx, layers[i].il, resident.data(), n_res);
        resident.resize(n_res);
        out.push_back({
            { "il",           layers[i].il },
            { "slots",        layers[i].n_slots },
            { "hits",         layers[i].n_hit },
            { "hits_profile", layers[i].n_hit_profile },
            { "misses",       layers[i].n_miss },
            { "refused",      layers[i].n_refused },
            { "resident",     resident },
        });
    }
    return out;
}

// one record, one open-append-close: a crash loses at most the record being written
void append(const llama_context * ctx, const json & rec) {
    std::lock_guard<std::mutex> lock(g_audit_mutex);
    auto it = g_audit.find(ctx);
    if (it == g_audit.end()) {
        return;
    }
    const std::string line = rec.dump() + "\n";
    FILE * f = fopen(it->second.path.c_str(), "a");
    bool ok = f != nullptr;
    if (f) {
        ok = fwrite(line.data(), 1, line.size(), f) == line.size();
        ok = fclose(f) == 0 && ok;
    }
    if (!ok && !it->second.failed) {
        LOG_WRN("llama_moe: cannot append to the audit log %s: %s; later records are lost until it is writable\n",
                it->second.path.c_str(), strerror(errno));
    }
    it->second.failed = !ok;
}

} // namespace

// one line at load, at default verbosity: what the operator asked for and what the context has
static void log_load(const llama_context * ctx, const common_params & params) {
    llama_moe_cache_stats s;
    llama_moe_cache_info info;
    const bool on = ctx != nullptr && llama_moe_cache_get_stats(ctx, &s) && llama_moe_cache_get_info(ctx, &info);
    if (!on) {
        if (params.moe_cache_mib > 0) {
            LOG_WRN("llama_moe: MoE cache off: --moe-cache-mib %g asked for one, but the context has none (the warning "
                    "above says why)%s\n", params.moe_cache_mib,
                    params.moe_cache_profile.empty() ? "" : "; the profile is not used");
        }
        return;
    }
    const char * mode = !s.hybrid ? "upload mode" : params.moe_cache_adaptive ? "hybrid, adaptive" :
                        params.moe_cache_admit != 0 ? "hybrid, admitting" : "hybrid";
    std::string profile = "no profile";
    if (!params.moe_cache_profile.empty()) {
        profile = info.profile_refused
            ? "profile " + params.moe_cache_profile + " refused: " + info.profile_error + "; the cache starts empty"
            : "profile " + params.moe_cache_profile + ": " + std::to_string(s.n_prefilled) + " experts prefilled";
    }
    LOG_INF("llama_moe: MoE cache on: %.2f MiB, %d slots per layer in %d layers (%" PRIu64 " in all), %s, on %s, %s\n",
            s.n_bytes_cache / MiB, info.n_slots_layer, info.n_layers, s.n_slots, mode, info.device, profile.c_str());
}

void common_moe_audit_load(const llama_context * ctx, const common_params & params, double load_ms) {
    log_load(ctx, params);
    if (params.moe_cache_audit.empty() || ctx == nullptr) {
        return;
    }
    llama_moe_cache_stats any;
    if (!llama_moe_cache_get_stats(ctx, &any)) {
        // still written (load, ready, requests, exit), but every counter in it stays 0
        LOG_WRN("llama_moe: --moe-cache-audit %s: the context has no MoE cache (--moe-cache-mib N with --cpu-moe or "
                "--n-cpu-moe), so the audit log's counters all stay 0\n", params.moe_cache_audit.c_str());
    }
    {
        std::lock_guard<std::mutex> lock(g_audit_mutex);
        g_audit[ctx] = { params.moe_cache_audit, false };
    }
    const llama_model * model = llama_get_model(ctx);
    char name[256] = "";
    llama_model_meta_val_str(model, "general.name", name, sizeof(name));
    std::error_code ec;
    const auto model_bytes = std::filesystem::file_size(params.model.path, ec);

    json overrides = json::array();
    for (const auto & o : params.tensor_buft_overrides) {
        if (o.pattern != nullptr) {
            overrides.push_back(o.pattern);
        }
    }
    json devices = json::array();
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        const auto type = ggml_backend_dev_type(dev);
        if (type != GGML_BACKEND_DEVICE_TYPE_GPU && type != GGML_BACKEND_DEVICE_TYPE_IGPU) {
            continue;
        }
        size_t free = 0, total = 0;
        ggml_backend_dev_memory(dev, &free, &total);
        devices.push_back({
            { "name",        ggml_backend_dev_name(dev) },
            { "description", ggml_backend_dev_description(dev) },
            { "mib_free",    (int64_t) (free / MiB) },
            { "mib_total",   (int64_t) (total / MiB) },
        });
    }
    json profile = nullptr;
    if (!params.moe_cache_profile.empty()) {
        std::ifstream in(params.moe_cache_profile, std::ios::binary);
        if (!in) {
            profile = { { "path", params.moe_cache_profile }, { "error", std::string("cannot open: ") + strerror(errno) } };
        } else {
            const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
            profile = { { "path", params.moe_cache_profile }, { "bytes", (int64_t) data.size() },
                        { "sha256", hash_sha256_hex(data.data(), data.size()) } };
            llama_moe_cache_info info;
            if (llama_moe_cache_get_info(ctx, &info) && info.profile_refused) {
                profile["refused"] = info.profile_error; // read, but the engine did not fill the cache from it
            }
        }
    }
    llama_moe_cache_stats s = {};
    llama_moe_cache_get_stats(ctx, &s);

    json rec = record("load", ctx);
    rec["model"]  = { { "path", params.model.path }, { "bytes", (int64_t) (ec ? 0 : model_bytes) }, { "name", name },
                      { "n_layer", llama_model_n_layer(model) } };
    rec["params"] = {
        { "build",              llama_build_info() },
        { "moe_cache_mib",      params.moe_cache_mib },
        { "moe_cache_hybrid",   params.moe_cache_hybrid },
        { "moe_cache_adaptive", params.moe_cache_adaptive },
        { "moe_cache_admit",    params.moe_cache_admit },
        { "n_gpu_layers",       params.n_gpu_layers },
        { "n_threads",          params.cpuparams.n_threads },
        { "n_threads_batch",    params.cpuparams_batch.n_threads },
        { "n_ctx",              llama_n_ctx(ctx) },
        { "n_batch",            llama_n_batch(ctx) },
        { "n_ubatch",           llama_n_ubatch(ctx) },
        { "tensor_overrides",   overrides },
    };
    rec["cache"]   = { { "slots", s.n_slots }, { "prefilled", s.n_prefilled }, { "bytes", s.n_bytes_cache } };
    rec["load_ms"] = load_ms;
    rec["devices"] = devices;
    rec["profile"] = profile;
    rec["layers"]  = layers_json(ctx);
    append(ctx, rec);
}

void common_moe_audit_ready(const llama_context * ctx) {
    append(ctx, record("ready", ctx));
}

void common_moe_audit_exit(const llama_context * ctx) {
    {
        std::lock_guard<std::mutex> lock(g_audit_mutex);
        if (g_audit.find(ctx) == g_audit.end()) {
            return;
        }
    }
    const llama_perf_context_data perf = llama_perf_context(ctx);
    json rec = record("exit", ctx);
    rec["layers"] = layers_json(ctx);
    rec["perf"] = {
        { "n_prompt",    perf.n_p_eval },
        { "n_gen",       perf.n_eval },
        { "t_prompt_ms", perf.t_p_eval_ms },
        { "t_gen_ms",    perf.t_eval_ms },
        { "prompt_tps",  perf.t_p_eval_ms > 0 ? 1e3 * perf.n_p_eval / perf.t_p_eval_ms : 0.0 },
        { "gen_tps",     perf.t_eval_ms > 0 ? 1e3 * perf.n_eval / perf.t_eval_ms : 0.0 },
    };
    append(ctx, rec);
    std::lock_guard<std::mutex> lock(g_audit_mutex);
    g_audit.erase(ctx);
}

//
// requests
//

common_moe_cache_request common_moe_cache_request_begin(const llama_context * ctx, llama_seq_id seq) {
    common_moe_cache_request req;
    req.valid = ctx != nullptr && llama_moe_cache_get_stats(ctx, &req.start);
    req.seq   = seq;
    if (req.valid && seq >= 0) {
        llama_moe_cache_get_seq_stats(ctx, seq, &req.own_start);
    }
    return req;
}

void common_moe_cache_request_end(const llama_context * ctx, const common_moe_cache_request & req, int slot, int task,
                                  int n_prompt, int n_gen, double t_prompt_ms, double t_gen_ms) {
    llama_moe_cache_stats now;
    if (!req.valid || !llama_moe_cache_get_stats(ctx, &now)) {
        return;
    }
    const uint64_t hits   = now.n_hit          - req.start.n_hit;
    const uint64_t prof   = now.n_hit_profile  - req.start.n_hit_profile;
    const uint64_t misses = now.n_miss         - req.start.n_miss;
    const uint64_t refused = now.n_refused     - req.start.n_refused;
    const uint64_t up     = now.n_bytes_upload - req.start.n_bytes_upload;
    const uint64_t cpu    = now.n_bytes_cpu    - req.start.n_bytes_cpu;
    const uint64_t looked = hits + misses + refused;
    const double   rate   = looked ? 100.0 * hits / looked : 0.0;
    // the request's own share: its sequence's counters moved while it ran (zeros without a sequence)
    llama_moe_cache_seq_stats own = {};
    if (req.seq >= 0 && llama_moe_cache_get_seq_stats(ctx, req.seq, &own)) {
        own.n_hit          -= req.own_start.n_hit;
        own.n_miss         -= req.own_start.n_miss;
        own.n_refused      -= req.own_start.n_refused;
        own.n_bytes_upload -= req.own_start.n_bytes_upload;
        own.n_bytes_cpu    -= req.own_start.n_bytes_cpu;
    }
    const uint64_t own_looked = own.n_hit + own.n_miss + own.n_refused;
    const double   own_rate   = own_looked ? 100.0 * own.n_hit / own_looked : 0.0;
    // the own part follows the context's, so that a reader of the line before it still matches
    if (now.hybrid) {
        LOG_INF("MoE cache hits = %.1f %% (hybrid: %" PRIu64 " on the GPU, %" PRIu64 " on the CPU, which read %.1f MiB); "
                "own: %.1f %% (%" PRIu64 " on the GPU, %" PRIu64 " on the CPU, which read %.1f MiB)\n",
                rate, hits, misses, cpu / MiB, own_rate, own.n_hit, own.n_miss, own.n_bytes_cpu / MiB);
    } else {
        // the uploads' share of the request's time is not measured: the rate is bytes over the request's time
        const double seconds = (t_prompt_ms + t_gen_ms) / 1e3;
        // the refused count follows the parenthesis, so that a reader of the line before it still matches
        LOG_INF("MoE cache hits = %.1f %% (%" PRIu64 " hit, %" PRIu64 " from the profile, %" PRIu64 " uploaded: %.1f MiB, %.2f GiB/s), "
                "%" PRIu64 " refused; own: %.1f %% (%" PRIu64 " hit, %" PRIu64 " uploaded: %.1f MiB, %" PRIu64 " refused)\n",
                rate, hits, prof, misses, up / MiB, seconds > 0 ? up / (1024.0 * MiB) / seconds : 0.0, refused,
                own_rate, own.n_hit, own.n_miss, own.n_bytes_upload / MiB, own.n_refused);
    }
    json rec = record("request", ctx);
    rec["slot"]             = slot;
    rec["task"]             = task;
    rec["n_prompt"]         = n_prompt;
    rec["n_gen"]            = n_gen;
    rec["t_prompt_ms"]      = t_prompt_ms;
    rec["t_gen_ms"]         = t_gen_ms;
    rec["req_hits"]         = hits;
    rec["req_hits_profile"] = prof;
    rec["req_misses"]       = misses;
    rec["req_refused"]      = refused;
    rec["req_bytes_upload"] = up;
    rec["req_bytes_cpu"]    = cpu;
    rec["own_hits"]         = own.n_hit;
    rec["own_misses"]       = own.n_miss;
    rec["own_refused"]      = own.n_refused;
    rec["own_bytes_upload"] = own.n_bytes_upload;
    rec["own_bytes_cpu"]    = own.n_bytes_cpu;
    append(ctx, rec);
}

void common_moe_cache_add_args(const std::function<void(common_arg)> & add_opt) {
    add_opt(common_arg(
        {"--moe-cache-mib"}, "N",
        "llama_moe: an N MiB VRAM cache for the MoE experts kept in RAM (with --cpu-moe or --n-cpu-moe; N may have a "
        "fraction; default: 0, off)",
        [](common_params & params, const std::string & value) {
            // strictly a number of MiB, fractions allowed (0.5 is 512 KiB): stoi would take "1.9" as 1 and say
            // only "stoi" of "abc"
            char * end = nullptr;
            errno = 0;
            const double mib = value.empty() ? -1.0 : strtod(value.c_str(), &end);
            // digits and a point only: strtod alone would also take "nan", "1e3" and "0x10"
            const bool plain = value.find_first_not_of("0123456789.") == std::string::npos;
            if (value.empty() || !plain || end == value.c_str() || *end != '\0' || errno == ERANGE || !std::isfinite(mib) ||
                mib < 0 || mib > 16.0 * 1024 * 1024) {
                throw std::invalid_argument("--moe-cache-mib " + value + ": not a size in MiB from 0 to 16777216 "
                                            "(16 TiB; fractions allowed, 0 = no cache)");
            }
            params.moe_cache_mib = mib;
        }
    ).set_env("LLAMA_ARG_MOE_CACHE_MIB"));
    add_opt(common_arg(
        {"--moe-cache-profile"}, "FILE",
        "llama_moe: fill the MoE cache at load from an STRP profile, hottest experts first",
        [](common_params & params, const std::string & value) {
            params.moe_cache_profile = value;
        }
    ).set_env("LLAMA_ARG_MOE_CACHE_PROFILE"));
    add_opt(common_arg(
        {"--moe-cache-hybrid"},
        "llama_moe: the CPU computes the experts the MoE cache does not hold, in the same layer; nothing is uploaded while generating",
        [](common_params & params) {
            params.moe_cache_hybrid = true;
        }
    ).set_env("LLAMA_ARG_MOE_CACHE_HYBRID"));
    add_opt(common_arg(
        {"--moe-cache-adaptive"},
        "llama_moe: with --moe-cache-hybrid, swap the experts the router picks most into the cache while generating",
        [](common_params & params) {
            params.moe_cache_adaptive = true;
        }
    ).set_env("LLAMA_ARG_MOE_CACHE_ADAPTIVE"));
    add_opt(common_arg(
        {"--moe-cache-admit"}, "N|auto",
        "llama_moe: with --moe-cache-hybrid, upload at most N of the experts each layer missed between two decodes into its "
        "least recently used slots; auto: as many as the measured copies fit in half a decode (default: 0, none)",
        [](common_params & params, const std::string & value) {
            // strictly a count or auto: stoi would take "2junk" as 2 and "-1" as a count
            if (value != "auto" && (value.empty() || value.size() > 4 || !std::all_of(value.begin(), value.end(), ::isdigit))) {
                throw std::invalid_argument("--moe-cache-admit " + value + ": not a count of experts from 0 to 9999, nor auto");
            }
            params.moe_cache_admit = value == "auto" ? -1 : std::stoi(value);
        }
    ).set_env("LLAMA_ARG_MOE_CACHE_ADMIT"));
    add_opt(common_arg(
        {"--moe-cache-audit"}, "FILE",
        "llama_moe: append the MoE cache's audit log (JSON lines: load, ready, request, exit) to FILE",
        [](common_params & params, const std::string & value) {
            // refuse at start what could not take a single record, rather than lose them all later
            if (std::filesystem::is_directory(value)) {
                throw std::invalid_argument("--moe-cache-audit " + value + ": is a directory; give a file to append to");
            }
            FILE * f = fopen(value.c_str(), "a");
            if (f == nullptr) {
                throw std::invalid_argument("--moe-cache-audit " + value + ": cannot append to it: " + strerror(errno));
            }
            fclose(f);
            params.moe_cache_audit = value;
        }
    ).set_env("LLAMA_ARG_MOE_CACHE_AUDIT"));
}
