#include "llama-moe-cache.h"
#include "llama-moe-config.h"

#include "llama-impl.h"
#include "llama-model.h"
#include "llama-moe-profile.h"

#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <stdexcept>
#include <tuple>

static constexpr double MiB = 1024.0*1024.0;

// Where the cache lives: the model's first GPU, or the device LLAMA_MOE_CACHE_DEVICE names.
// LLAMA_MOE_CACHE_DEVICE=CPU puts it in host memory: nothing is faster then, but every lookup, upload and
// counter runs, which is how the cache is tested on machines without a GPU.
static ggml_backend_buffer_type_t llama_moe_cache_pick_buft(const llama_model & model, std::string & name, ggml_backend_dev_t & dev_out,
                                                            llama_moe_cache_report & report) {
    const char * env = llama_moe_env_str("LLAMA_MOE_CACHE_DEVICE");
    if (env) {
        if (strcasecmp(env, "CPU") == 0) {
            name = "CPU";
            dev_out = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
            return ggml_backend_cpu_buffer_type();
        }
        for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
            ggml_backend_dev_t dev = ggml_backend_dev_get(i);
            if (strcasecmp(ggml_backend_dev_name(dev), env) == 0) {
                name = ggml_backend_dev_name(dev);
                dev_out = dev;
                return ggml_backend_dev_buffer_type(dev);
            }
        }
        report.warn(LLAMA_MOE_CACHE_REASON_NO_DEVICE, "LLAMA_MOE_CACHE_DEVICE=%s names no device; the cache is off", env);
        return nullptr;
    }
    for (const auto & d : model.devices) {
        const auto type = ggml_backend_dev_type(d.dev);
        if (type == GGML_BACKEND_DEVICE_TYPE_GPU || type == GGML_BACKEND_DEVICE_TYPE_IGPU) {
            name = ggml_backend_dev_name(d.dev);
            dev_out = d.dev;
            return ggml_backend_dev_buffer_type(d.dev);
        }
    }
    return nullptr;
}

// An expert tensor the cache can copy from: in host memory, in the plain layout (a repacked CPU buffer
// reorders the rows, so a slice of it is not an expert), with one expert per ne[2].
static bool llama_moe_cache_host_tensor(const ggml_tensor * t) {
    return t != nullptr && t->buffer != nullptr && ggml_backend_buffer_is_host(t->buffer) &&
           ggml_backend_buffer_get_usage(t->buffer) == GGML_BACKEND_BUFFER_USAGE_WEIGHTS && t->data != nullptr;
}

// slots past a layer's experts would hold nothing: at most the experts of the largest layer
static int64_t llama_moe_cache_cap_slots(const std::vector<llama_moe_cache_layer> & layers, int64_t slots) {
    int64_t most = 0;
    for (const auto & l : layers) {
        most = std::max<int64_t>(most, l.n_expert);
    }
    return std::min(slots, most);
}

// the device memory of a cache of `slots` slots per layer, with its maps and null slots
static size_t llama_moe_cache_bytes(const std::vector<llama_moe_cache_layer> & layers, int64_t slots, size_t maps, size_t null_slots) {
    size_t bytes = maps + null_slots;
    for (const auto & l : layers) {
        bytes += (size_t) std::min<int64_t>(slots, l.n_expert) * l.expert_bytes;
    }
    return bytes;
}

// The device's free memory now (a test switch may give it); false for a cache in RAM (a test device), whose
// memory is left to the system.
static bool llama_moe_cache_device_free(ggml_backend_dev_t dev, const llama_moe_test_switches & test, size_t & free) {
    size_t total = 0;
    if (test.device_free_kib >= 0) {
        free = (size_t) test.device_free_kib * 1024;
        return true;
    }
    if (dev != nullptr && ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU) {
        ggml_backend_dev_memory(dev, &free, &total);
        return true;
    }
    return false;
}

// The slots the device's free memory holds now (the model and the KV cache are in; the compute buffers come
// later), at most slots_asked: fewer where the size asked does not fit, said, rather than an allocation that
// fails. A cache in RAM (a test device) is left to the system, unless a test switch gives its free memory.
static int64_t llama_moe_cache_fit_slots(ggml_backend_dev_t dev, const std::string & dev_name, const std::vector<llama_moe_cache_layer> & layers,
                                         int64_t slots_asked, size_t maps, size_t null_slots, const llama_moe_test_switches & test,
                                         llama_moe_cache_report & report) {
    size_t free = 0;
    if (!llama_moe_cache_device_free(dev, test, free)) {
        return slots_asked;
    }
    const size_t need = llama_moe_cache_bytes(layers, slots_asked, maps, null_slots);
    if (need <= free) {
        return slots_asked;
    }
    int64_t slots = slots_asked;
    while (slots > 0 && llama_moe_cache_bytes(layers, slots, maps, null_slots) > free) {
        slots--;
    }
    if (slots < 1) {
        report.warn(LLAMA_MOE_CACHE_REASON_NO_ROOM, "%s has %.2f MiB free, which cannot hold one expert per layer (%.2f MiB); the cache is off",
                    dev_name.c_str(), free / MiB, llama_moe_cache_bytes(layers, 1, maps, null_slots) / MiB);
        return 0;
    }
    report.warn(LLAMA_MOE_CACHE_REASON_FEWER_SLOTS, "%.2f MiB asked, but %s has %.2f MiB free: %" PRId64 " slots per layer instead of %" PRId64,
                need / MiB, dev_name.c_str(), free / MiB, slots, slots_asked);
    return slots;
}

// Per-layer slots (a profile's slot section). Each layer's count is what a planner split the budget into; the
// engine sizes the layers from the counts rather than giving every layer the same.

static size_t llama_moe_cache_layer_bytes(const std::vector<llama_moe_cache_layer> & layers, const std::vector<int64_t> & slots) {
    size_t bytes = 0;
    for (size_t i = 0; i < layers.size(); ++i) {
        bytes += (size_t) slots[i] * layers[i].expert_bytes;
    }
    return bytes;
}

// The rule when counts do not fit `avail` bytes: every count times avail / need, rounded down, at least one;
// then, while they still do not fit (the rounding up to one), the layer with the most slots (the first of
// equals) gives one up. The split's shape is kept: the layers a planner favoured stay favoured.
static void llama_moe_cache_scale_slots(const std::vector<llama_moe_cache_layer> & layers, std::vector<int64_t> & slots, size_t avail) {
    const size_t need = llama_moe_cache_layer_bytes(layers, slots);
    if (need <= avail) {
        return;
    }
    const double f = (double) avail / (double) need;
    for (auto & n : slots) {
        n = std::max<int64_t>(1, (int64_t) std::floor((double) n * f));
    }
    while (llama_moe_cache_layer_bytes(layers, slots) > avail) {
        const auto most = std::max_element(slots.begin(), slots.end());
        if (*most <= 1) {
            break;
        }
        (*most)--;
    }
}

// A profile's slot counts against the layers the cache serves: each needs a count (0 is none).
static bool llama_moe_cache_check_layer_slots(const std::vector<llama_moe_cache_layer> & layers, const llama_moe_profile & profile,
                                              std::string & err) {
    for (const auto & l : layers) {
        if (!profile.layer_slots.empty() && profile.layer_slots[l.il] == 0) {
            err = "its per-layer slot section gives layer " + std::to_string(l.il) + " no slots, but the cache serves that "
                  "layer (each cached layer needs at least one)";
            return false;
        }
    }
    return true;
}

// Each cached layer's slots from the profile's counts, within `budget` bytes (--moe-cache-mib less the maps and
// null slots): counts above a layer's experts hold it whole, counts that do not fit are scaled down, said.
static bool llama_moe_cache_layer_slots(const std::vector<llama_moe_cache_layer> & layers, const llama_moe_profile & profile,
                                        size_t budget, size_t size, std::vector<int64_t> & out, llama_moe_cache_report & report) {
    out.resize(layers.size());
    int n_clamped = 0;
    for (size_t i = 0; i < layers.size(); ++i) {
        const int64_t asked = profile.layer_slots[layers[i].il];
        out[i] = std::min<int64_t>(asked, layers[i].n_expert);
        n_clamped += asked > layers[i].n_expert;
    }
    if (n_clamped > 0) {
        LLAMA_LOG_INFO("%s: %d layers' counts exceed their experts: they are held whole\n", __func__, n_clamped);
    }
    const size_t need = llama_moe_cache_layer_bytes(layers, out);
    if (need > budget) {
        const int64_t total_asked = std::accumulate(out.begin(), out.end(), (int64_t) 0);
        llama_moe_cache_scale_slots(layers, out, budget);
        if (llama_moe_cache_layer_bytes(layers, out) > budget) {
            return false; // cannot happen: create checked that one slot per layer fits
        }
        report.warn(LLAMA_MOE_CACHE_REASON_FEWER_SLOTS, "the profile's per-layer slots take %.2f MiB, more than the %.2f MiB "
                    "--moe-cache-mib %.2f leaves for slots: each count scaled by %.3f and rounded down (at least one), "
                    "%" PRId64 " slots in all instead of %" PRId64, need / MiB, budget / MiB, size / MiB,
                    (double) budget / need, std::accumulate(out.begin(), out.end(), (int64_t) 0), total_asked);
    } else if (budget - need >= std::min_element(layers.begin(), layers.end(), [](const auto & a, const auto & b) {
                                     return a.expert_bytes < b.expert_bytes; })->expert_bytes) {
        // room for another slot at least: the profile was planned for a smaller cache
        LLAMA_LOG_INFO("%s: the profile's per-layer slots take %.2f MiB of the %.2f MiB --moe-cache-mib leaves for slots; "
                       "the rest is not allocated\n", __func__, need / MiB, budget / MiB);
    }
    return true;
}

// llama_moe_cache_fit_slots for per-layer counts: the device's free memory scales them down by the same rule.
static bool llama_moe_cache_fit_layer_slots(ggml_backend_dev_t dev, const std::string & dev_name, const std::vector<llama_moe_cache_layer> & layers,
                                            std::vector<int64_t> & slots, size_t maps, size_t null_slots, const llama_moe_test_switches & test,
                                            llama_moe_cache_report & report) {
    size_t free = 0;
    if (!llama_moe_cache_device_free(dev, test, free)) {
        return true;
    }
    const size_t need = maps + null_slots + llama_moe_cache_layer_bytes(layers, slots);
    if (need <= free) {
        return true;
    }
    const std::vector<int64_t> ones(layers.size(), 1);
    const size_t least = maps + null_slots + llama_moe_cache_layer_bytes(layers, ones);
    if (least > free) {
        report.warn(LLAMA_MOE_CACHE_REASON_NO_ROOM, "%s has %.2f MiB free, which cannot hold one expert per layer (%.2f MiB); the cache is off",
                    dev_name.c_str(), free / MiB, least / MiB);
        return false;
    }
    const int64_t total_asked = std::accumulate(slots.begin(), slots.end(), (int64_t) 0);
    llama_moe_cache_scale_slots(layers, slots, free - maps - null_slots);
    report.warn(LLAMA_MOE_CACHE_REASON_FEWER_SLOTS, "%.2f MiB asked, but %s has %.2f MiB free: the per-layer slots scaled down, "
                "%" PRId64 " in all instead of %" PRId64, need / MiB, dev_name.c_str(), free / MiB,
                std::accumulate(slots.begin(), slots.end(), (int64_t) 0), total_asked);
    return true;
}

void llama_moe_cache::log_layer_slots(size_t n_groups, int n_whole) const {
    int lo = layers[0].n_slots, hi = layers[0].n_slots;
    std::string each;
    for (const auto & l : layers) {
        lo = std::min(lo, l.n_slots);
        hi = std::max(hi, l.n_slots);
        each += (each.empty() ? "" : " ") + std::to_string(l.il) + ":" + std::to_string(l.n_slots);
    }
    LLAMA_LOG_INFO("llama_moe_cache: %.2f MiB on %s for %zu layers (%zu groups): per-layer slots from the profile, %d to %d "
                   "of %d experts, %" PRIu64 " in all, %d layers held whole\n", buffer_size() / MiB, device_name.c_str(),
                   layers.size(), n_groups, lo, hi, layers[0].n_expert, n_slots_total, n_whole);
    LLAMA_LOG_INFO("llama_moe_cache: slots per layer: %s\n", each.c_str());
}

std::unique_ptr<llama_moe_cache> llama_moe_cache::create(const llama_model & model, const llama_moe_cache_params & params,
                                                         llama_moe_cache_report & report) {
    if (model.hparams.no_alloc) {
        return nullptr; // a model without data (llama.cpp's fitting probes): nothing to copy, nothing to say
    }
    if (params.size == 0) {
        if (!params.profile.empty() || params.hybrid || params.adaptive) {
            report.warn(LLAMA_MOE_CACHE_REASON_NO_SIZE, "--moe-cache-profile, --moe-cache-hybrid and --moe-cache-adaptive do nothing "
                        "without --moe-cache-mib");
        }
        return nullptr;
    }
    std::string dev_name;
    ggml_backend_dev_t dev = nullptr;
    ggml_backend_buffer_type_t buft = llama_moe_cache_pick_buft(model, dev_name, dev, report);
    if (buft == nullptr) {
        if (!report.has(LLAMA_MOE_CACHE_REASON_NO_DEVICE)) {
            report.warn(LLAMA_MOE_CACHE_REASON_NO_DEVICE, "no GPU to hold the cache; it is off (LLAMA_MOE_CACHE_DEVICE=CPU runs it in RAM, for testing)");
        }
        return nullptr;
    }

    std::unique_ptr<llama_moe_cache> cache(new llama_moe_cache());
    cache->params        = params;
    cache->device_name   = dev_name;
    cache->test          = llama_moe_test_switches_read(); // once per context: the mailbox takes them from here

    // the layers whose experts are all in host memory
    int n_repacked = 0, n_scaled = 0, n_biased = 0;
    std::map<std::tuple<int, int64_t, int64_t, int, int64_t, int64_t, int, int64_t, int64_t>, int> groups;
    for (int il = 0; il < (int) model.layers.size(); ++il) {
        const auto & l = model.layers[il];
        ggml_tensor * gate = l.ffn_gate_up_exps ? l.ffn_gate_up_exps : l.ffn_gate_exps;
        ggml_tensor * up   = l.ffn_gate_up_exps ? nullptr : l.ffn_up_exps;
        ggml_tensor * down = l.ffn_down_exps;
        if (down == nullptr || (gate == nullptr && up == nullptr)) {
            continue;
        }
        bool host = llama_moe_cache_host_tensor(down);
        for (ggml_tensor * t : {gate, up}) {
            host = host && (t == nullptr || llama_moe_cache_host_tensor(t));
        }
        if (!host) {
            // a CPU buffer that is not host memory is a repacked one (CPU_REPACK, AMX, ...)
            if (down->buffer && strstr(ggml_backend_buffer_name(down->buffer), "CPU") != nullptr) {
                n_repacked++;
            }
            continue;
        }
        if (l.ffn_gate_exps_s || l.ffn_up_exps_s || l.ffn_down_exps_s) {
            n_scaled++; // per-expert scales would be looked up by slot id
            continue;
        }
        const bool has_bias = l.ffn_gate_exps_b || l.ffn_up_exps_b || l.ffn_down_exps_b || l.ffn_gate_up_exps_b;
        ggml_tensor * bias[3] = { l.ffn_gate_up_exps ? l.ffn_gate_up_exps_b : l.ffn_gate_exps_b,
                                  l.ffn_gate_up_exps ? nullptr : l.ffn_up_exps_b, l.ffn_down_exps_b };
        if (has_bias && params.hybrid) {
            // the hybrid adds each chain's own experts' biases: it needs them in host memory, as F32 rows
            bool usable = true;
            for (ggml_tensor * b : bias) {
                usable = usable && (b == nullptr || (llama_moe_cache_host_tensor(b) && b->type == GGML_TYPE_F32 &&
                                                     ggml_n_dims(b) <= 2 && b->ne[1] == down->ne[2]));
            }
            if (!usable) {
                n_biased++;
                continue;
            }
        }
        llama_moe_cache_layer layer;
        layer.il       = il;
        layer.has_bias = has_bias;
        layer.src[0]   = gate;
        layer.src[1]   = up;
        layer.src[2]   = down;
        layer.n_expert = (int) down->ne[2];
        layer.n_used   = (int) model.hparams.n_expert_used(il); // per layer where the model stores it so
        if (has_bias && params.hybrid) {
            for (int j = 0; j < 3; ++j) {
                layer.src_b[j] = bias[j];
            }
        }
        for (ggml_tensor * t : layer.src) {
            if (t) {
                GGML_ASSERT(t->ne[2] == down->ne[2] && "expert tensors of a layer disagree on the number of experts");
                layer.expert_bytes += t->nb[2];
            }
        }
        for (ggml_tensor * b : layer.src_b) {
            layer.expert_bytes += b ? b->nb[1] : 0;
        }
        auto key = std::make_tuple(
            gate ? (int) gate->type : -1, gate ? gate->ne[0] : 0, gate ? gate->ne[1] : 0,
            up   ? (int) up->type   : -1, up   ? up->ne[0]   : 0, up   ? up->ne[1]   : 0,
            (int) down->type, down->ne[0], down->ne[1]);
        auto it = groups.find(key);
        layer.group = it == groups.end() ? (groups[key] = (int) groups.size()) : it->second;
        cache->n_expert_used = std::max<int64_t>(cache->n_expert_used, layer.n_used);
        cache->layers.push_back(std::move(layer));
    }
    if (cache->layers.empty() && n_scaled + n_biased > 0) {
        // the experts are in RAM: advice to put them there would mislead
        report.warn(LLAMA_MOE_CACHE_REASON_NO_LAYER, "--moe-cache-mib is set, but the cache can serve none of the layers that keep their experts on the CPU "
                    "(%d with per-expert scales, %d with biases it cannot copy); the cache is off", n_scaled, n_biased);
        return nullptr;
    }
    if (cache->layers.empty()) {
        report.warn(LLAMA_MOE_CACHE_REASON_NO_LAYER, "--moe-cache-mib is set, but no layer has its experts in RAM%s; the cache is off "
                    "(use --cpu-moe, --n-cpu-moe N or -ot patterns that keep ffn_*_exps on the CPU)",
                    n_repacked ? " in a layout it can copy (repacked CPU buffers: use --no-repack)" : "");
        return nullptr;
    }
    if (n_scaled > 0) {
        report.warn(LLAMA_MOE_CACHE_REASON_LAYERS_SKIPPED, "%d layers have per-expert scales, which the cache does not copy; they keep llama.cpp's path", n_scaled);
    }
    if (n_biased > 0) {
        report.warn(LLAMA_MOE_CACHE_REASON_LAYERS_SKIPPED, "%d layers have expert biases the hybrid cannot copy (not F32 rows in RAM); they keep llama.cpp's path", n_biased);
    }

    // a profile with per-layer slot counts sizes each layer from them instead (llama_moe_cache_layer_slots)
    llama_moe_profile profile;
    const bool have_profile = !params.profile.empty() &&
                              cache->load_profile(params.profile, (uint32_t) model.hparams.n_layer(), profile, report);
    std::vector<int64_t> layer_slots;

    // layers split across devices: each layer's slots on the device that computes it (llama-moe-devices.h)
    cache->devices = llama_moe_cache_devices_assign(model, cache->layers, dev, buft, dev_name);
    const bool several = cache->devices.size() > 1;
    int64_t slots = 0, slots_asked = 0;
    if (several && have_profile && !profile.layer_slots.empty()) {
        report.warn(LLAMA_MOE_CACHE_REASON_OPTION_IGNORED, "the profile's per-layer slot counts are not applied to layers split across "
                    "devices: each device gives its layers equal slots from its own budget");
    }
    if (several) {
        auto fit = [&](const llama_moe_cache_device & d, const std::vector<llama_moe_cache_layer> & mine, int64_t asked,
                       size_t maps, size_t null_slots) {
            return llama_moe_cache_fit_slots(d.dev, d.name, mine, asked, maps, null_slots, cache->test, report);
        };
        if (!llama_moe_cache_devices_plan(cache->devices, cache->layers, params.size, params.hybrid, fit, report)) {
            return nullptr;
        }
        llama_moe_cache_devices_fewest(cache->devices, slots, slots_asked);
    } else {
        dev      = cache->devices[0].dev; // the layers' own device, where they all are on one
        buft     = cache->devices[0].buft;
        dev_name = cache->devices[0].name;
        cache->device_name = dev_name;
        // the same number of slots in every layer, as many as the budget allows, at most all of a layer's experts
        size_t per_slot_row = 0; // bytes of one slot in every layer
        size_t maps = 0;
        for (const auto & l : cache->layers) {
            per_slot_row += l.expert_bytes;
            maps += GGML_PAD(l.n_expert * sizeof(int32_t), 256);
        }
        // hybrid: a zero-filled null slot per layer, where the device part sends the experts the CPU computes
        const size_t null_slots = params.hybrid ? per_slot_row : 0;
        const size_t budget = params.size > maps + null_slots ? params.size - maps - null_slots : 0;
        slots = (int64_t) (budget / per_slot_row);
        if (slots < 1) {
            // the real requirement: one slot per layer, every layer's expert map, and the hybrid's null slot per layer
            report.warn(LLAMA_MOE_CACHE_REASON_TOO_SMALL, "%.2f MiB cannot hold one expert per layer: %zu layers need at least %.2f MiB "
                        "(%.2f MiB for one expert each, %.2f MiB of expert maps%s); the cache is off",
                        params.size / MiB, cache->layers.size(), std::ceil((per_slot_row + maps + null_slots) / MiB * 100) / 100, // rounded up: enough
                        per_slot_row / MiB, maps / MiB,
                        params.hybrid ? ", and the hybrid's zero-filled null slot in each layer as large again" : "");
            return nullptr;
        }
        if (have_profile && !profile.layer_slots.empty()) {
            if (!llama_moe_cache_layer_slots(cache->layers, profile, budget, params.size, layer_slots, report)) {
                return nullptr;
            }
            slots_asked = *std::max_element(layer_slots.begin(), layer_slots.end());
            if (!llama_moe_cache_fit_layer_slots(dev, dev_name, cache->layers, layer_slots, maps, null_slots, cache->test, report)) {
                return nullptr;
            }
            slots = *std::max_element(layer_slots.begin(), layer_slots.end());
        } else {
            slots_asked = llama_moe_cache_cap_slots(cache->layers, slots);
            slots = llama_moe_cache_fit_slots(dev, dev_name, cache->layers, slots_asked, maps, null_slots, cache->test, report);
            if (slots < 1) {
                return nullptr;
            }
            layer_slots.assign(cache->layers.size(), slots);
        }
        cache->devices[0].slots       = slots;
        cache->devices[0].slots_asked = slots_asked;
    }

    const size_t n_tensors = cache->layers.size() * 7;
    ggml_init_params ip = { ggml_tensor_overhead() * n_tensors, nullptr, true };
    cache->ctx = ggml_init(ip);
    ggml_init_params ip_host = { ggml_tensor_overhead() * cache->layers.size() * 4, nullptr, true };
    cache->ctx_host = ggml_init(ip_host); // the hybrid's CPU maps, or upload mode's split maps
    if (!cache->ctx || !cache->ctx_host) {
        throw std::runtime_error("llama_moe_cache: ggml_init failed");
    }
    int n_whole = 0;
    for (size_t i = 0; i < cache->layers.size(); ++i) {
        auto & l = cache->layers[i];
        l.n_slots = (int) std::min<int64_t>(several ? llama_moe_cache_devices_slots_of(cache->devices, (int) i) : layer_slots[i], l.n_expert);
        l.whole   = l.n_slots == l.n_expert;
        n_whole  += l.whole;
        const int n_null = params.hybrid && !l.whole ? 1 : 0;
        for (int j = 0; j < 3; ++j) {
            if (l.src[j]) {
                l.dst[j] = ggml_new_tensor_3d(cache->ctx, l.src[j]->type, l.src[j]->ne[0], l.src[j]->ne[1], l.n_slots + n_null);
                ggml_format_name(l.dst[j], "moe_cache.%d.%d", l.il, j);
            }
            if (l.src_b[j]) {
                l.dst_b[j] = ggml_new_tensor_2d(cache->ctx, GGML_TYPE_F32, l.src_b[j]->ne[0], l.n_slots + n_null);
                ggml_format_name(l.dst_b[j], "moe_cache_bias.%d.%d", l.il, j);
            }
        }
        l.slot_map = ggml_new_tensor_2d(cache->ctx, GGML_TYPE_I32, 1, l.n_expert);
        ggml_format_name(l.slot_map, "moe_cache_slots.%d", l.il);
        if (params.hybrid && !l.whole) {
            l.cpu_map = ggml_new_tensor_2d(cache->ctx_host, GGML_TYPE_I32, 1, l.n_expert);
            ggml_format_name(l.cpu_map, "moe_cache_cpu.%d", l.il);
        }
        if (!params.hybrid && !l.whole) {
            l.split_ids  = ggml_new_tensor_2d(cache->ctx_host, GGML_TYPE_I32, 1, l.n_expert);
            l.split_dev  = ggml_new_tensor_2d(cache->ctx_host, GGML_TYPE_I32, 1, l.n_slots + l.n_expert);
            l.split_mask = ggml_new_tensor_2d(cache->ctx_host, GGML_TYPE_F32, 1, l.n_slots + l.n_expert);
            l.split_cpu  = ggml_new_tensor_2d(cache->ctx_host, GGML_TYPE_I32, 1, l.n_slots + l.n_expert);
            ggml_format_name(l.split_ids,  "moe_cache_split.%d", l.il);
            ggml_format_name(l.split_dev,  "moe_cache_split_dev.%d", l.il);
            ggml_format_name(l.split_mask, "moe_cache_split_mask.%d", l.il);
            ggml_format_name(l.split_cpu,  "moe_cache_split_cpu.%d", l.il);
        }
        l.slot_of.assign(l.n_expert, -1);
        l.expert_in.assign(l.n_slots, -1);
        l.last_use.assign(l.n_slots, 0);
        l.from_profile.assign(l.n_slots, 0);
        l.in_flight.assign(l.n_slots, 0);
        l.heat.assign(params.adaptive && params.hybrid && !l.whole ? l.n_expert : 0, 0.0);
        cache->n_slots_total += l.n_slots;
    }
    if (several) {
        llama_moe_cache_devices_alloc(cache->devices, cache->layers);
    } else {
        cache->buf = ggml_backend_alloc_ctx_tensors_from_buft(cache->ctx, buft);
        if (!cache->buf) {
            throw std::runtime_error(format("llama_moe_cache: cannot allocate %.2f MiB on %s for the MoE cache; "
                                            "ask for less with --moe-cache-mib", params.size / MiB, dev_name.c_str()));
        }
        // weights usage makes the scheduler run the expert matmuls where the cache is
        ggml_backend_buffer_set_usage(cache->buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
        ggml_backend_buffer_clear(cache->buf, 0); // the null slots stay zero for good
        cache->device = dev;
    }
    // LLAMA_MOE_CACHE_NO_COPY=1: prompts take every expert from RAM, as without a cache (for comparing)
    cache->copy_on = !llama_moe_env_flag("LLAMA_MOE_CACHE_NO_COPY", false);
    if (ggml_get_first_tensor(cache->ctx_host) != nullptr) { // none when every layer is whole
        cache->buf_host = ggml_backend_alloc_ctx_tensors_from_buft(cache->ctx_host, ggml_backend_cpu_buffer_type());
        if (!cache->buf_host) {
            throw std::runtime_error("llama_moe_cache: cannot allocate the cache's CPU maps");
        }
        ggml_backend_buffer_set_usage(cache->buf_host, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    }

    for (size_t i = 0; i < cache->layers.size(); ++i) {
        auto & l = cache->layers[i];
        if (cache->clock_layer < 0 && !l.whole) {
            cache->clock_layer = (int) i;
        }
        cache->layer_of_weight[l.src[2]]     = (int) i;
        cache->layer_of_il[l.il]             = (int) i;
        for (int j = 0; j < 3; ++j) {
            if (l.src[j]) {
                cache->slot_of_weight[l.src[j]] = { (int) i, j };
            }
        }
        cache->layer_of_slot_map[l.slot_map] = (int) i;
        if (l.cpu_map) {
            cache->layer_of_cpu_map[l.cpu_map] = (int) i;
        }
        if (l.split_ids) {
            cache->layer_of_split_map[l.split_ids] = (int) i;
            std::vector<int32_t> self(l.n_expert);
            std::iota(self.begin(), self.end(), 0);
            ggml_backend_tensor_set(l.split_ids, self.data(), 0, ggml_nbytes(l.split_ids));
            // codes: a slot (< n_slots) or n_slots + the expert the CPU computes
            const int32_t n_codes = l.n_slots + l.n_expert;
            std::vector<int32_t> dev(n_codes), cpu(n_codes);
            std::vector<float> mask(n_codes);
            for (int32_t c = 0; c < n_codes; ++c) {
                const bool on_dev = c < l.n_slots;
                dev[c]  = on_dev ? c : 0; // any slot: the mask zeroes the row
                mask[c] = on_dev ? 1.0f : 0.0f;
                cpu[c]  = on_dev ? -1 : c - l.n_slots;
            }
            ggml_backend_tensor_set(l.split_dev,  dev.data(),  0, ggml_nbytes(l.split_dev));
            ggml_backend_tensor_set(l.split_mask, mask.data(), 0, ggml_nbytes(l.split_mask));
            ggml_backend_tensor_set(l.split_cpu,  cpu.data(),  0, ggml_nbytes(l.split_cpu));
        }
        if (l.whole) {
            for (int j = 0; j < 3; ++j) {
                if (l.src[j]) {
                    ggml_backend_tensor_set(l.dst[j], l.src[j]->data, 0, ggml_nbytes(l.src[j]));
                }
                if (l.src_b[j]) {
                    ggml_backend_tensor_set(l.dst_b[j], l.src_b[j]->data, 0, ggml_nbytes(l.src_b[j]));
                }
            }
            for (int e = 0; e < l.n_expert; ++e) {
                l.slot_of[e] = e;
                l.expert_in[e] = e;
            }
        }
        cache->push_slot_map(l);
    }

    report.set_cache(!params.hybrid ? LLAMA_MOE_CACHE_MODE_UPLOAD : params.adaptive ? LLAMA_MOE_CACHE_MODE_ADAPTIVE : LLAMA_MOE_CACHE_MODE_HYBRID,
                     several ? llama_moe_cache_devices_describe(cache->devices, cache->layers) : dev_name, (int32_t) slots,
                     (int32_t) slots_asked, (int32_t) cache->layers.size(), n_whole, cache->buffer_size());
    if (several) {
        llama_moe_cache_devices_log(cache->devices, cache->layers);
    } else if (profile.layer_slots.empty() || !have_profile) {
        LLAMA_LOG_INFO("llama_moe_cache: %.2f MiB on %s for %zu layers (%zu groups): %" PRId64 " slots per layer of %d experts "
                       "(%.2f MiB each), %d layers held whole\n",
                       ggml_backend_buffer_get_size(cache->buf) / MiB, dev_name.c_str(), cache->layers.size(), groups.size(),
                       std::min<int64_t>(slots, cache->layers[0].n_expert), cache->layers[0].n_expert,
                       cache->layers[0].expert_bytes / MiB, n_whole);
    } else {
        cache->log_layer_slots(groups.size(), n_whole);
    }

    if (have_profile) {
        cache->prefill(profile, params.profile);
    }
    if (params.hybrid) {
        // the reference's wording: these lines are what users grep for
        LLAMA_LOG_INFO("impl: hybrid MoE cache: %d layers held whole (GPU only), the others split between GPU and CPU\n", n_whole);
        if (params.profile.empty() && !params.adaptive && (params.admit == 0 || params.admit < -1) && n_whole < (int) cache->layers.size()) {
            report.warn(LLAMA_MOE_CACHE_REASON_STAYS_EMPTY, "hybrid MoE cache without a profile starts empty and stays empty: the CPU computes "
                        "every expert of the layers not held whole (give --moe-cache-profile, or --moe-cache-adaptive)");
        }
    }
    if (params.adaptive && params.hybrid && params.profile.empty()) {
        LLAMA_LOG_INFO("impl: adaptive hybrid MoE cache without a profile starts empty and fills itself while generating\n");
    }
    const int32_t admit = params.admit < -1 ? 0 : params.admit; // -1: the engine chooses
    if (params.admit < -1) {
        report.warn(LLAMA_MOE_CACHE_REASON_OPTION_IGNORED, "--moe-cache-admit %d is not a count of experts; admission is off", params.admit);
        cache->params.admit = 0;
    }
    if (admit == -1 && params.hybrid) {
        LLAMA_LOG_INFO("llama_moe_cache: the hybrid admits missed experts between two decodes, into the least recently "
                       "used slots, as many per layer (up to %d) as the measured copies fit in half a decode\n",
                       llama_moe_admit_budget::n_auto_max);
    }
    if (admit > 0 && params.hybrid) {
        LLAMA_LOG_INFO("impl: hybrid MoE cache admits up to %d missed experts per layer between two decodes, into the "
                       "least recently used slots\n", admit);
    }
    if (admit != 0 && params.hybrid) {
        if (params.adaptive) {
            LLAMA_LOG_WARN("llama_moe_cache: --moe-cache-adaptive with --moe-cache-admit: the adaptive rounds swap by heat, "
                           "admission by recency; both run\n");
        }
    }
    if (admit != 0 && params.hybrid && n_whole < (int) cache->layers.size()) {
        cache->admit_budget = llama_moe_admit_budget(admit, (int32_t) cache->layers.size() - n_whole);
        // on a GPU the uploads go in the background by default; LLAMA_MOE_CACHE_ADMIT_ASYNC=0 makes them
        // synchronous between decodes, =1 runs the background path on the CPU device too (tests)
        const bool gpu = ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU;
        // one upload stream per cache: on several devices the admissions are synchronous, between decodes
        if (!several && llama_moe_env_flag("LLAMA_MOE_CACHE_ADMIT_ASYNC", gpu)) {
            const size_t n_max = (size_t) cache->admit_budget.n_max; // a round uploads at most this many per layer
            size_t staging = 0;
            for (const auto & l : cache->layers) {
                for (int j = 0; j < 3 && !l.whole; ++j) {
                    staging += l.src[j]   ? n_max * GGML_PAD(l.src[j]->nb[2], 64) : 0;
                    staging += l.src_b[j] ? n_max * GGML_PAD(l.src_b[j]->nb[1], 64) : 0;
                }
            }
            cache->uploader = llama_moe_uploader::create(dev, staging);
            if (cache->uploader) {
                const bool pinned = cache->uploader->is_pinned(cache->layers[0].src[0] ? cache->layers[0].src[0] : cache->layers[0].src[2]);
                LLAMA_LOG_INFO("llama_moe_cache: admission uploads in the background on a stream of its own, %s; an expert "
                               "becomes a hit from the decode after its upload\n", pinned
                               ? "straight from the experts' page-locked memory"
                               : ("through " + std::to_string((int) (staging / MiB)) + " MiB of page-locked staging memory").c_str());
            }
        }
    }
    if (admit != 0 && !params.hybrid) {
        report.warn(LLAMA_MOE_CACHE_REASON_OPTION_IGNORED, "--moe-cache-admit without --moe-cache-hybrid is ignored: the upload cache "
                    "already uploads every miss");
    }
    if (params.adaptive && !params.hybrid) {
        report.warn(LLAMA_MOE_CACHE_REASON_OPTION_IGNORED, "--moe-cache-adaptive without --moe-cache-hybrid is ignored: the upload cache is an LRU, "
                    "which already follows the text");
    }
    return cache;
}

void llama_moe_cache_pin_mul_mat_id(ggml_backend_sched_t sched, ggml_backend_t backend_cpu, ggml_tensor * out, const ggml_tensor * in) {
    GGML_ASSERT(backend_cpu != nullptr && "the hybrid MoE cache needs the CPU backend");
    std::vector<ggml_tensor *> stack = { out };
    std::vector<const ggml_tensor *> seen;
    while (!stack.empty()) {
        ggml_tensor * t = stack.back();
        stack.pop_back();
        if (t == nullptr || t == in || t->op == GGML_OP_NONE || std::find(seen.begin(), seen.end(), t) != seen.end()) {
            continue;
        }
        seen.push_back(t);
        if (t->op == GGML_OP_MUL_MAT_ID) {
            ggml_backend_sched_set_tensor_backend(sched, t, backend_cpu);
            stack.push_back(t->src[1]); // not the weights, not the ids (they lead back to the router)
            continue;
        }
        if (t->op == GGML_OP_ADD_ID) {
            ggml_backend_sched_set_tensor_backend(sched, t, backend_cpu);
            stack.push_back(t->src[0]); // not the biases, not the ids
            continue;
        }
        if (t->op == GGML_OP_GET_ROWS) {
            continue;
        }
        for (ggml_tensor * src : t->src) {
            stack.push_back(src);
        }
    }
}

void llama_moe_cache::count_by_size(int64_t n_tokens, uint64_t hits, uint64_t misses, uint64_t refused) {
    const int c = n_tokens <= 8 ? 0 : 1;
    n_hit_by[c]     += hits;
    n_miss_by[c]    += misses;
    n_refused_by[c] += refused;
}

// At exit: small and large ubatches apart (generation is what the cache is for), how unevenly layers hit, and
// every lookup with what it admitted and what it refused. A refused lookup is in the rates' denominator: a cache
// too small for its ubatches must not look better than one that serves them.
void llama_moe_cache::log_summary() const {
    auto pct = [](uint64_t h, uint64_t m, uint64_t r) { return h + m + r ? 100.0 * h / (h + m + r) : 0.0; };
    if (n_hit_by[0] + n_miss_by[0] + n_refused_by[0] + n_hit_by[1] + n_miss_by[1] + n_refused_by[1] > 0) {
        LLAMA_LOG_INFO("llama_moe_cache: ubatches of up to 8 tokens: %" PRIu64 " hits, %" PRIu64 " misses, %" PRIu64 " refused (%.1f %%); "
                       "larger: %" PRIu64 " hits, %" PRIu64 " misses, %" PRIu64 " refused (%.1f %%)\n",
                       n_hit_by[0], n_miss_by[0], n_refused_by[0], pct(n_hit_by[0], n_miss_by[0], n_refused_by[0]),
                       n_hit_by[1], n_miss_by[1], n_refused_by[1], pct(n_hit_by[1], n_miss_by[1], n_refused_by[1]));
    }
    std::vector<double> rates;
    uint64_t hits = 0, misses = 0, refused = 0, resident = 0, cpu = 0;
    for (const auto & l : layers) {
        if (l.n_hit + l.n_miss + l.n_refused > 0) {
            rates.push_back(pct(l.n_hit, l.n_miss, l.n_refused));
        }
        hits     += l.n_hit;
        misses   += l.n_miss;
        refused  += l.n_refused;
        cpu      += l.n_cpu;
        for (int32_t s = 0; s < l.n_slots; ++s) {
            resident += l.expert_in[s] >= 0 && !l.in_flight[s];
        }
    }
    if (!rates.empty()) {
        std::sort(rates.begin(), rates.end());
        LLAMA_LOG_INFO("llama_moe_cache: per-layer hit rate min %.1f %%, median %.1f %%, max %.1f %% over %zu layers\n",
                       rates.front(), rates[rates.size() / 2], rates.back(), rates.size());
    }
    // admitted: experts brought into slots while running, the upload mode's misses (but those the CPU computed),
    // the adaptive swaps and the hybrid's admissions
    const uint64_t lookups  = hits + misses + refused;
    const uint64_t admitted = (params.hybrid ? 0 : misses - cpu) + n_swap + n_admit;
    char ratio[32] = "n/a";
    if (lookups > 0) {
        snprintf(ratio, sizeof(ratio), "%.4f", (double) hits / lookups);
    }
    // the prefix of the summary's other lines, which is what users grep for
    LLAMA_LOG_INFO("llama_moe_cache: %" PRIu64 " hits of %" PRIu64 " lookups = %s (%" PRIu64 " admitted, %" PRIu64 " refused, "
                   "cache %.2f%% full)\n", hits, lookups, ratio, admitted, refused,
                   n_slots_total ? 100.0 * resident / n_slots_total : 0.0);
    if (!params.hybrid && cpu > 0) {
        LLAMA_LOG_INFO("llama_moe_cache: upload mode: %" PRIu64 " missed experts computed on the CPU (ubatches that "
                       "selected more distinct experts than a layer's slots)\n", cpu);
    }
    if (devices.size() > 1) {
        llama_moe_cache_devices_log_exit(devices, layers);
    }
}

llama_moe_cache::~llama_moe_cache() {
    log_summary();
    if (adaptive()) {
        LLAMA_LOG_INFO("llama_moe_cache: adaptive: %" PRIu64 " experts swapped in\n", n_swap);
    }
    if (uploader) {
        uploader.reset(); // waits for the round in flight: the slots' buffer goes next
    }
    if (admitting()) {
        LLAMA_LOG_INFO("llama_moe_cache: admission: %" PRIu64 " missed experts uploaded between decodes\n", n_admit);
    }
    if (admitting() && admit_budget.chosen) {
        LLAMA_LOG_INFO("llama_moe_cache: admission's budget, chosen by the engine: %d per layer and decode at the end "
                       "(from %d to %d); an expert's copy took %.1f us, a decode %.2f ms (averages)\n", admit_budget.n,
                       admit_budget.n_lo, admit_budget.n_hi, admit_budget.expert_us, admit_budget.decode_us / 1000.0);
    }
    if (n_admit_rounds > 0) {
        LLAMA_LOG_INFO("llama_moe_cache: admission in the background: %" PRIu64 " rounds; decodes waited %.3f ms in all "
                       "for the rounds before them\n", n_admit_rounds, admit_wait_us / 1000.0);
    }
    for (ggml_backend_buffer_t b : {buf, buf_host}) {
        if (b) {
            ggml_backend_buffer_free(b);
        }
    }
    for (ggml_context * c : {ctx, ctx_host}) {
        if (c) {
            ggml_free(c);
        }
    }
}

size_t llama_moe_cache::buffer_size() const {
    return buf ? ggml_backend_buffer_get_size(buf) : llama_moe_cache_devices_bytes(devices);
}

ggml_backend_buffer_type_t llama_moe_cache::buffer_type() const {
    return buf ? ggml_backend_buffer_get_type(buf) : devices.empty() ? nullptr : devices[0].buft;
}

void llama_moe_cache::push_slot_map(llama_moe_cache_layer & layer) {
    // a miss maps to a real slot, never -1, so that a device read of the map cannot index outside the slots:
    // the null slot in hybrid mode, slot 0 in upload mode (where the lookup rewrites the ids anyway)
    const int32_t miss = layer.cpu_map ? layer.n_slots : 0;
    remap_host.resize(layer.n_expert);
    for (int e = 0; e < layer.n_expert; ++e) {
        remap_host[e] = layer.slot_of[e] >= 0 ? layer.slot_of[e] : miss;
    }
    ggml_backend_tensor_set(layer.slot_map, remap_host.data(), 0, layer.n_expert * sizeof(int32_t));
    if (layer.cpu_map) {
        for (int e = 0; e < layer.n_expert; ++e) {
            remap_host[e] = layer.slot_of[e] >= 0 ? -1 : e;
        }
        ggml_backend_tensor_set(layer.cpu_map, remap_host.data(), 0, layer.n_expert * sizeof(int32_t));
    }
}

bool llama_moe_cache::upload(llama_moe_cache_layer & layer, int32_t expert, int32_t slot) {
    GGML_ASSERT(expert >= 0 && expert < layer.n_expert && slot >= 0 && slot < layer.n_slots);
    const int32_t old = layer.expert_in[slot];
    if (old >= 0) {
        layer.slot_of[old] = -1;
    }
    for (int j = 0; j < 3; ++j) {
        const ggml_tensor * src = layer.src[j];
        if (src) {
            ggml_backend_tensor_set(layer.dst[j], (const char *) src->data + expert * src->nb[2], slot * layer.dst[j]->nb[2], src->nb[2]);
        }
        const ggml_tensor * src_b = layer.src_b[j];
        if (src_b) {
            ggml_backend_tensor_set(layer.dst_b[j], (const char *) src_b->data + expert * src_b->nb[1], slot * layer.dst_b[j]->nb[1], src_b->nb[1]);
        }
    }
    layer.expert_in[slot]    = expert;
    layer.slot_of[expert]    = slot;
    layer.from_profile[slot] = 0;
    return true;
}

double llama_moe_cache::adapt_prior(const llama_moe_cache_layer & l) const {
    // its share of the picks a layer's slots take in that many tokens
    return LLAMA_MOE_ADAPT_PRIOR_TOKENS * (double) l.n_used / std::max<int64_t>(l.n_slots, 1);
}

bool llama_moe_cache::load_profile(const std::string & path, uint32_t n_layer, llama_moe_profile & profile, llama_moe_cache_report & report) {
    std::string err;
    const uint32_t n_expert = (uint32_t) layers[0].n_expert;
    if (llama_moe_profile_load(path, n_layer, n_expert, profile, err) && llama_moe_cache_check_layer_slots(layers, profile, err)) {
        return true;
    }
    report.warn(LLAMA_MOE_CACHE_REASON_PROFILE_REFUSED, "MoE cache profile %s refused: %s; the cache starts empty%s", path.c_str(), err.c_str(),
                profile.layer_slots.empty() ? "" : ", with the same slots in every layer");
    profile_error = err; // for the load line, /metrics and the audit log (llama_moe_cache_get_info)
    profile = {};
    return false;
}

void llama_moe_cache::prefill(const llama_moe_profile & profile, const std::string & path) {
    std::vector<int> index_of(profile.n_layers, -1);
    for (size_t i = 0; i < layers.size(); ++i) {
        index_of[layers[i].il] = (int) i;
    }
    std::vector<int> next_free(layers.size(), 0);
    size_t bytes = 0;
    // each layer takes its own hottest pairs until its slots are full; a full layer skips only its own pairs
    for (const auto & [il, ie] : profile.ranked) {
        const int li = index_of[il];
        if (li < 0) {
            continue;
        }
        auto & l = layers[li];
        if (l.whole || next_free[li] >= l.n_slots || ie >= l.n_expert || l.slot_of[ie] >= 0) {
            continue;
        }
        const int slot = next_free[li]++;
        upload(l, ie, slot);
        l.from_profile[slot] = 1;
        if (!l.heat.empty()) {
            l.heat[ie] = adapt_prior(l);
        }
        n_prefilled++;
        bytes += l.expert_bytes;
    }
    for (auto & l : layers) {
        push_slot_map(l);
    }
    LLAMA_LOG_INFO("%s: MoE cache filled with %" PRIu64 " experts (%.2f MiB) from %s\n", __func__, n_prefilled, bytes / MiB, path.c_str());
}

llama_moe_cache_route llama_moe_cache::build(ggml_context * ctx0, int64_t n_tokens, int64_t n_expert_used, bool warmup,
                                             const llama_moe_cache_route & model) const {
    llama_moe_cache_route r = model;
    ggml_tensor * selected = model.ids[0];
    ggml_tensor * gate = model.gate[0];
    ggml_tensor * up   = model.up[0];
    ggml_tensor * down = model.down[0];
    // the warmup selects every expert, and prompts keep llama.cpp's path
    if (warmup || n_tokens > LLAMA_MOE_CACHE_MAX_UBATCH || down == nullptr) {
        return r;
    }
    const auto it = layer_of_weight.find(down);
    if (it == layer_of_weight.end()) {
        return r;
    }
    const auto & l = layers[it->second];
    GGML_ASSERT(gate == l.src[0] && up == l.src[1]);
    // upload mode: the graph is built before the router picks, and a ubatch that may select more distinct experts
    // than the layer has slots may not fit them all. It is split like the hybrid: the eval callback looks its
    // experts up (hits, then misses uploaded into the slots the ubatch does not use) and writes one code per
    // selection (lookup_split); the device computes the experts in slots, the CPU the others from RAM, and the
    // two parts are summed. The codes' maps give each chain its ids; the device's rows of the CPU's experts read
    // slot 0 and are zeroed by the mask
    if (!l.whole && !l.cpu_map && n_tokens * n_expert_used > l.n_slots) {
        const int64_t n = n_expert_used * n_tokens;
        ggml_tensor * flat = ggml_reshape_1d(ctx0, ggml_is_contiguous(selected) ? selected : ggml_cont(ctx0, selected), n);
        ggml_tensor * codes = ggml_get_rows(ctx0, l.split_ids, flat); // [1, n]: the ids, until the callback's codes
        ggml_format_name(codes, "ffn_moe_split-%d", l.il);
        codes = ggml_reshape_1d(ctx0, codes, n);
        ggml_tensor * dev  = ggml_get_rows(ctx0, l.split_dev,  codes);
        ggml_tensor * mask = ggml_get_rows(ctx0, l.split_mask, codes);
        ggml_tensor * cpu  = ggml_get_rows(ctx0, l.split_cpu,  codes);
        r.n = 2;
        r.gate[0] = l.dst[0];
        r.up  [0] = l.dst[1];
        r.down[0] = l.dst[2];
        r.ids [0] = ggml_reshape_2d(ctx0, dev, 1, n); // slot 0 repeats: one selected expert per row
        r.one_id_per_row[0] = true;
        r.mask[0] = ggml_reshape_3d(ctx0, mask, 1, n_expert_used, n_tokens);
        r.bias_ids[0] = ggml_reshape_2d(ctx0, flat, 1, n); // the model's biases, by expert
        r.gate[1] = l.src[0];
        r.up  [1] = l.src[1];
        r.down[1] = l.src[2];
        r.ids [1] = ggml_reshape_2d(ctx0, cpu, n_expert_used, n_tokens);
        r.cpu_only[1] = true;
        r.gate_b[1] = model.gate_b[0];
        r.up_b  [1] = model.up_b[0];
        r.down_b[1] = model.down_b[0];
        r.bias_ids[1] = r.ids[1];
        return r;
    }
    r.gate[0] = l.dst[0];
    r.up  [0] = l.dst[1];
    r.down[0] = l.dst[2];
    if (l.whole) {
        return r;
    }
    // get_rows broadcasts over nothing: the ids go flat, [n_expert_used * n_tokens], through a map of [1, n_expert]
    // (one token's selection is contiguous already: no copy)
    ggml_tensor * flat  = ggml_reshape_1d(ctx0, ggml_is_contiguous(selected) ? selected : ggml_cont(ctx0, selected),
                                          n_expert_used * n_tokens);
    ggml_tensor * slots = ggml_get_rows(ctx0, l.slot_map, flat); // [1, n_expert_used * n_tokens]
    ggml_format_name(slots, "ffn_moe_slots-%d", l.il);
    r.ids[0] = ggml_reshape_2d(ctx0, slots, n_expert_used, n_tokens);
    if (l.cpu_map) {
        // the device part: every expert the cache lacks maps to the one null slot, so a token may select it more
        // than once, which kernels that group a token's experts cannot take (CUDA's MMQ loses the repeats and
        // writes out of bounds); one selected expert per activation row has no repeats
        r.ids[0] = ggml_reshape_2d(ctx0, slots, 1, n_expert_used * n_tokens);
        r.one_id_per_row[0] = true;
        ggml_tensor * cpu = ggml_get_rows(ctx0, l.cpu_map, flat);
        ggml_format_name(cpu, "ffn_moe_cpu_ids-%d", l.il);
        r.n = 2;
        r.gate[1] = l.src[0];
        r.up  [1] = l.src[1];
        r.down[1] = l.src[2];
        r.ids [1] = ggml_reshape_2d(ctx0, cpu, n_expert_used, n_tokens);
        r.cpu_only[1] = true;
        // each chain adds the biases of the experts it computes: the device's by slot (zero in the null slot),
        // the CPU's by expert (nothing for -1)
        r.gate_b[0] = l.dst_b[0];
        r.up_b  [0] = l.dst_b[1];
        r.down_b[0] = l.dst_b[2];
        r.bias_ids[0] = r.ids[0];
        r.gate_b[1] = l.src_b[0];
        r.up_b  [1] = l.src_b[1];
        r.down_b[1] = l.src_b[2];
        r.bias_ids[1] = r.ids[1];
    }
    return r;
}

// Upload mode's slot for a miss: a free one, else the least recently used one the ubatch (stamp now) does not
// use; -1 when every slot serves the ubatch.
static int32_t llama_moe_cache_lru_victim(const llama_moe_cache_layer & l, uint64_t now) {
    int32_t victim = -1;
    for (int32_t c = 0; c < l.n_slots && (victim < 0 || l.expert_in[victim] >= 0); ++c) {
        if (l.expert_in[c] < 0) {
            victim = c;
        } else if (l.last_use[c] != now && (victim < 0 || l.last_use[c] < l.last_use[victim])) {
            victim = c;
        }
    }
    return victim;
}

// Upload mode's lookup of a ubatch's ids (flat, n_per_token a token), under the mutex: hits first, so that no
// expert this ubatch uses is evicted for a miss of the same ubatch, then each distinct miss into a free slot or the
// least recently used one the ubatch does not use. With on_cpu (the split), a miss left without one once every slot
// serves the ubatch is marked there for the CPU; without, there is always one. Returns whether a slot changed.
bool llama_moe_cache::lookup_locked(llama_moe_cache_layer & l, const int32_t * ids, int64_t n, int64_t n_per_token,
                                    std::vector<uint8_t> * on_cpu) {
    const uint64_t now = ++stamp;
    const uint64_t hit0 = l.n_hit, miss0 = l.n_miss;
    bool changed = false;
    for (int64_t i = 0; i < n; ++i) {
        const int32_t e = ids[i];
        GGML_ASSERT(e >= 0 && e < l.n_expert);
        const int32_t s = l.slot_of[e];
        if (s >= 0 && l.last_use[s] != now) { // distinct per ubatch
            l.last_use[s] = now;
            l.n_hit++;
            l.n_hit_profile += l.from_profile[s];
            acct.charge(i / n_per_token, llama_moe_accounting::HIT, 0, 0); // per-request accounting
        }
    }
    for (int64_t i = 0; i < n; ++i) {
        const int32_t e = ids[i];
        if (l.slot_of[e] >= 0 || (on_cpu && (*on_cpu)[e])) {
            continue;
        }
        l.n_miss++;
        const int32_t victim = llama_moe_cache_lru_victim(l, now);
        if (victim < 0 && on_cpu) {
            (*on_cpu)[e] = 1;
            l.n_cpu++;
            n_bytes_cpu += l.expert_bytes;
            acct.charge(i / n_per_token, llama_moe_accounting::MISS, 0, l.expert_bytes); // per-request accounting
            continue;
        }
        GGML_ASSERT(victim >= 0 && "more distinct experts in a ubatch than slots");
        upload(l, e, victim);
        l.last_use[victim] = now;
        n_bytes_upload += l.expert_bytes;
        acct.charge(i / n_per_token, llama_moe_accounting::MISS, l.expert_bytes, 0); // per-request accounting
        changed = true;
    }
    count_by_size(n / std::max<int64_t>(l.n_used, 1), l.n_hit - hit0, l.n_miss - miss0, 0);
    return changed;
}

void llama_moe_cache::lookup(llama_moe_cache_layer & l, ggml_tensor * remap) {
    const ggml_tensor * ids = remap->src[1];
    const int64_t n_used = ids->ne[0], n_tokens = ids->ne[1];
    ids_host.resize(ggml_nbytes(ids) / sizeof(int32_t) + 1);
    ggml_backend_tensor_get(ids, ids_host.data(), 0, ggml_nbytes(ids));

    std::lock_guard<std::mutex> lock(mutex); // remap_host is push_slot_map's scratch too, in the background
    // the ids flat, token after token; then in place, their slots
    remap_host.resize(n_used * n_tokens);
    for (int64_t t = 0; t < n_tokens; ++t) {
        for (int64_t k = 0; k < n_used; ++k) {
            remap_host[t * n_used + k] = ids_host[(t * ids->nb[1] + k * ids->nb[0]) / sizeof(int32_t)];
        }
    }
    const bool changed = lookup_locked(l, remap_host.data(), n_used * n_tokens, std::max<int64_t>(n_used, 1), nullptr);
    for (int32_t & e : remap_host) {
        e = l.slot_of[e];
    }
    ggml_backend_tensor_set(remap, remap_host.data(), 0, remap_host.size() * sizeof(int32_t));
    if (changed) {
        push_slot_map(l);
    }
}

bool llama_moe_cache::wants(const ggml_tensor * t) const {
    if (t->op != GGML_OP_GET_ROWS) {
        return false;
    }
    // upload mode looks up at the slot map and counts a refusal at its map; the hybrid only counts, at the CPU
    // map, where the ids are in RAM
    if (params.hybrid) {
        return layer_of_cpu_map.count(t->src[0]) > 0;
    }
    return layer_of_slot_map.count(t->src[0]) > 0 || layer_of_split_map.count(t->src[0]) > 0;
}

void llama_moe_cache::on_computed(ggml_tensor * t) {
    if (params.hybrid) {
        count_hybrid(layers[layer_of_cpu_map.at(t->src[0])], t->src[1]);
        return;
    }
    const auto split = layer_of_split_map.find(t->src[0]);
    if (split != layer_of_split_map.end()) {
        lookup_split(layers[split->second], t);
    } else {
        lookup(layers[layer_of_slot_map.at(t->src[0])], t);
    }
}

void llama_moe_cache::lookup_split(llama_moe_cache_layer & l, ggml_tensor * codes) {
    // the split's ids, flat, before the callback turns them into codes
    GGML_ASSERT(ggml_is_contiguous(codes) && codes->type == GGML_TYPE_I32);
    const int64_t n = ggml_nelements(codes);
    ids_host.resize(n);
    ggml_backend_tensor_get(codes, ids_host.data(), 0, ggml_nbytes(codes));
    std::lock_guard<std::mutex> lock(mutex);
    // as lookup, but once every slot serves the ubatch, the remaining misses go to the CPU
    std::vector<uint8_t> & on_cpu = missed_host;
    on_cpu.assign(l.n_expert, 0);
    const bool changed = lookup_locked(l, ids_host.data(), n, std::max<int64_t>(l.n_used, 1), &on_cpu);
    for (int64_t i = 0; i < n; ++i) {
        const int32_t e = ids_host[i];
        ids_host[i] = l.slot_of[e] >= 0 ? l.slot_of[e] : l.n_slots + e;
    }
    ggml_backend_tensor_set(codes, ids_host.data(), 0, ggml_nbytes(codes));
    if (changed) {
        push_slot_map(l);
    }
}

void llama_moe_cache::count_hybrid(llama_moe_cache_layer & l, const ggml_tensor * ids) {
    // the ids are flat, [n_expert_used * n_tokens]; the scratch is the graph thread's, like lookup's
    GGML_ASSERT(ggml_is_contiguous(ids));
    ids_host.resize(ggml_nelements(ids));
    ggml_backend_tensor_get(ids, ids_host.data(), 0, ggml_nbytes(ids));
    std::lock_guard<std::mutex> lock(mutex);
    count_hybrid_locked(l, ids_host.data(), ggml_nelements(ids) / std::max<int64_t>(l.n_used, 1));
}

void llama_moe_cache::count_selected(int il, const int32_t * selected, int32_t * cpu_ids) {
    auto & l = layers.at(layer_of_il.at(il));
    // one lock for the count and the split: a rebalance between them could move an expert just counted
    std::lock_guard<std::mutex> lock(mutex);
    count_hybrid_locked(l, selected, 1);
    for (int64_t k = 0; k < l.n_used; ++k) {
        GGML_ASSERT(selected[k] >= 0 && selected[k] < l.n_expert);
        cpu_ids[k] = l.slot_of[selected[k]] >= 0 ? -1 : selected[k];
    }
}

void llama_moe_cache::count_hybrid_locked(llama_moe_cache_layer & l, const int32_t * ids, int64_t n_tokens) {
    const uint64_t now = ++stamp;
    if (&l == &layers[clock_layer]) {
        n_tokens_small += n_tokens;
    }
    if (!l.heat.empty()) {
        const double fade = std::pow(0.5, (double) n_tokens / LLAMA_MOE_ADAPT_HALF_LIFE);
        for (double & h : l.heat) {
            h *= fade;
        }
    }
    // distinct experts per ubatch: a hit marks its slot, a miss its expert in a scratch map
    const uint64_t hit0 = l.n_hit, miss0 = l.n_miss;
    std::vector<uint8_t> & missed = missed_host;
    missed.assign(l.n_expert, 0);
    for (int64_t t = 0; t < n_tokens; ++t) {
        for (int64_t k = 0; k < l.n_used; ++k) {
            const int32_t e = ids[t * l.n_used + k];
            GGML_ASSERT(e >= 0 && e < l.n_expert);
            const int32_t s = l.slot_of[e];
            if (s >= 0) {
                if (l.last_use[s] != now) {
                    l.last_use[s] = now;
                    l.n_hit++;
                    l.n_hit_profile += l.from_profile[s];
                    acct.charge(t, llama_moe_accounting::HIT, 0, 0); // per-request accounting
                    if (!l.heat.empty()) {
                        l.heat[e] += 1.0;
                    }
                }
            } else if (!missed[e]) {
                missed[e] = 1;
                l.n_miss++;
                if (admitting()) {
                    l.admit_queue.push_back(e);
                    admit_pending = true;
                }
                n_bytes_cpu += l.expert_bytes;
                acct.charge(t, llama_moe_accounting::MISS, 0, l.expert_bytes); // per-request accounting
                if (!l.heat.empty()) {
                    l.heat[e] += 1.0;
                }
            }
        }
    }
    count_by_size(n_tokens, l.n_hit - hit0, l.n_miss - miss0, 0);
}

bool llama_moe_cache::copy_expert(ggml_backend_t backend, const ggml_tensor * src, int32_t expert, ggml_tensor * dst,
                                  size_t offset, size_t size, void * user_data) {
    auto * cache = (llama_moe_cache *) user_data;
    const auto it = cache->slot_of_weight.find(src);
    if (!cache->copy_on || it == cache->slot_of_weight.end() || ggml_backend_get_device(backend) != cache->layer_device(it->second.first)) {
        return false;
    }
    const auto & l = cache->layers[it->second.first];
    const ggml_tensor * slots = l.dst[it->second.second];
    GGML_ASSERT(expert >= 0 && expert < l.n_expert && size >= src->nb[2] && offset + size <= ggml_nbytes(dst));
    const int32_t slot = l.slot_of[expert];
    // the copy runs past the expert into the next slot (the host copy's padding): only inside the tensor
    if (slot < 0 || slot * slots->nb[2] + size > ggml_nbytes(slots)) {
        return false;
    }
    // byte views of the slot and of the expert's place in the batch's copy of the weight
    ggml_tensor from = {};
    from.type   = GGML_TYPE_I8;
    from.buffer = slots->buffer;
    from.data   = (char *) slots->data + slot * slots->nb[2];
    from.ne[0]  = (int64_t) size;
    from.ne[1]  = from.ne[2] = from.ne[3] = 1;
    from.nb[0]  = 1;
    from.nb[1]  = from.nb[2] = from.nb[3] = size;
    ggml_tensor to = from;
    to.buffer = dst->view_src ? dst->view_src->buffer : dst->buffer;
    to.data   = (char *) dst->data + offset;
    ggml_backend_tensor_copy_async(backend, backend, &from, &to);

    std::lock_guard<std::mutex> lock(cache->mutex);
    cache->n_bytes_copy += src->nb[2];
    if (it->second.second == 2) {
        cache->n_copy++; // an expert counts once, at its down weight
    }
    return true;
}

void llama_moe_cache::get_stats(llama_moe_cache_stats * out) const {
    std::lock_guard<std::mutex> lock(mutex);
    *out = {};
    for (const auto & l : layers) {
        out->n_hit         += l.n_hit;
        out->n_hit_profile += l.n_hit_profile;
        out->n_miss        += l.n_miss;
        out->n_refused     += l.n_refused;
        out->n_cpu         += l.n_cpu;
        for (int32_t s = 0; s < l.n_slots; ++s) {
            out->n_resident += l.expert_in[s] >= 0 && !l.in_flight[s];
        }
    }
    out->n_bytes_upload = n_bytes_upload;
    out->n_bytes_cpu    = n_bytes_cpu;
    out->n_copy         = n_copy;
    out->n_bytes_copy   = n_bytes_copy;
    out->n_swap         = n_swap;
    out->n_admit        = n_admit;
    out->hybrid         = params.hybrid;
    out->n_slots        = n_slots_total;
    out->n_prefilled    = n_prefilled;
    out->n_bytes_cache  = buffer_size();
}

int32_t llama_moe_cache::get_layer_stats(llama_moe_cache_layer_stats * out, int32_t n_max) const {
    std::lock_guard<std::mutex> lock(mutex);
    const int32_t n = (int32_t) layers.size();
    for (int32_t i = 0; out != nullptr && i < std::min(n, n_max); ++i) {
        const auto & l = layers[i];
        out[i] = { l.il, l.n_slots, l.n_hit, l.n_hit_profile, l.n_miss, l.n_refused, l.n_cpu };
    }
    return n;
}

int32_t llama_moe_cache::get_resident(int32_t il, int32_t * out, int32_t n_max) const {
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto & l : layers) {
        if (l.il != il) {
            continue;
        }
        int32_t n = 0;
        for (int32_t e = 0; e < l.n_expert; ++e) {
            if (l.slot_of[e] >= 0) {
                if (out != nullptr && n < n_max) {
                    out[n] = e;
                }
                n++;
            }
        }
        return n;
    }
    return 0;
}

bool llama_moe_cache::between_decodes_due() const {
    return rebalance_due() || admit_pending || round_in_flight;
}

void llama_moe_cache::between_decodes() {
    {
        std::lock_guard<std::mutex> lock(mutex);
        finish_admission();
    }
    if (rebalance_due()) {
        rebalance(-1);
    }
    if (admit_pending) {
        std::lock_guard<std::mutex> lock(mutex);
        admit();
    }
}

// Where an admission goes: the first free slot, else the least recently used one (the lowest of equals).
static int32_t llama_moe_cache_admit_slot(const llama_moe_cache_layer & l) {
    int32_t s = 0;
    for (int32_t i = 0; i < l.n_slots; ++i) {
        if (l.expert_in[i] < 0) {
            return i;
        }
        if (l.last_use[i] < l.last_use[s]) {
            s = i;
        }
    }
    return s;
}

// Uploads at most the budget's count (admit_budget) of each layer's missed experts, first missed first, each into a free slot or
// else the least recently used one (the lowest of equals); an admitted expert counts as just used. The rest
// of a layer's misses are dropped: the next decode's misses are the fresher ones.
int32_t llama_moe_cache::admit() {
    const auto t0 = std::chrono::steady_clock::now();
    finish_admission();
    const uint64_t now = ++stamp; // newer than every hit of the decode before
    const int32_t budget = admit_budget.next_round();
    int32_t n = 0;
    std::vector<llama_moe_upload_piece> pieces;
    for (auto & l : layers) {
        int32_t n_layer = 0;
        for (const int32_t e : l.admit_queue) {
            if (n_layer >= budget) {
                break;
            }
            bool held = l.slot_of[e] >= 0 || l.n_slots < 1;
            for (int32_t s = 0; s < l.n_slots && !held && uploader; ++s) {
                held = l.in_flight[s] && l.expert_in[s] == e;
            }
            if (held) {
                continue; // admitted earlier in this round
            }
            const int32_t s = llama_moe_cache_admit_slot(l);
            if (uploader) {
                place_later(l, e, s, pieces);
            } else {
                upload(l, e, s);
            }
            l.last_use[s] = now;
            n_layer++;
        }
        l.admit_queue.clear();
        if (n_layer > 0) {
            push_slot_map(l); // in the background: the evicted experts are misses from now, the new ones not yet hits
            n_bytes_upload += (uint64_t) n_layer * l.expert_bytes;
            n += n_layer;
        }
    }
    if (!pieces.empty()) {
        uploader->submit(std::move(pieces));
        round_in_flight = true;
        round_n = n;
        n_admit_rounds++;
    }
    admit_pending = false;
    n_admit += n;
    if (n > 0) {
        const auto us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
        if (!uploader) {
            admit_budget.round_done(n, us); // the synchronous uploads: their time is this call's
        }
        LLAMA_LOG_DEBUG("%s: %d experts admitted in %.1f ms\n", __func__, n, us / 1000.0);
    }
    return n;
}

// An admission into slot s in the background: the slot's expert is evicted now (a miss from the next decode on,
// so no decode reads the slot while it is written), the new one is only recorded as in flight until
// finish_admission, and the copies go to the uploader.
void llama_moe_cache::place_later(llama_moe_cache_layer & l, int32_t e, int32_t s, std::vector<llama_moe_upload_piece> & pieces) {
    GGML_ASSERT(e >= 0 && e < l.n_expert && s >= 0 && s < l.n_slots);
    const int32_t old = l.expert_in[s];
    if (old >= 0 && !l.in_flight[s]) {
        l.slot_of[old] = -1;
    }
    l.expert_in[s]    = e;
    l.from_profile[s] = 0;
    l.in_flight[s]    = 1;
    for (int j = 0; j < 3; ++j) {
        if (const ggml_tensor * src = l.src[j]) {
            pieces.push_back({ (const char *) src->data + e * src->nb[2], l.dst[j], s * l.dst[j]->nb[2], src->nb[2],
                               uploader->is_pinned(src) });
        }
        if (const ggml_tensor * src_b = l.src_b[j]) {
            pieces.push_back({ (const char *) src_b->data + e * src_b->nb[1], l.dst_b[j], s * l.dst_b[j]->nb[1], src_b->nb[1],
                               uploader->is_pinned(src_b) });
        }
    }
}

void llama_moe_cache::finish_admission() {
    if (!round_in_flight) {
        return;
    }
    admit_wait_us += uploader->wait(); // issued a whole decode ago: normally done
    round_in_flight = false;
    admit_budget.round_done(round_n, uploader->last_round_us());
    for (auto & l : layers) {
        bool changed = false;
        for (int32_t s = 0; s < l.n_slots; ++s) {
            if (l.in_flight[s]) {
                l.in_flight[s] = 0;
                l.slot_of[l.expert_in[s]] = s;
                changed = true;
            }
        }
        if (changed) {
            push_slot_map(l);
        }
    }
}

int32_t llama_moe_cache::admit_experts(int32_t il, const int32_t * experts, int32_t n) {
    std::lock_guard<std::mutex> lock(mutex);
    finish_admission();
    const auto it = layer_of_il.find(il);
    if (it == layer_of_il.end()) {
        return 0;
    }
    auto & l = layers[it->second];
    for (int32_t i = 0; i < n; ++i) {
        if (experts[i] < 0 || experts[i] >= l.n_expert) {
            LLAMA_LOG_ERROR("%s: layer %d has experts 0 to %d, got %d\n", __func__, il, l.n_expert - 1, experts[i]);
            return -1;
        }
    }
    if (l.whole) {
        return 0; // every expert is held already
    }
    const uint64_t now = ++stamp; // newer than every slot not admitted here, so none of these is evicted by another
    int32_t done = 0;
    for (int32_t i = 0; i < n && done < l.n_slots; ++i) {
        const int32_t e = experts[i];
        if (l.slot_of[e] >= 0) {
            l.last_use[l.slot_of[e]] = now;
            continue;
        }
        const int32_t s = llama_moe_cache_admit_slot(l);
        if (l.last_use[s] == now && l.expert_in[s] >= 0) {
            break; // every slot holds one of the given experts
        }
        upload(l, e, s);
        l.last_use[s] = now;
        done++;
    }
    if (done > 0) {
        push_slot_map(l);
        n_bytes_upload += (uint64_t) done * l.expert_bytes;
        n_admit += done;
    }
    return done;
}

bool llama_moe_cache::rebalance_due() const {
    return adaptive() && (n_tokens_small >= next_fill || n_tokens_small >= next_swap);
}

int32_t llama_moe_cache::rebalance(int32_t max_swaps) {
    if (!adaptive()) {
        return -1;
    }
    std::lock_guard<std::mutex> lock(mutex);
    finish_admission();
    int32_t fills = 0;
    if (max_swaps < 0) { // the automatic rounds
        fills = n_tokens_small >= next_fill ? LLAMA_MOE_ADAPT_MAX_FILLS : 0;
        const int32_t swaps = n_tokens_small >= next_swap ? LLAMA_MOE_ADAPT_MAX_SWAPS : 0;
        next_fill = n_tokens_small + LLAMA_MOE_ADAPT_FILL_EVERY;
        if (swaps > 0) {
            next_swap = n_tokens_small + LLAMA_MOE_ADAPT_PERIOD;
        }
        return do_rebalance(swaps, fills, fills + swaps);
    }
    // on request, max_swaps bounds the uploads in all: free slots first, then swaps with what is left
    return do_rebalance(max_swaps, max_swaps, max_swaps);
}

// Fills free slots with the hottest experts the cache lacks (up to max_fills), then swaps the hottest missing
// experts for the coldest resident ones of the same layer (up to max_swaps, best gains first), at most max_total
// uploads of the two together, fills first: a fill evicts nothing.
int32_t llama_moe_cache::do_rebalance(int32_t max_swaps, int32_t max_fills, int32_t max_total) {
    const auto t0 = std::chrono::steady_clock::now();
    struct move { double gain; int li; int32_t expert; int32_t slot; };
    std::vector<move> fills, swaps;
    std::vector<int32_t> missing, resident;
    for (int li = 0; li < (int) layers.size(); ++li) {
        auto & l = layers[li];
        if (l.whole || l.heat.empty()) {
            continue; // a layer held whole has nothing to gain
        }
        missing.clear();
        resident.clear();
        for (int32_t e = 0; e < l.n_expert; ++e) {
            if (l.slot_of[e] < 0) {
                if (l.heat[e] > 0.0) {
                    missing.push_back(e);
                }
            } else {
                resident.push_back(e);
            }
        }
        std::sort(missing.begin(), missing.end(), [&](int32_t a, int32_t b) { return l.heat[a] > l.heat[b]; });
        std::sort(resident.begin(), resident.end(), [&](int32_t a, int32_t b) { return l.heat[a] < l.heat[b]; });
        size_t im = 0;
        for (int32_t s = 0; s < l.n_slots && im < missing.size(); ++s) {
            if (l.expert_in[s] < 0) {
                fills.push_back({ l.heat[missing[im]], li, missing[im], s });
                im++;
            }
        }
        for (size_t ir = 0; im < missing.size() && ir < resident.size(); ++im, ++ir) {
            const double in = l.heat[missing[im]], out = l.heat[resident[ir]];
            if (in <= LLAMA_MOE_ADAPT_RATIO * out + LLAMA_MOE_ADAPT_MARGIN) {
                break;
            }
            swaps.push_back({ in - out, li, missing[im], l.slot_of[resident[ir]] });
        }
    }
    auto by_gain = [](const move & a, const move & b) { return a.gain > b.gain; };
    std::sort(fills.begin(), fills.end(), by_gain);
    std::sort(swaps.begin(), swaps.end(), by_gain);
    fills.resize(std::min<size_t>(fills.size(), std::max(std::min(max_fills, max_total), 0)));
    swaps.resize(std::min<size_t>(swaps.size(), std::max(std::min<int32_t>(max_swaps, max_total - (int32_t) fills.size()), 0)));
    std::vector<uint8_t> changed(layers.size(), 0);
    for (const auto * list : { &fills, &swaps }) {
        for (const auto & m : *list) {
            upload(layers[m.li], m.expert, m.slot);
            changed[m.li] = 1;
        }
    }
    for (size_t li = 0; li < layers.size(); ++li) {
        if (changed[li]) {
            push_slot_map(layers[li]);
        }
    }
    const int32_t n = (int32_t) (fills.size() + swaps.size());
    n_swap += n;
    if (n > 0) {
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        LLAMA_LOG_DEBUG("%s: %d experts swapped in %.1f ms\n", __func__, n, ms);
    }
    return n;
}
