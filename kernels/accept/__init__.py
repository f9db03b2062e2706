"""The accept phase of a speculative step: the target's argmax, the accepted path and the step's
bookkeeping in two Triton launches (triton_accept). Its reference is the tensor-op accept of
harness/decode/fast.py."""
