#pragma once

// STRP expert profiles: which (layer, expert) pairs are hottest, hottest first.
// Layout (little-endian): "STRP", u32 version (1), u32 n_layers, u32 n_expert, u32 slots (informational),
// u32 n_ranked, n_ranked x (u16 layer, u16 expert), then n_layers x n_expert x i32 ranks (not read here),
// then optionally the per-layer slot counts: "SLOT", u32 section version (1), u32 n_layers, n_layers x u32 slots
// (0: no count for that layer). A file that ends after the ranks has none, as every profile of version 1 did.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

struct llama_moe_profile {
    uint32_t n_layers = 0;
    uint32_t n_expert = 0;
    uint32_t n_slots  = 0;
    std::vector<std::pair<uint16_t, uint16_t>> ranked; // (layer, expert), hottest first
    std::vector<uint32_t> layer_slots;                  // layer -> slots, empty without the section
};

// Reads and validates a profile for a model of n_layers x n_expert. On any problem returns false and
// says what in err (a truncated file, a wrong magic or version, other dimensions, a pair out of range, bytes after
// the ranks that are not a slot section this build reads).
bool llama_moe_profile_load(const std::string & path, uint32_t n_layers, uint32_t n_expert,
                            llama_moe_profile & out, std::string & err);
