"""Draft-tree kernels: the Triton top-k (triton_topk) and the GPU tree build in Triton
(triton_tree_build) and CUDA C++ (cuda_tree_build + tree_build.cu). Their reference is the CPU
heap of harness/decode/tree.py, and harness/decode/tree_gpu.py's torch build."""
