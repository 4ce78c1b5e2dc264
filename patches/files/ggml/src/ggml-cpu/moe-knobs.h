#pragma once

#include "ggml.h"

#include <stdbool.h>
#include <stdint.h>

// llama_moe's knobs of the CPU backend, read from the environment once

#ifdef __cplusplus
extern "C" {
#endif

// GGML_MMID_CHUNK: rows per chunk of one-token expert products (default 32, 0 = one slice per thread)
int ggml_mmid_chunk_rows(void);

// GGML_CPU_OP_PROFILE=1: thread 0's time per op kind, the op and the barrier after it, printed at exit
bool ggml_cpu_op_profile_on(void); // thread 0 of one graph at a time calls it
void ggml_cpu_op_profile_add(enum ggml_op op, int64_t us);

#ifdef __cplusplus
}
#endif
