"""The grouped-matmul kit: what every backend's grouped matmul shares (docs/architecture.md).

The gradients of the three passes, the problem a kernel call solves, the group bounds, per-pass
tilings, quantized operands' scales, the empty-shape results, and the one registration helper.
A backend supplies its kernels, its heuristic and its tuning space; this package does the rest.
"""
