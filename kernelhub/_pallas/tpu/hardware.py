"""What the kernels need to know about the TPU they are traced for.

Tiles are chosen while tracing, before XLA knows which device will run the program, so the
target is read from the trace context: the abstract mesh's device or jax's default device (see
`jax.experimental.pallas.tpu.get_tpu_info`). On a TPU host that is the local chip; when lowering
for a TPU from another host, wrap the lowering in `jax.default_device(topology.devices[0])` (as
`kernelhub._verify.tpu_ahead_of_time` does). Without a TPU in the context the kernels assume the
`PORTABLE` profile, whose tiles fit the smallest VMEM of every supported generation.
"""

from __future__ import annotations

import dataclasses

MIB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Chip:
    """The few numbers of a TPU generation that the tiling depends on (per TensorCore)."""

    name: str
    vmem_bytes: int
    bf16_flops: float
    hbm_bytes_per_s: float
    mxu: int  # the MXU's side: tiles in multiples of it keep it full
    cores: int = 1  # TensorCores sharing one kernel (megacore v4/v5p split its parallel axes)
    int8_flops: float = 0.0  # 0: no int8 MXU (v4), so int8 tiles are widened to bf16
    int4_flops: float = 0.0  # 0: no int4 MXU, so int4 tiles are widened to int8 or bf16
    fp8_flops: float = 0.0  # the fp8 MXU's rate; above bf16's (v7x) fp8 tiles multiply as fp8

    @property
    def tile_budget_bytes(self) -> int:
        """VMEM the tiles' buffers may use; the rest is left to Mosaic's temporaries."""
        return self.vmem_bytes * 5 // 8

    @property
    def vmem_limit_bytes(self) -> int | None:
        """The scoped-VMEM limit given to Mosaic (None: its default, which is what v4 has)."""
        return None if self.vmem_bytes <= 16 * MIB else self.vmem_bytes * 3 // 4


# The scoped-VMEM default is 16 MiB on every generation up to v5p: tiles that fit it compile
# anywhere. Rates are v5e's, the slowest of the four, so the cost model stays conservative.
PORTABLE = Chip("portable", 16 * MIB, 1.97e14, 8.2e11, 128)


def chip_from_tpu_info(info) -> Chip:
    return Chip(
        name=str(info.chip_version),
        vmem_bytes=int(info.vmem_capacity_bytes),
        bf16_flops=float(info.bf16_ops_per_second),
        hbm_bytes_per_s=float(info.mem_bw_bytes_per_second),
        mxu=int(info.mxu_column_size),
        cores=int(info.num_cores),
        int8_flops=float(getattr(info, "int8_ops_per_second", 0) or 0),
        int4_flops=float(getattr(info, "int4_ops_per_second", 0) or 0),
        fp8_flops=float(getattr(info, "fp8_ops_per_second", 0) or 0),
    )


def target_chip() -> Chip:
    """The chip of the current trace context, or PORTABLE when it names no known TPU."""
    from jax.experimental.pallas import tpu as pltpu

    try:
        return chip_from_tpu_info(pltpu.get_tpu_info())
    except Exception:  # noqa: BLE001  (no TPU, an unknown kind, no backend: all mean "unknown")
        return PORTABLE


def chip_named(name: str) -> Chip:
    """The chip of a generation name as `ChipVersion` spells it ("v4", "v5e", "v5p", "v6e",
    "7x")."""
    from jax.experimental.pallas import tpu as pltpu

    try:
        version = pltpu.ChipVersion(name)
    except ValueError:
        known = ", ".join(v.value for v in pltpu.ChipVersion)
        raise ValueError(f"unknown TPU generation {name!r}; known: {known}") from None
    return chip_from_tpu_info(pltpu.get_tpu_info_for_chip(version, 1))
