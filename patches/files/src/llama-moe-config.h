#pragma once

// llama_moe's environment variables, read in one place and strictly: a value that is not what the variable
// takes is replaced by the default with a warning that names the variable, the value and what is used.

#include <cstdint>

// unset (or empty): def; else the whole value must be a decimal integer from lo to hi
int64_t llama_moe_env_int(const char * name, int64_t def, int64_t lo, int64_t hi);

// unset (or empty): def; else 1/0, true/false, on/off or yes/no (any case)
bool llama_moe_env_flag(const char * name, bool def);

// unset (or empty): def; else the whole value must be a number from lo to hi
float llama_moe_env_float(const char * name, float def, float lo, float hi);

// the raw value, nullptr when unset or empty
const char * llama_moe_env_str(const char * name);
