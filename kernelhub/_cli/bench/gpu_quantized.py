"""The quantized rows of `kernelhub bench --gpu`: gmm forward on 8-bit, MX and 4-bit operands.

At each benchmark shape (balanced group sizes), the Triton gmm on e4m3 x e4m3 and int8 x int8
operands with one scale per row of lhs and per column of each expert's weights, which Hopper
multiplies on its 8-bit wgmma (docs/gpu.md). Beside it, on the same rows and one expert's
weights: cuBLAS dense bf16 (the floor of the unquantized gmm) and the dense product of the same
8-bit values (fp8 x fp8 -> float32, which XLA sends to cuBLASLt's fp8 matmul on a Hopper; int8 x
int8 -> int32), scaled per row and column and cast to bf16 like kernelhub's result.

Each format runs twice: weights [G, k, n] (N-major; Hopper's 8-bit wgmma reads operands K-major
only, so their tiles are transposed through registers) and [G, n, k] with transpose_rhs
(K-major: straight from memory to the tensor cores). The e4m3 format runs a third time with
DeepSeek-style scale blocks of 128 along k, scaled inside the kernel; its dense 8-bit floor is
the per-channel one (cuBLAS has no block-scaled matmul here). Then MXFP8 x MXFP8 (e8m0 scales
per 32 along k) beside the same per-channel fp8 floor, and 4-bit weights under bf16 activations
(w4a16: int4 in blocks of 128, and MXFP4) beside dense bf16 only. On a Hopper GPU the Mosaic GPU
gmm (forced) runs every format as a peer too: which of the two kernels a table should name for
such calls. Quantization itself is not timed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import kernelhub
from kernelhub._cli._group_sizes import group_sizes
from kernelhub._cli.bench.gpu_measurement import Measurement, Shape, relative_error
from kernelhub._cli.bench.timing import median_seconds

PATTERN = "balanced"  # group skew is the main table's subject; this one compares formats


@dataclasses.dataclass(frozen=True)
class Format:
    name: str
    dtype: Any  # the weights' values: a dtype, or a named format ("mxfp8", "mxfp4", ...)
    transpose_rhs: bool  # weights [G, n, k]: K-major, as 8-bit wgmma reads them
    block_size: int | None = None  # scale blocks along k (None: one scale per row / column)
    quantized_lhs: bool = True  # False: bf16 activations against quantized weights (w4a16)
    # The dense 8-bit floor's values, one scale per row and column (None: no such floor).
    floor_dtype: Any = "same"

    @property
    def dense_8bit_dtype(self) -> Any:
        return self.dtype if self.floor_dtype == "same" else self.floor_dtype


FORMATS = (
    Format("e4m3 x e4m3", jnp.float8_e4m3fn, False),
    Format("e4m3 x e4m3, K-major weights", jnp.float8_e4m3fn, True),
    Format("int8 x int8", jnp.int8, False),
    Format("int8 x int8, K-major weights", jnp.int8, True),
    Format("e4m3 x e4m3, 128-blocks, K-major weights", jnp.float8_e4m3fn, True, 128),
    # OCP MXFP8 (e8m0 scales over blocks of 32 along k) against per-channel fp8.
    Format("mxfp8 x mxfp8, K-major weights", "mxfp8", True, floor_dtype=jnp.float8_e4m3fn),
    # 4-bit weights for serving (w4a16): against the bf16 gmm's floor only.
    Format("bf16 x int4 (blocks of 128), K-major weights", jnp.int4, True, 128,
           quantized_lhs=False, floor_dtype=None),
    Format("bf16 x mxfp4, K-major weights", "mxfp4", True, quantized_lhs=False,
           floor_dtype=None),
)


class QuantizedMeasurement(Measurement):
    """A main-table measurement whose pass is gmm forward on one 8-bit format (`format`, kept
    in `pass_name`); max_relative_error is against the xla implementation of the same call."""

    PEERS = {"mosaic": 2, "dense bf16": 2, "dense 8-bit": 2}

    @property
    def format(self) -> str:
        return self.pass_name


def measure_quantized(shape: Shape, reps: int, warmup: int,
                      formats: Sequence[Format] = FORMATS) -> list[QuantizedMeasurement]:
    sizes = jnp.asarray(group_sizes(shape.m, shape.experts, PATTERN))
    first_row = int(sizes[: shape.offset].sum())
    rows = slice(first_row, first_row + int(sizes[shape.offset: shape.offset + shape.local].sum()))
    keys = jax.random.split(jax.random.key(1), 2)
    x = jax.random.normal(keys[0], (shape.m, shape.k), jnp.bfloat16)
    w = jax.random.normal(keys[1], (shape.local, shape.k, shape.n), jnp.bfloat16) / float(np.sqrt(shape.k))
    dense_bf16 = jax.jit(lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.bfloat16))
    dense_8bit = jax.jit(_dense_8bit, static_argnums=4)
    x_rows, w_first = x[rows], w[0]
    results = []
    for form in formats:
        weights = jnp.swapaxes(w, 1, 2) if form.transpose_rhs else w
        rhs_axis = 2 if form.transpose_rhs else 1
        x8 = (kernelhub.quantize(x, form.dtype, axis=1, block_size=form.block_size)
              if form.quantized_lhs else x)
        w8 = kernelhub.quantize(weights, form.dtype, axis=rhs_axis, block_size=form.block_size)
        ours = _gmm(kernelhub.get("grouped_matmul", platform="triton"), shape, form)
        fns = {"kernelhub": lambda f=ours, x8=x8, w8=w8: f(x8, w8, sizes),
               "dense bf16": lambda: dense_bf16(x_rows, w_first)}
        if _on_hopper():
            mosaic = _gmm(kernelhub.get("grouped_matmul", platform="mosaic"), shape, form)
            fns["mosaic"] = lambda f=mosaic, x8=x8, w8=w8: f(x8, w8, sizes)
        if form.dense_8bit_dtype is not None:
            # The dense 8-bit product's operands (per channel): the computed rows, the first
            # expert.
            x_floor = kernelhub.quantize(x, form.dense_8bit_dtype, axis=1)
            w_floor = kernelhub.quantize(weights, form.dense_8bit_dtype, axis=rhs_axis)
            dense_args = (x_floor.values[rows], w_floor.values[0], x_floor.scale[rows, 0],
                          jnp.squeeze(w_floor.scale[0], 1 if form.transpose_rhs else 0),
                          form.transpose_rhs)
            fns["dense 8-bit"] = lambda args=dense_args: dense_8bit(*args)
        seconds = median_seconds(fns, reps, warmup)
        error = None
        if seconds["kernelhub"] is not None:
            xla = _gmm(kernelhub.get("grouped_matmul", platform="xla"), shape, form)
            error = relative_error(fns["kernelhub"]()[rows], xla(x8, w8, sizes)[rows])
        flops = 2.0 * (rows.stop - rows.start) * shape.k * shape.n
        results.append(QuantizedMeasurement(shape, PATTERN, form.name, flops, seconds, error))
    return results


def _on_hopper() -> bool:
    """Whether the Mosaic GPU kernels run compiled here (elsewhere they are not timed)."""
    return any(spec.platform.value == "mosaic" and spec.backend.value == "gpu" and spec.available
               for spec in kernelhub.implementations("grouped_matmul"))


def _gmm(gmm, shape: Shape, form: Format):
    return jax.jit(lambda x8, w8, s: gmm(x8, w8, s, preferred_element_type=jnp.bfloat16,
                                         group_offset=shape.offset,
                                         transpose_rhs=form.transpose_rhs))


def _dense_8bit(x, w, x_scale, w_scale, transpose_rhs: bool) -> jax.Array:
    """The same product as one dense 8-bit matmul: int8 summed in int32, fp8 in float32."""
    total = jnp.int32 if x.dtype == jnp.int8 else jnp.float32
    dims = (((1,), (1 if transpose_rhs else 0,)), ((), ()))
    product = lax.dot_general(x, w, dims, preferred_element_type=total).astype(jnp.float32)
    return (product * x_scale[:, None] * w_scale[None, :]).astype(jnp.bfloat16)


def one_line(m: QuantizedMeasurement) -> str:
    return m.one_line(f"{m.format:29s}")


def markdown_lines(measurements: list[QuantizedMeasurement]) -> list[str]:
    lines = ["## Quantized gmm forward", "",
             f"{PATTERN} group sizes, bf16 output. kernelhub: the Triton gmm; mosaic: the Mosaic "
             "GPU gmm, forced (Hopper only); dense bf16: jnp.dot on the same rows and one "
             "expert's weights (cuBLAS); dense 8-bit: the same 8-bit values as one matmul (fp8: "
             "cuBLASLt fp8 on Hopper; int8: int32 sums), scaled and cast to bf16. Error: "
             "kernelhub's against the xla implementation of the same call.", "",
             "| shape | format | kernelhub | mosaic | dense bf16 | dense 8-bit | vs mosaic "
             "| vs dense bf16 | vs dense 8-bit | max rel. error vs xla |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    return lines + [m.markdown_row(m.format) for m in measurements] + [""]


def as_record(m: QuantizedMeasurement) -> dict[str, Any]:
    return m.record("format")
