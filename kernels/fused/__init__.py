"""The fused forward: Triton kernels for the target's and drafter's norm, rope and KV write
(triton_fused); the plain torch ops of harness/decode/model.py are their reference."""
