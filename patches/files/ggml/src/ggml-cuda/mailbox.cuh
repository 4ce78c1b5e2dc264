#include "common.cuh"

// GGML_OP_MAILBOX (ggml-mailbox.h): the device's side of a hand-over to CPU threads through host memory
void ggml_cuda_op_mailbox(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
