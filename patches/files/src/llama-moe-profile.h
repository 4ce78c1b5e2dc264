#pragma once

// STRP expert profiles: which (layer, expert) pairs are hottest, hottest first.
// Layout (little-endian): "STRP", u32 version (1), u32 n_layers, u32 n_expert, u32 slots (informational),
// u32 n_ranked, n_ranked x (u16 layer, u16 expert), then n_layers x n_expert x i32 ranks (not read here).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

struct llama_moe_profile {
    uint32_t n_layers = 0;
    uint32_t n_expert = 0;
    uint32_t n_slots  = 0;
    std::vector<std::pair<uint16_t, uint16_t>> ranked; // (layer, expert), hottest first
};

// Reads and validates a profile for a model of n_layers x n_expert. On any problem returns false and
// says what in err (a truncated file, a wrong magic or version, other dimensions, a pair out of range).
bool llama_moe_profile_load(const std::string & path, uint32_t n_layers, uint32_t n_expert,
                            llama_moe_profile & out, std::string & err);
