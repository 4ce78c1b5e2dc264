#pragma once

// The MoE cache on several devices: with the model's layers split across devices (-sm layer, -ts, RPC
// servers), each cached layer's slots live on the device that computes that layer, so that its expert matmuls
// run beside its other weights, and the byte budget (--moe-cache-mib) is per device.

#include "ggml-backend.h"
#include "ggml-cpp.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

struct llama_model;
struct llama_moe_cache_layer;
struct llama_moe_cache_report;

struct llama_moe_cache_device {
    ggml_backend_dev_t         dev  = nullptr;
    ggml_backend_buffer_type_t buft = nullptr;
    std::string                name;
    std::vector<int>           layers;          // indices into the cache's layers, in model order
    int64_t                    slots       = 0; // per layer (a layer with fewer experts holds them all)
    int64_t                    slots_asked = 0; // what the budget gives, before the device's free memory
    ggml_backend_buffer_ptr    buf;             // several devices: this device's slots and maps
    size_t                     bytes = 0;
};

// The devices that hold each layer's slots: the device of the layer's own weights (model.dev_layer) where it is
// not the CPU, else the cache's default device. LLAMA_MOE_CACHE_DEVICE keeps every layer on the default.
std::vector<llama_moe_cache_device> llama_moe_cache_devices_assign(
        const llama_model & model, const std::vector<llama_moe_cache_layer> & layers,
        ggml_backend_dev_t default_dev, ggml_backend_buffer_type_t default_buft, const std::string & default_name);

// Several devices: the slots per layer of each device from its own budget (size bytes) and free memory (fit:
// the slots that device holds, at most the slots asked). The layers of a device that cannot hold one expert
// per layer leave the cache (said); false when none is left.
using llama_moe_cache_fit_fn = std::function<int64_t(const llama_moe_cache_device & d, const std::vector<llama_moe_cache_layer> & layers,
                                                     int64_t slots_asked, size_t maps, size_t null_slots)>;
bool llama_moe_cache_devices_plan(std::vector<llama_moe_cache_device> & devices, std::vector<llama_moe_cache_layer> & layers,
                                  size_t size, bool hybrid, const llama_moe_cache_fit_fn & fit, llama_moe_cache_report & report);

// Several devices: one buffer on each for its layers' slots and maps (weights usage, zeroed); throws when a
// device cannot allocate it.
void llama_moe_cache_devices_alloc(std::vector<llama_moe_cache_device> & devices, const std::vector<llama_moe_cache_layer> & layers);

// the fewest slots per layer of any device, and of what the budgets asked (the status' n_slots, n_slots_asked)
void llama_moe_cache_devices_fewest(const std::vector<llama_moe_cache_device> & devices, int64_t & slots, int64_t & slots_asked);

// the slots per layer of the device that holds layer index i; the bytes of every device's buffer
int64_t llama_moe_cache_devices_slots_of(const std::vector<llama_moe_cache_device> & devices, int i);
size_t  llama_moe_cache_devices_bytes(const std::vector<llama_moe_cache_device> & devices);

// one log line per device: its layers, slots and bytes
void llama_moe_cache_devices_log(const std::vector<llama_moe_cache_device> & devices, const std::vector<llama_moe_cache_layer> & layers);

// at exit, one line per device: its layers' hits and misses
void llama_moe_cache_devices_log_exit(const std::vector<llama_moe_cache_device> & devices, const std::vector<llama_moe_cache_layer> & layers);

// "RPC0 (layers 0-2)" for each device, ", " between them
std::string llama_moe_cache_devices_describe(const std::vector<llama_moe_cache_device> & devices,
                                             const std::vector<llama_moe_cache_layer> & layers);
