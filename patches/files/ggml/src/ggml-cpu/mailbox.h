#pragma once

#include "ggml-cpu-impl.h"
#include "ggml-mailbox.h"

// the CPU backend's side of ggml-mailbox.h: the llama_moe cache's test mode, with the CPU as the device

#ifdef __cplusplus
extern "C" {
#endif

// GGML_OP_MAILBOX: a send, a recv or a recv that also weights and sums the rows; one thread
void ggml_compute_forward_mailbox(const struct ggml_compute_params * params, struct ggml_tensor * dst);

// MUL_MAT_ID's rows whose ids, from host_first on, select the host copy of the experts (ggml_mailbox_set_host_experts):
// after the other rows, each thread a slice of the expert's rows, with src1 in the work buffer as MUL_MAT_ID left it
void ggml_compute_forward_mul_mat_id_host(const struct ggml_compute_params * params, struct ggml_tensor * dst,
                                          const char * host_exps, int32_t host_first);

#ifdef __cplusplus
}
#endif
