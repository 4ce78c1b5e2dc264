// What llama_moe's patch series declares in common/llama-moe-json-schema.h, as cffi declarations: a function of
// libllama-common (the manifest's "common_library"), not of libllama.

int32_t llama_moe_json_schema_to_grammar(const char * schema, char * buf, int32_t buf_size, char * err, int32_t err_size);
