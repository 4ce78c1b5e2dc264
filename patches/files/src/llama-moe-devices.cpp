#include "llama-moe-devices.h"
#include "llama-moe-cache.h"
#include "llama-moe-config.h"
#include "llama-moe-status.h"

#include "llama-context.h"
#include "llama-impl.h"
#include "llama-model.h"

#include "ggml-alloc.h"

#include <algorithm>
#include <cinttypes>
#include <stdexcept>

static constexpr double MiB = 1024.0*1024.0;

static std::string llama_moe_cache_device_describe(const llama_moe_cache_device & d, const std::vector<llama_moe_cache_layer> & layers);

std::vector<llama_moe_cache_device> llama_moe_cache_devices_assign(
        const llama_model & model, const std::vector<llama_moe_cache_layer> & layers,
        ggml_backend_dev_t default_dev, ggml_backend_buffer_type_t default_buft, const std::string & default_name) {
    std::vector<llama_moe_cache_device> devices;
    // the device named for tests and comparisons holds every layer, as before there were several
    const bool one = llama_moe_env_str("LLAMA_MOE_CACHE_DEVICE") != nullptr;
    for (int i = 0; i < (int) layers.size(); ++i) {
        ggml_backend_dev_t dev = one ? nullptr : model.dev_layer(layers[i].il);
        if (dev == nullptr || ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) {
            dev = default_dev; // a layer the CPU computes: its experts' slots where the cache would be anyway
        }
        auto it = std::find_if(devices.begin(), devices.end(), [dev](const llama_moe_cache_device & d) { return d.dev == dev; });
        if (it == devices.end()) {
            llama_moe_cache_device d;
            d.dev  = dev;
            d.buft = dev == default_dev ? default_buft : ggml_backend_dev_buffer_type(dev);
            d.name = dev == default_dev ? default_name : ggml_backend_dev_name(dev);
            devices.push_back(std::move(d));
            it = devices.end() - 1;
        }
        it->layers.push_back(i);
    }
    return devices;
}

bool llama_moe_cache_devices_plan(std::vector<llama_moe_cache_device> & devices, std::vector<llama_moe_cache_layer> & layers,
                                  size_t size, bool hybrid, const llama_moe_cache_fit_fn & fit, llama_moe_cache_report & report) {
    std::vector<uint8_t> keep(layers.size(), 1);
    for (auto & d : devices) {
        std::vector<llama_moe_cache_layer> mine;
        size_t per_slot_row = 0, maps = 0;
        int64_t most = 0;
        for (int i : d.layers) {
            mine.push_back(layers[i]);
            per_slot_row += layers[i].expert_bytes;
            maps         += GGML_PAD(layers[i].n_expert * sizeof(int32_t), 256);
            most          = std::max<int64_t>(most, layers[i].n_expert);
        }
        const size_t null_slots = hybrid ? per_slot_row : 0;
        const size_t budget = size > maps + null_slots ? size - maps - null_slots : 0;
        const int64_t slots = (int64_t) (budget / per_slot_row);
        if (slots < 1) {
            report.warn(LLAMA_MOE_CACHE_REASON_TOO_SMALL, "%.2f MiB per device cannot hold one expert per layer of %s's %zu layers "
                        "(%.2f MiB needed); they keep llama.cpp's path", size / MiB, d.name.c_str(), d.layers.size(),
                        (per_slot_row + maps + null_slots) / MiB);
        } else {
            d.slots_asked = std::min(slots, most);
            d.slots       = fit(d, mine, d.slots_asked, maps, null_slots);
        }
        if (d.slots < 1) {
            for (int i : d.layers) {
                keep[i] = 0;
            }
        }
    }
    // the layers that stay, and each device's indices into them
    std::vector<int> index(layers.size(), -1);
    std::vector<llama_moe_cache_layer> kept;
    for (size_t i = 0; i < layers.size(); ++i) {
        if (keep[i]) {
            index[i] = (int) kept.size();
            kept.push_back(std::move(layers[i]));
        }
    }
    layers = std::move(kept);
    devices.erase(std::remove_if(devices.begin(), devices.end(), [](const llama_moe_cache_device & d) { return d.slots < 1; }), devices.end());
    for (auto & d : devices) {
        for (int & i : d.layers) {
            i = index[i];
        }
    }
    if (layers.size() < keep.size() && !layers.empty() && !report.has(LLAMA_MOE_CACHE_REASON_LAYERS_SKIPPED)) {
        report.warn(LLAMA_MOE_CACHE_REASON_LAYERS_SKIPPED, "the layers of a device without room for the cache keep llama.cpp's path");
    }
    return !layers.empty();
}

void llama_moe_cache_devices_alloc(std::vector<llama_moe_cache_device> & devices, const std::vector<llama_moe_cache_layer> & layers) {
    for (auto & d : devices) {
        std::vector<ggml_tensor *> tensors;
        for (int i : d.layers) {
            const auto & l = layers[i];
            for (int j = 0; j < 3; ++j) {
                for (ggml_tensor * t : {l.dst[j], l.dst_b[j]}) {
                    if (t) {
                        tensors.push_back(t);
                    }
                }
            }
            tensors.push_back(l.slot_map);
        }
        const size_t align = ggml_backend_buft_get_alignment(d.buft);
        size_t total = 0;
        for (ggml_tensor * t : tensors) {
            total += GGML_PAD(ggml_backend_buft_get_alloc_size(d.buft, t), align);
        }
        d.buf.reset(ggml_backend_buft_alloc_buffer(d.buft, total));
        if (!d.buf) {
            throw std::runtime_error(format("llama_moe_cache: cannot allocate %.2f MiB on %s for the MoE cache; "
                                            "ask for less with --moe-cache-mib", total / MiB, d.name.c_str()));
        }
        ggml_tallocr talloc = ggml_tallocr_new(d.buf.get());
        for (ggml_tensor * t : tensors) {
            GGML_ASSERT(ggml_tallocr_alloc(&talloc, t) == GGML_STATUS_SUCCESS);
        }
        // weights usage makes the scheduler run each layer's expert matmuls where its slots are
        ggml_backend_buffer_set_usage(d.buf.get(), GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
        ggml_backend_buffer_clear(d.buf.get(), 0); // the null slots stay zero for good
        d.bytes = ggml_backend_buffer_get_size(d.buf.get());
    }
}

void llama_moe_cache_devices_fewest(const std::vector<llama_moe_cache_device> & devices, int64_t & slots, int64_t & slots_asked) {
    slots = slots_asked = 0;
    for (const auto & d : devices) {
        slots       = slots       ? std::min(slots, d.slots)             : d.slots;
        slots_asked = slots_asked ? std::min(slots_asked, d.slots_asked) : d.slots_asked;
    }
}

int64_t llama_moe_cache_devices_slots_of(const std::vector<llama_moe_cache_device> & devices, int i) {
    for (const auto & d : devices) {
        if (std::find(d.layers.begin(), d.layers.end(), i) != d.layers.end()) {
            return d.slots;
        }
    }
    GGML_ABORT("layer index %d is on no device of the MoE cache", i);
}

size_t llama_moe_cache_devices_bytes(const std::vector<llama_moe_cache_device> & devices) {
    size_t bytes = 0;
    for (const auto & d : devices) {
        bytes += d.bytes;
    }
    return bytes;
}

void llama_moe_cache_devices_log(const std::vector<llama_moe_cache_device> & devices, const std::vector<llama_moe_cache_layer> & layers) {
    // the background upload stream and the mailbox each serve one device
    LLAMA_LOG_INFO("llama_moe_cache: slots on %zu devices, each layer's on the device that computes it; admissions "
                   "are synchronous between decodes and the hybrid hands over through the scheduler\n", devices.size());
    for (const auto & d : devices) {
        LLAMA_LOG_INFO("llama_moe_cache: %.2f MiB on %s: %" PRId64 " slots per layer of %d experts (%.2f MiB each)\n",
                       d.bytes / MiB, llama_moe_cache_device_describe(d, layers).c_str(), d.slots,
                       layers[d.layers[0]].n_expert, layers[d.layers[0]].expert_bytes / MiB);
    }
}

void llama_moe_cache_devices_log_exit(const std::vector<llama_moe_cache_device> & devices, const std::vector<llama_moe_cache_layer> & layers) {
    for (const auto & d : devices) {
        uint64_t hits = 0, misses = 0, cpu = 0;
        for (int i : d.layers) {
            hits   += layers[i].n_hit;
            misses += layers[i].n_miss;
            cpu    += layers[i].n_cpu;
        }
        LLAMA_LOG_INFO("llama_moe_cache: %s: %" PRIu64 " hits, %" PRIu64 " misses (%" PRIu64 " computed on the CPU), "
                       "%" PRId64 " slots per layer, %.2f MiB\n", llama_moe_cache_device_describe(d, layers).c_str(),
                       hits, misses, cpu, d.slots, d.bytes / MiB);
    }
}

// "RPC0 (layers 0-2)": layers split by -sm layer are runs of consecutive layers, listed where they are not
static std::string llama_moe_cache_device_describe(const llama_moe_cache_device & d, const std::vector<llama_moe_cache_layer> & layers) {
    std::string ils;
    for (size_t k = 0; k < d.layers.size(); ) {
        size_t e = k;
        while (e + 1 < d.layers.size() && layers[d.layers[e + 1]].il == layers[d.layers[e]].il + 1) {
            e++;
        }
        ils += (ils.empty() ? "" : ",") + std::to_string(layers[d.layers[k]].il);
        if (e > k) {
            ils += "-" + std::to_string(layers[d.layers[e]].il);
        }
        k = e + 1;
    }
    return d.name + " (layers " + ils + ")";
}

std::string llama_moe_cache_devices_describe(const std::vector<llama_moe_cache_device> & devices,
                                             const std::vector<llama_moe_cache_layer> & layers) {
    std::string out;
    for (const auto & d : devices) {
        if (!d.layers.empty()) {
            out += (out.empty() ? "" : ", ") + llama_moe_cache_device_describe(d, layers);
        }
    }
    return out;
}

int32_t llama_moe_cache::get_devices(llama_moe_cache_device_status * out, int32_t n_max) const {
    std::lock_guard<std::mutex> lock(mutex);
    const int32_t n = (int32_t) devices.size();
    for (int32_t k = 0; out != nullptr && k < std::min(n, n_max); ++k) {
        const auto & d = devices[k];
        llama_moe_cache_device_status s = {};
        snprintf(s.name, sizeof(s.name), "%s", d.name.c_str());
        snprintf(s.description, sizeof(s.description), "%s", d.dev ? ggml_backend_dev_description(d.dev) : "");
        s.n_layers = (int32_t) d.layers.size();
        s.n_slots  = (int32_t) d.slots;
        s.n_bytes  = devices.size() > 1 ? d.bytes : buffer_size();
        for (int i : d.layers) {
            const auto & l = layers[i];
            s.n_slots_total += (uint64_t) l.n_slots;
            s.n_hit  += l.n_hit;
            s.n_miss += l.n_miss;
            s.n_cpu  += l.n_cpu;
        }
        out[k] = s;
    }
    return n;
}

int32_t llama_moe_cache::get_layer_device(int32_t il) const {
    for (size_t k = 0; k < devices.size(); ++k) {
        for (int i : devices[k].layers) {
            if (layers[i].il == il) {
                return (int32_t) k;
            }
        }
    }
    return -1;
}

ggml_backend_dev_t llama_moe_cache::layer_device(int i) const {
    if (devices.size() <= 1) {
        return device;
    }
    for (const auto & d : devices) {
        if (std::find(d.layers.begin(), d.layers.end(), i) != d.layers.end()) {
            return d.dev;
        }
    }
    return nullptr;
}

int32_t llama_moe_cache_get_devices(const struct llama_context * ctx, struct llama_moe_cache_device_status * devices, int32_t n_max) {
    const llama_moe_cache * cache = ctx ? ctx->get_moe_cache() : nullptr;
    return cache ? cache->get_devices(devices, n_max) : 0;
}

int32_t llama_moe_cache_get_layer_device(const struct llama_context * ctx, int32_t il) {
    const llama_moe_cache * cache = ctx ? ctx->get_moe_cache() : nullptr;
    return cache ? cache->get_layer_device(il) : -1;
}
