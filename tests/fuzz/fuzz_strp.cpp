// libFuzzer harness for the native STRP profile loader (patches/files/src/llama-moe-profile.cpp).
// clang++ -g -O1 -fsanitize=fuzzer,address,undefined -I patches/files/src tests/fuzz/fuzz_strp.cpp patches/files/src/llama-moe-profile.cpp

#include "llama-moe-profile.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <unistd.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    static const std::string path = "/tmp/fuzz_strp_" + std::to_string(getpid()) + ".strp";
    FILE * f = fopen(path.c_str(), "wb");
    if (!f) {
        return 0;
    }
    fwrite(data, 1, size, f);
    fclose(f);

    llama_moe_profile profile;
    std::string err;
    // the tiny model's geometry, and the geometry the file claims (bounded like a real model's)
    llama_moe_profile_load(path, 6, 32, profile, err);
    if (size >= 16) {
        uint32_t layers, experts;
        memcpy(&layers, data + 8, 4);
        memcpy(&experts, data + 12, 4);
        if (layers > 0 && layers <= 256 && experts > 0 && experts <= 1024) {
            if (llama_moe_profile_load(path, layers, experts, profile, err)) {
                for (const auto & [il, ie] : profile.ranked) {
                    if (il >= layers || ie >= experts) {
                        __builtin_trap(); // the loader promised every pair is in range
                    }
                }
                if (!profile.layer_slots.empty() && profile.layer_slots.size() != layers) {
                    __builtin_trap(); // a slot section has a count for every layer
                }
            }
        }
    }
    return 0;
}
