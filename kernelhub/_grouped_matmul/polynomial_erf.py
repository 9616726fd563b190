"""erf written with the operations every GPU kernel language here lowers (mul, add, div, exp,
abs, min, select), for the GPU kernels' epilogues: `Epilogue.activate(..., erf=erf)`
(kernelhub/_grouped_matmul/epilogue.py). Pallas-Triton lowers no lax.erf_p, and Mosaic GPU
(jax 0.10.2) lowers it but has no layout inference rule for it, so a kernel using lax.erf does
not export for cuda."""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Two pieces fitted to float64 erf by least squares for kernelhub: below ERF_SPLIT,
# erf(x) = x * P(x**2); above it, erf(x) = 1 - exp(-x**2) * Q(t) with t = 1 / (1 + x / 2) (the
# form of Abramowitz & Stegun 7.1.26, with more terms), x clamped at 4 (past which float32 erf is 1). Evaluated in float32
# its largest error over [-6, 6] (in steps of 6e-6) is 1.3e-7; lax.erf's own on a CPU is 3.1e-7.
ERF_SPLIT = 0.75
_ERF_SMALL = (1.1283792, -0.37612638, 0.11283781, -0.026864909, 0.005217222, -8.3634007e-04,
              9.5072603e-05)
_ERF_LARGE = (-1.810804e-04, 0.2853561, 0.25652289, 0.36056355, -0.13542368, 0.61349374,
              -0.52025825, 0.14646345, -0.0064948248)
_ERF_CLAMP = 4.0


def _horner(coefficients: tuple[float, ...], x: jax.Array) -> jax.Array:
    """sum(c_i * x**i) for the coefficients c_0, c_1, ..."""
    value = jnp.full_like(x, coefficients[-1])
    for coefficient in coefficients[-2::-1]:
        value = value * x + coefficient
    return value


def erf(x: jax.Array) -> jax.Array:
    """The float32 error function of `x`, elementwise."""
    x = x.astype(jnp.float32)
    size = jnp.abs(x)
    small = x * _horner(_ERF_SMALL, x * x)
    clamped = jnp.minimum(size, _ERF_CLAMP)
    t = 1.0 / (1.0 + 0.5 * clamped)
    large = 1.0 - jnp.exp(-(clamped * clamped)) * _horner(_ERF_LARGE, t)
    return jnp.where(size < ERF_SPLIT, small, jnp.where(x < 0, -large, large))
