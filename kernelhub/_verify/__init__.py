"""Verification tools that need no accelerator: compiling the TPU kernels ahead of time with
libtpu, lowering the Triton kernels for CUDA, and compiling their Triton IR to Hopper PTX.
Used by `kernelhub verify`, `kernelhub.export` and the tests; no kernel imports them."""
