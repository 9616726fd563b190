"""The names of the grouped-matmul ops and of their optional features, shared by their
contracts (kernelhub/ops), the kit and every backend."""

GROUPED_MATMUL = "grouped_matmul"
TRANSPOSED_GROUPED_MATMUL = "transposed_grouped_matmul"

# Optional features a call may use, which an implementation must list to serve it: quantized
# operands with one scale along the contraction (per row or column), with several scale blocks
# along it, and with blocks of a length the Pallas kernels cannot step through
# (kernelhub/_grouped_matmul/contraction_scales.py).
QUANTIZED = "quantized"
QUANTIZED_BLOCKS = "quantized_blocks"
QUANTIZED_ODD_BLOCKS = "quantized_odd_blocks"
# A quantized operand with 4-bit values (int4, float4_e2m1fn): kernelhub/quantization.py.
QUANTIZED_4BIT = "quantized_4bit"
# Operands with a symbolic dimension (shape-polymorphic export): the Triton kernels cannot lower
# one (Pallas-Triton takes no symbolic size), so an unforced call exported for cuda with a
# symbolic m runs the XLA implementation there.
SYMBOLIC_SHAPES = "symbolic_shapes"
# A fused epilogue (kernelhub/_grouped_matmul/epilogue.py): a per-group bias, an activation, a
# gated unit (rhs holding gate and up columns).
BIAS = "bias"
ACTIVATION = "activation"
GLU = "glu"

# The checkpoint name (jax.ad_checkpoint.checkpoint_name) of the residual a differentiated call
# with a nonlinear epilogue keeps: its pre-activation z [m, n_rhs]. jax.checkpoint policies
# save or recompute it by this name (docs/contract.md#fused-epilogues).
PRE_ACTIVATION = "kernelhub_pre_activation"
# The registry's name for the VJP code every backend's grouped matmuls share (autodiff.py).
KIT_VJP = "kernelhub.grouped_matmul_kit"
