// What llama_moe's patch series adds to include/llama.h, as cffi declarations.

int32_t llama_moe_abi_version(void);
size_t  llama_moe_context_params_size(void);
size_t  llama_moe_model_params_size(void);
