// llama_moe: the entry points that let a binding check it loaded the build it was written for.

#include "llama.h"

int32_t llama_moe_abi_version(void) {
    return LLAMA_MOE_ABI_VERSION;
}

size_t llama_moe_context_params_size(void) {
    return sizeof(struct llama_context_params);
}

size_t llama_moe_model_params_size(void) {
    return sizeof(struct llama_model_params);
}
