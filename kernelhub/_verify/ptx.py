"""Compiling the kernels' Triton IR to PTX for a GPU that is not here, with the `triton` package.

The Pallas lowering stops at Triton IR; XLA turns it into PTX only on a GPU host. The `triton`
package (not a kernelhub dependency; 3.6 checked) runs the same passes on any host, so CI can catch
what only the GPU compiler sees: shared memory over the limit, layouts Triton rejects, tensor-core
instructions not used, loads that did not vectorise, and (from the ptxas it ships) wgmma
instructions ptxas had to serialize. Its passes are close to XLA's, not the same.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile

HOPPER = 90
# Shared memory one block may use on an H100/H200 (227 KiB).
HOPPER_SHARED_BYTES = 232448
# wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3: the shape, then d.a.b types.
_WGMMA_TYPES = re.compile(r"wgmma\.mma_async\.sync\.aligned\.m\d+n\d+k\d+\.(\w+\.\w+\.\w+)")


@dataclasses.dataclass(frozen=True)
class PtxReport:
    shared_bytes: int
    wgmma: int  # Hopper tensor-core instructions in the PTX
    # Their accumulator and operand types, e.g. "f32.bf16.bf16", "f32.e4m3.e4m3", "s32.s8.s8".
    wgmma_types: frozenset[str]
    overlapped_wgmma: bool  # a wgmma still runs while the next step starts (MMA pipelining)
    async_copies_16b: int  # 16-byte global -> shared copies (vectorised, pipelined loads)
    scalar_loads: int  # 1- and 2-byte global loads: a load that did not vectorise
    # 1-byte stores to shared memory: an 8-bit tile transposed through registers (8-bit wgmma
    # reads both operands K-major from shared memory; an N-major tile is rewritten byte by byte)
    shared_byte_stores: int
    # From ptxas (`-v`) assembling that PTX for sm_90a, None where it could not be run: whether
    # it serialized the wgmma instructions (its "Potential Performance Loss ... serialized"
    # remark: registers of a wgmma in flight are touched, so every wgmma waits for the last),
    # and the registers per thread.
    wgmma_serialized: bool | None
    registers: int | None
    ptx: str = dataclasses.field(repr=False)


def available() -> str | None:
    """None when the triton package can compile here, else why not."""
    try:
        import triton  # noqa: F401
        from triton._C.libtriton import ir, passes  # noqa: F401
        from triton.backends.compiler import GPUTarget  # noqa: F401
    except ImportError as error:
        return f"the triton package is not installed ({error})"
    return None


def compile_to_ptx(triton_ir: str, num_warps: int, num_stages: int,
                   capability: int = HOPPER) -> PtxReport:
    """PTX for one kernel's Triton IR text, after Triton's own TTIR clean-up passes (which XLA
    also runs: among them the one folding `acc + dot(a, b)` into `dot(a, b, acc)`)."""
    import triton
    from triton._C.libtriton import ir, passes
    from triton.backends.compiler import GPUTarget

    with tempfile.TemporaryDirectory() as folder:
        raw = os.path.join(folder, "raw.ttir")
        with open(raw, "w") as file:
            file.write(triton_ir)
        context = ir.context()
        ir.load_dialects(context)
        module = ir.parse_mlir_module(raw, context)
        manager = ir.pass_manager(context)
        passes.common.add_inliner(manager)
        passes.common.add_canonicalizer(manager)
        passes.ttir.add_combine(manager)
        passes.ttir.add_reorder_broadcast(manager)
        passes.common.add_cse(manager)
        passes.common.add_symbol_dce(manager)
        manager.run(module, "kernelhub")
        cleaned = os.path.join(folder, "kernel.ttir")
        with open(cleaned, "w") as file:
            file.write(str(module))
        kernel = triton.compile(cleaned, target=GPUTarget("cuda", capability, 32),
                                options=dict(num_warps=num_warps, num_stages=num_stages))
    ptx = kernel.asm["ptx"]
    remarks = ptxas_remarks(ptx, capability)
    registers = None if remarks is None else re.search(r"Used (\d+) registers", remarks)
    return PtxReport(
        shared_bytes=int(kernel.metadata.shared),
        wgmma=ptx.count("wgmma.mma_async"),
        wgmma_types=frozenset(_WGMMA_TYPES.findall(ptx)),
        overlapped_wgmma=bool(re.search(r"wgmma\.wait_group\.sync\.aligned [1-9]", ptx)),
        async_copies_16b=len(re.findall(r"cp\.async\.cg\.shared\.global \[[^]]*\], \[[^]]*\], 0x10", ptx)),
        scalar_loads=len(re.findall(r"ld\.global(?:\.[a-z]+)*\.b(?:8|16)\b", ptx)),
        shared_byte_stores=len(re.findall(r"st\.shared\.b8\b", ptx)),
        wgmma_serialized=None if remarks is None else "instructions are serialized" in remarks,
        registers=None if registers is None else int(registers.group(1)),
        ptx=ptx,
    )


def ptxas_remarks(ptx: str, capability: int = HOPPER) -> str | None:
    """What ptxas -v says assembling `ptx` (the ptxas shipped in the triton package; Triton
    runs it too but keeps its remarks to itself), or None when it cannot be found or run."""
    import subprocess

    try:
        from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

        ptxas = get_ptxas(capability).path
        arch = sm_arch_from_capability(capability)
    except (ImportError, AttributeError, RuntimeError):
        return None
    with tempfile.TemporaryDirectory() as folder:
        source = os.path.join(folder, "kernel.ptx")
        with open(source, "w") as file:
            file.write(ptx)
        try:
            done = subprocess.run([ptxas, "-v", f"--gpu-name={arch}", source, "-o",
                                   os.path.join(folder, "kernel.cubin")],
                                  capture_output=True, text=True, check=True)
        except (OSError, subprocess.CalledProcessError):
            return None
    return done.stdout + done.stderr
