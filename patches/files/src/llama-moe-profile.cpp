#include "llama-moe-profile.h"

#include <cstdio>
#include <cstring>
#include <memory>

static constexpr uint32_t LLAMA_MOE_PROFILE_VERSION = 1;
static constexpr size_t   LLAMA_MOE_PROFILE_HEADER  = 24;
static constexpr uint32_t LLAMA_MOE_PROFILE_SLOTS_VERSION = 1;
static constexpr size_t   LLAMA_MOE_PROFILE_SLOTS_HEADER  = 12; // "SLOT", u32 version, u32 n_layers

static uint32_t read_u32(const uint8_t * p) {
    return (uint32_t) p[0] | ((uint32_t) p[1] << 8) | ((uint32_t) p[2] << 16) | ((uint32_t) p[3] << 24);
}

static uint16_t read_u16(const uint8_t * p) {
    return (uint16_t) (p[0] | (p[1] << 8));
}

// The optional per-layer slot section after the ranks (a file that ends before it has none). Anything there must
// be a whole section this build reads: a profile whose counts were lost would size the cache other than planned.
static bool llama_moe_profile_read_slots(FILE * f, uint64_t at, uint64_t size, uint32_t n_layers, llama_moe_profile & out,
                                         std::string & err) {
    uint8_t hdr[LLAMA_MOE_PROFILE_SLOTS_HEADER];
    const uint64_t left = size - at;
    if (fseek(f, (long) at, SEEK_SET) != 0 || left < 4 || fread(hdr, 1, 4, f) != 4 || memcmp(hdr, "SLOT", 4) != 0) {
        err = std::to_string(left) + " bytes after the ranks that are not a per-layer slot section (magic SLOT)";
        return false;
    }
    if (left < sizeof(hdr) || fread(hdr + 4, 1, sizeof(hdr) - 4, f) != sizeof(hdr) - 4) {
        err = "the per-layer slot section is truncated: " + std::to_string(left) + " bytes, shorter than its 12-byte header";
        return false;
    }
    const uint32_t version = read_u32(hdr + 4);
    const uint32_t layers  = read_u32(hdr + 8);
    if (version != LLAMA_MOE_PROFILE_SLOTS_VERSION) {
        err = "per-layer slot section version " + std::to_string(version) + ", this build reads version " +
              std::to_string(LLAMA_MOE_PROFILE_SLOTS_VERSION);
        return false;
    }
    if (layers != n_layers) {
        err = "the per-layer slot section has " + std::to_string(layers) + " layers, the profile " + std::to_string(n_layers);
        return false;
    }
    if (left != sizeof(hdr) + (uint64_t) layers * 4) {
        err = "the per-layer slot section should be " + std::to_string(sizeof(hdr) + (uint64_t) layers * 4) +
              " bytes for " + std::to_string(layers) + " layers, it is " + std::to_string(left);
        return false;
    }
    std::vector<uint8_t> counts((size_t) layers * 4);
    if (fread(counts.data(), 1, counts.size(), f) != counts.size()) {
        err = "the per-layer slot section is truncated";
        return false;
    }
    out.layer_slots.resize(layers);
    for (uint32_t il = 0; il < layers; ++il) {
        out.layer_slots[il] = read_u32(&counts[4*il]);
    }
    return true;
}

bool llama_moe_profile_load(const std::string & path, uint32_t n_layers, uint32_t n_expert,
                            llama_moe_profile & out, std::string & err) {
    std::unique_ptr<FILE, int (*)(FILE *)> f(fopen(path.c_str(), "rb"), fclose);
    if (!f) {
        err = "cannot open it: " + std::string(strerror(errno));
        return false;
    }
    uint8_t hdr[LLAMA_MOE_PROFILE_HEADER];
    const size_t got = fread(hdr, 1, sizeof(hdr), f.get());
    if (got < 4 || memcmp(hdr, "STRP", 4) != 0) {
        err = "not a profile (the magic is not STRP)";
        return false;
    }
    if (got < sizeof(hdr)) {
        err = "truncated: " + std::to_string(got) + " bytes, shorter than the 24-byte header";
        return false;
    }
    const uint32_t version  = read_u32(hdr + 4);
    const uint32_t layers   = read_u32(hdr + 8);
    const uint32_t experts  = read_u32(hdr + 12);
    const uint32_t slots    = read_u32(hdr + 16);
    const uint32_t n_ranked = read_u32(hdr + 20);
    if (version != LLAMA_MOE_PROFILE_VERSION) {
        err = "version " + std::to_string(version) + ", this build reads version " + std::to_string(LLAMA_MOE_PROFILE_VERSION);
        return false;
    }
    if (layers != n_layers || experts != n_expert) {
        err = "made for " + std::to_string(layers) + " layers x " + std::to_string(experts) + " experts, but the model has " +
              std::to_string(n_layers) + " x " + std::to_string(n_expert);
        return false;
    }
    if ((uint64_t) n_ranked > (uint64_t) layers * experts) {
        err = "n_ranked is " + std::to_string(n_ranked) + ", more than n_layers x n_expert = " +
              std::to_string((uint64_t) layers * experts);
        return false;
    }
    // check the size before allocating: a damaged count must not become a huge allocation
    if (fseek(f.get(), 0, SEEK_END) != 0) {
        err = "cannot seek in it";
        return false;
    }
    const long size = ftell(f.get());
    if (size < 0 || (uint64_t) size < LLAMA_MOE_PROFILE_HEADER + (uint64_t) n_ranked * 4 || fseek(f.get(), LLAMA_MOE_PROFILE_HEADER, SEEK_SET) != 0) {
        err = "truncated: the header promises " + std::to_string(n_ranked) + " ranked pairs, the file holds fewer";
        return false;
    }
    std::vector<uint8_t> pairs((size_t) n_ranked * 4);
    if (fread(pairs.data(), 1, pairs.size(), f.get()) != pairs.size()) {
        err = "truncated: the header promises " + std::to_string(n_ranked) + " ranked pairs, the file holds fewer";
        return false;
    }
    out.n_layers = layers;
    out.n_expert = experts;
    out.n_slots  = slots;
    out.ranked.clear();
    out.ranked.reserve(n_ranked);
    for (uint32_t i = 0; i < n_ranked; ++i) {
        const uint16_t il = read_u16(&pairs[4*i]);
        const uint16_t ie = read_u16(&pairs[4*i + 2]);
        if (il >= layers || ie >= experts) {
            err = "pair " + std::to_string(i) + " is (layer " + std::to_string(il) + ", expert " + std::to_string(ie) +
                  "), out of range for " + std::to_string(layers) + " x " + std::to_string(experts);
            out.ranked.clear();
            return false;
        }
        out.ranked.emplace_back(il, ie);
    }
    out.layer_slots.clear();
    const uint64_t ranks_end = LLAMA_MOE_PROFILE_HEADER + (uint64_t) n_ranked * 4 + (uint64_t) layers * experts * 4;
    if ((uint64_t) size > ranks_end && !llama_moe_profile_read_slots(f.get(), ranks_end, (uint64_t) size, layers, out, err)) {
        out.ranked.clear();
        return false;
    }
    return true;
}
