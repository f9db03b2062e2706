"""Tree-verify attention: the custom CUDA kernel (custom_verify + verify_attention.cu), the
Triton kernel (triton_verify) and the reference they are checked against (verify_reference)."""
