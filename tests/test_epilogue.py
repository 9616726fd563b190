"""grouped_matmul's fused epilogues (bias, activation, glu, glu_layout) on every implementation
that runs here, against the float64 reference (tests/reference.py): forward, gradients for lhs,
rhs and bias, the rows no local group computes, and the checks of bad epilogue arguments.

Each case is one jitted forward and VJP, so one compilation, which is most of a case's time:
XLA compiles it with its backend optimizations off (the numbers are under test here, not the
speed; it halves the time). The epilogue's math is defined once (kernelhub/_grouped_matmul/
epilogue.py) and each backend applies it to its tile, so the cases are a covering set, not a
cross product: every implementation runs bias alone, a named activation, each gated unit,
both layouts, an epilogue without a bias, swiglu_oai's clamps, int8 and fp8 rhs, group_offset,
existing_out, transpose_rhs, bfloat16, vmap and k == 0, each with gradients; every named
activation and a callable run somewhere, XLA taking the ones left over. `pytest --quick` runs
three cases on each implementation (bias alone, a gated unit, the rows' placement), the empty
contraction and the argument checks.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernelhub
import reference
from conftest import (assert_close, call, dequantized, quantized_operand,
                      runnable_implementations)
from kernelhub._core import dispatch as _dispatch
from kernelhub._core import registry as _registry

GMM = "grouped_matmul"
# XLA's CPU backend at optimization level 0: about half the compile time of the default.
QUICK_COMPILE = {"xla_backend_optimization_level": 0} if jax.default_backend() == "cpu" else None

# A user's callable, and its numpy twin for the reference (derivative by central differences).
LAMBDA = "lambda"
user_activation = lambda x: x * jnp.tanh(x)  # noqa: E731
user_activation_numpy = lambda x: x * np.tanh(x)  # noqa: E731


@dataclasses.dataclass(frozen=True)
class Case:
    """One grouped_matmul call: an epilogue and the problem it runs on.

    The rhs is drawn with a spread of `scale` / sqrt(k), so the sums z have a spread of about
    `scale`: around 1.5 the activations' curved parts, at 5 the gated units' clamps at +-7."""

    activation: str | None = None  # a name, LAMBDA, or None
    glu: str | None = None
    glu_layout: str = "concatenated"
    bias: bool = True
    m: int = 56
    k: int = 24
    n: int = 16  # the output's columns (rhs holds 2n with glu)
    sizes: tuple[int, ...] = (9, 0, 20, 14)  # 43 of 56 rows, one empty group
    local_groups: int | None = None  # all groups from group_offset on
    group_offset: int = 0
    existing: bool = False
    transpose_rhs: bool = False
    dtype: Any = jnp.float32  # lhs, rhs (before quantization) and bias
    out_dtype: Any = jnp.float32
    quantized: Any = None  # rhs as a QuantizedArray of this dtype
    scale: float = 1.5
    seed: int = 0

    @property
    def label(self) -> str:
        parts = [f"glu={self.glu}-{self.glu_layout}" if self.glu else
                 f"activation={self.activation}", "bias" if self.bias else "no_bias"]
        if self.group_offset:
            parts.append(f"offset={self.group_offset}")
        for flag in ("existing", "transpose_rhs"):
            if getattr(self, flag):
                parts.append(flag)
        if self.quantized is not None:
            parts.append(f"rhs={jnp.dtype(self.quantized).name}")
        if jnp.dtype(self.dtype) != jnp.float32 or jnp.dtype(self.out_dtype) != jnp.float32:
            parts.append(f"{jnp.dtype(self.dtype).name}->{jnp.dtype(self.out_dtype).name}")
        if self.k == 0:
            parts.append("k=0")
        return "-".join(parts)

    @property
    def rhs_columns(self) -> int:
        return 2 * self.n if self.glu else self.n

    @property
    def locals(self) -> int:
        return self.local_groups or len(self.sizes) - self.group_offset

    def options(self) -> dict[str, Any]:
        """The epilogue's static arguments as kernelhub takes them."""
        activation = user_activation if self.activation == LAMBDA else self.activation
        return dict(activation=activation, glu=self.glu, glu_layout=self.glu_layout,
                    transpose_rhs=self.transpose_rhs, preferred_element_type=self.out_dtype)

    def reference_options(self) -> dict[str, Any]:
        activation = user_activation_numpy if self.activation == LAMBDA else self.activation
        return dict(activation=activation, glu=self.glu, glu_layout=self.glu_layout)


def matrix(full: list[Case], interpreted: list[Case], quick: list[Case] = ()) -> list:
    """(spec, case) params: `full` on compiled implementations, `interpreted` on interpret-mode
    ones; all but the `quick` cases marked slow, so `pytest --quick` leaves them out."""
    return [pytest.param(spec, case, id=f"{spec.platform.value}-{spec.backend.value}-{case.label}",
                         marks=() if case in quick else pytest.mark.slow)
            for spec in runnable_implementations(GMM)
            for case in (interpreted if spec.interpret_only else full)]


def draw(rng: np.random.Generator, shape, dtype, scale: float = 1.0) -> jax.Array:
    """Normal values of spread `scale`, rounded to `dtype` before the reference sees them."""
    return jnp.asarray(rng.standard_normal(shape) * scale, dtype)


def computed_rows(sizes, offset: int, local_groups: int, m: int) -> np.ndarray:
    computed = np.zeros(m, bool)
    for g, (start, end) in enumerate(reference.group_rows(sizes, m)):
        computed[start:end] = offset <= g < offset + local_groups
    return computed


def arrays(case: Case) -> dict[str, Any]:
    rng = np.random.default_rng(case.seed)
    m, k, n_rhs, groups = case.m, case.k, case.rhs_columns, case.locals
    rhs_shape = (groups, n_rhs, k) if case.transpose_rhs else (groups, k, n_rhs)
    rhs_dtype = jnp.float32 if case.quantized is not None else case.dtype
    return dict(
        lhs=draw(rng, (m, k), case.dtype),
        rhs=draw(rng, rhs_shape, rhs_dtype, case.scale / math.sqrt(max(k, 1))),
        bias=draw(rng, (groups, n_rhs), case.dtype, 0.5 * case.scale) if case.bias else None,
        existing=draw(rng, (m, case.n), case.out_dtype) if case.existing else None,
        d_out=draw(rng, (m, case.n), case.out_dtype),
        sizes=jnp.asarray(case.sizes, jnp.int32))


def forward_and_vjp(spec, case: Case):
    """A function of (lhs, rhs, bias, existing, sizes, offset, d_out) giving the output and the
    cotangents of (lhs, rhs, bias, existing), rhs quantized inside it (straight-through) when
    the case says so."""
    gmm, options = call(spec), case.options()

    def run(lhs, rhs, bias, existing, sizes, offset, d_out):
        def f(lhs, rhs, bias, existing):
            if case.quantized is not None:
                rhs = kernelhub.quantize(rhs, case.quantized, axis=2 if case.transpose_rhs else 1)
            return gmm(lhs, rhs, sizes, group_offset=offset, existing_out=existing, bias=bias,
                       **options)

        out, vjp = jax.vjp(f, lhs, rhs, bias, existing)
        return out, vjp(d_out)

    return run


def check(spec, case: Case, jit: bool = True) -> None:
    """The case's output and cotangents against the reference's, called under jit (group sizes
    and group_offset traced) or eagerly."""
    a = arrays(case)
    run = forward_and_vjp(spec, case)
    if jit:
        run = jax.jit(run, compiler_options=QUICK_COMPILE)
    out, (d_lhs, d_rhs, d_bias, d_existing) = run(
        a["lhs"], a["rhs"], a["bias"], a["existing"], a["sizes"],
        jnp.int32(case.group_offset) if jit else case.group_offset, a["d_out"])

    rhs = a["rhs"]
    if case.quantized is not None:
        axis = 2 if case.transpose_rhs else 1
        rhs = dequantized(quantized_operand(rhs, case.quantized, axis=axis))
    sizes, offset = np.asarray(case.sizes), case.group_offset
    common = dict(group_offset=offset, transpose_rhs=case.transpose_rhs, bias=a["bias"],
                  **case.reference_options())
    want = reference.gmm(a["lhs"], rhs, sizes, existing_out=a["existing"], **common)
    grads = reference.gmm_epilogue_vjp(a["lhs"], rhs, sizes, a["d_out"],
                                       has_existing=case.existing, **common)

    assert out.dtype == jnp.dtype(case.out_dtype), out.dtype
    assert_close(out, want, case.out_dtype, contraction=case.k)
    # Rows no local group computes: exactly 0, or exactly existing_out's.
    kept = ~computed_rows(sizes, offset, case.locals, case.m)
    base = np.zeros(out.shape) if a["existing"] is None else np.asarray(a["existing"], np.float64)
    np.testing.assert_array_equal(np.asarray(out, np.float64)[kept], base[kept])

    assert d_lhs.dtype == a["lhs"].dtype and d_rhs.dtype == a["rhs"].dtype
    assert_close(d_lhs, grads["lhs"], d_lhs.dtype, contraction=case.rhs_columns)
    assert_close(d_rhs, grads["rhs"], d_rhs.dtype, contraction=case.m)
    if case.bias:
        assert d_bias.dtype == a["bias"].dtype
        assert_close(d_bias, grads["bias"], d_bias.dtype, contraction=case.m)
        bounds = reference.group_rows(sizes, case.m)
        for j in range(case.locals):
            start, end = bounds[offset + j]
            if start == end:  # a group without rows: exactly 0
                np.testing.assert_array_equal(np.asarray(d_bias[j], np.float64), 0.0)
    else:
        assert d_bias is None
    if case.existing:
        np.testing.assert_array_equal(np.asarray(d_existing, np.float64), grads["existing_out"])


# ------------------------------------------------------------------ activations and bias

# Bias alone (None) on every implementation; XLA adds a callable and gelu, without a bias. Each
# other activation runs once below, with gradients: gelu_tanh with a bias in test_quantized_rhs
# and sigmoid at k == 0 (every implementation); tanh and identity at k == 0, relu in
# test_offset_existing_out_transpose_and_empty_groups and silu in
# test_float32_operands_keep_float32_gradients_under_a_bfloat16_output (XLA). The kernels apply
# a callable and a name through the same Epilogue.activate, so the interpreters take a named
# one; an epilogue without a bias is their test_bfloat16 case, and gelu's erf (the GPU kernels'
# polynomial) their gated gelu in test_offset_existing_out_transpose_and_empty_groups.
ACTIVATIONS = [Case(activation=None, bias=True), Case(activation=LAMBDA, bias=False),
               Case(activation="gelu", bias=False)]
ACTIVATIONS_INTERPRETED = ACTIVATIONS[:1]


@pytest.mark.parametrize("spec, case", matrix(ACTIVATIONS, ACTIVATIONS_INTERPRETED,
                                              ACTIVATIONS_INTERPRETED))
def test_activation_and_bias(spec, case):
    check(spec, case)


# ------------------------------------------------------------------ gated units

# The concatenated layout with a bias (the kernels lay the bias out in their accumulator's
# order, the gate and up tiles side by side), through swiglu_oai's clamps at +-7 (sums of spread
# 5). The interleaved layout runs below on every implementation, with a bias (gelu in
# test_offset_existing_out_..., silu under vmap, swiglu_oai at k == 0) and without one (gelu_tanh
# in bfloat16): each gated unit once, the layout picking the halves whatever the unit.
GLUS = [Case(glu="swiglu_oai", bias=True, scale=5.0)]
GLUS_INTERPRETED = GLUS


@pytest.mark.parametrize("spec, case", matrix(GLUS, GLUS_INTERPRETED, GLUS_INTERPRETED))
def test_gated_unit(spec, case):
    check(spec, case)


# ------------------------------------------------------------------ quantized rhs

# The scales apply to the sums before the bias: the reference takes the dequantized values.
# An int8 rhs is test_vmap_over_a_batch_of_lhs's (the same check, batched).
QUANTIZED = [Case(activation="gelu_tanh", quantized=jnp.float8_e4m3fn, dtype=jnp.bfloat16,
                  out_dtype=jnp.float32, seed=1)]


@pytest.mark.parametrize("spec, case", matrix(QUANTIZED, QUANTIZED))
def test_quantized_rhs(spec, case):
    check(spec, case)


# ------------------------------------------------------------------ where the rows go

# Groups of 7, 0, 13, 11, 5 rows (36 of 45: unaligned, summing below m); locals 1..3, the
# first of them empty; existing_out keeping every other row. Then locals 2..6 of 8 groups,
# three of them empty.
PLACEMENT = [
    Case(glu="gelu", glu_layout="interleaved", m=45, k=20, n=12, sizes=(7, 0, 13, 11, 5),
         local_groups=3, group_offset=1, existing=True, transpose_rhs=True, seed=2),
    Case(activation="relu", m=61, k=17, n=9, sizes=(3, 0, 0, 29, 0, 1, 0, 13), local_groups=5,
         group_offset=2, seed=3),
]


@pytest.mark.parametrize("spec, case", matrix(PLACEMENT, PLACEMENT[:1], PLACEMENT[:1]))
def test_offset_existing_out_transpose_and_empty_groups(spec, case):
    check(spec, case)


# ------------------------------------------------------------------ 16-bit floats

# bfloat16 operands and output, a gated unit without a bias; a bfloat16 bias and a named
# activation on bfloat16 operands are test_quantized_rhs's.
BF16 = [Case(glu="gelu_tanh", glu_layout="interleaved", bias=False, dtype=jnp.bfloat16,
             out_dtype=jnp.bfloat16, existing=True, seed=7)]


@pytest.mark.parametrize("spec, case", matrix(BF16, BF16))
def test_bfloat16(spec, case):
    check(spec, case)


XLA = [spec for spec in runnable_implementations(GMM) if spec.platform.value == "xla"]


@pytest.mark.slow
@pytest.mark.parametrize("spec", XLA, ids=lambda spec: spec.platform.value)
def test_float32_operands_keep_float32_gradients_under_a_bfloat16_output(spec):
    """The bfloat16 output is rounded once; the gradients of float32 operands are float32 ones
    (as without an epilogue, and as jax's own autodiff of the float32 math gives)."""
    check(spec, Case(activation="silu", out_dtype=jnp.bfloat16, seed=10))


@pytest.mark.parametrize("spec", runnable_implementations(GMM),
                         ids=lambda spec: f"{spec.platform.value}-{spec.backend.value}")
def test_a_float32_bias_leaves_the_gradient_matmuls_in_bfloat16(spec):
    """bfloat16 operands beside a float32 bias: the gradient matmuls take d z in bfloat16, the
    dtype of the gradients they make (a float32 bias had widened both, each then copying the
    weights or the activations to float32 and multiplying them at float32's rate), while the
    bias gradient is summed from the float32 d z. Against float64."""
    from kernelhub._grouped_matmul import active_table
    from kernelhub.tuning import _autotune

    rng = np.random.default_rng(11)
    m, k, n = 48, 32, 16
    sizes = np.array([20, 0, 25], np.int32)
    lhs, rhs = draw(rng, (m, k), jnp.bfloat16), draw(rng, (3, k, 2 * n), jnp.bfloat16)
    bias, d_out = draw(rng, (3, 2 * n), jnp.float32), draw(rng, (m, n), jnp.bfloat16)
    gmm = call(spec)

    def pullback(lhs, rhs, bias):
        _, vjp = jax.vjp(lambda a, b, c: gmm(a, b, jnp.asarray(sizes), bias=c, glu="silu",
                                             preferred_element_type=jnp.bfloat16),
                         lhs, rhs, bias)
        return vjp(d_out)

    recorder = _autotune.Recorder()
    with active_table.activated(recorder):
        jax.eval_shape(pullback, lhs, rhs, bias)
    problems = {c.pass_name: c.problem for c in recorder.calls.values()}
    assert problems["lhs_gradient"].lhs_dtype == "bfloat16", problems
    assert problems["rhs_gradient"].rhs_dtype == "bfloat16", problems

    d_lhs, d_rhs, d_bias = jax.jit(pullback)(lhs, rhs, bias)
    grads = reference.gmm_epilogue_vjp(lhs, rhs, sizes, d_out, bias=bias, glu="silu")
    assert (d_lhs.dtype, d_rhs.dtype, d_bias.dtype) == (jnp.bfloat16, jnp.bfloat16, jnp.float32)
    assert_close(d_lhs, grads["lhs"], jnp.bfloat16, contraction=2 * n)
    assert_close(d_rhs, grads["rhs"], jnp.bfloat16, contraction=m)
    assert_close(d_bias, grads["bias"], jnp.float32, contraction=m)


# ------------------------------------------------------------------ k == 0, vmap


# A spread of 12 puts some biases past swiglu_oai's clamps. XLA also takes the activations
# no other case here runs (tanh, identity): k == 0 checks each one's value and derivative.
EMPTY_CONTRACTION = [
    Case(activation="sigmoid", m=15, k=0, sizes=(5, 0, 7)),
    Case(glu="swiglu_oai", glu_layout="interleaved", m=15, k=0, sizes=(5, 0, 7), scale=12.0,
         existing=True, group_offset=1, local_groups=2)]
EMPTY_CONTRACTION_XLA = EMPTY_CONTRACTION + [
    Case(activation=name, m=15, k=0, sizes=(5, 0, 7), scale=3.0) for name in ("tanh", "identity")]


@pytest.mark.parametrize("spec, case", matrix(EMPTY_CONTRACTION_XLA, EMPTY_CONTRACTION,
                                              EMPTY_CONTRACTION_XLA))
def test_empty_contraction_gives_the_epilogue_of_the_bias(spec, case):
    """Every computed row is epilogue(bias[group]); the bias gradient is the epilogue's
    derivative there, summed over the group's rows (an empty group's exactly 0). Eager."""
    check(spec, case, jit=False)


# With an int8 rhs (quantized inside the mapped function, its scales shared by the batch).
VMAP = Case(glu="silu", glu_layout="interleaved", m=24, k=16, n=8, sizes=(5, 0, 12, 4),
            quantized=jnp.int8)


@pytest.mark.parametrize("spec, case", matrix([VMAP], [VMAP]))
def test_vmap_over_a_batch_of_lhs(spec, case):
    """jit(vmap) of forward and VJP over lhs, group sizes and cotangents, rhs and bias shared:
    each batch entry its own problem, with its own rhs and bias gradients."""
    batch_sizes = np.array([[5, 0, 12, 4], [24, 0, 0, 0], [0, 7, 1, 9]], np.int32)
    rng = np.random.default_rng(8)
    a = arrays(case)
    # The reference multiplies by the dequantized weights; their gradient is the float rhs's.
    rhs = dequantized(quantized_operand(a["rhs"], case.quantized, axis=1))
    lhs = draw(rng, (3, case.m, case.k), jnp.float32)
    d_out = draw(rng, (3, case.m, case.n), jnp.float32)
    batched = jax.jit(jax.vmap(forward_and_vjp(spec, case),
                               in_axes=(0, None, None, None, 0, None, 0)),
                      compiler_options=QUICK_COMPILE)
    out, (d_lhs, d_rhs, d_bias, _) = batched(lhs, a["rhs"], a["bias"], None,
                                            jnp.asarray(batch_sizes), jnp.int32(0), d_out)
    common = dict(bias=a["bias"], **case.reference_options())
    for b in range(3):
        assert_close(out[b], reference.gmm(lhs[b], rhs, batch_sizes[b], **common),
                     jnp.float32, contraction=case.k)
        grads = reference.gmm_epilogue_vjp(lhs[b], rhs, batch_sizes[b], d_out[b], **common)
        assert_close(d_lhs[b], grads["lhs"], jnp.float32, contraction=case.rhs_columns)
        assert_close(d_rhs[b], grads["rhs"], jnp.float32, contraction=case.m)
        assert_close(d_bias[b], grads["bias"], jnp.float32, contraction=case.m)
        np.testing.assert_array_equal(
            np.asarray(d_bias[b])[batch_sizes[b] == 0], 0.0)


# ------------------------------------------------------------------ the reference itself


@pytest.mark.parametrize("epilogue", [
    dict(activation="gelu"), dict(activation="gelu_tanh"), dict(activation="silu"),
    dict(activation=user_activation_numpy), dict(glu="swiglu_oai", glu_layout="interleaved"),
    dict(glu="gelu_tanh")],
    ids=lambda e: "-".join(LAMBDA if callable(v) else str(v) for v in e.values())[:30])
def test_reference_vjp_matches_its_central_differences(epilogue):
    """The float64 reference's analytic VJP against central differences of its forward."""
    rng = np.random.default_rng(9)
    m, k, n_rhs, sizes = 9, 3, 8, [4, 0, 3]
    lhs, rhs = rng.standard_normal((m, k)), 2.0 * rng.standard_normal((3, k, n_rhs))
    bias = 2.0 * rng.standard_normal((3, n_rhs))
    n = n_rhs // 2 if "glu" in epilogue else n_rhs
    d_out = rng.standard_normal((m, n))
    arguments = dict(lhs=lhs, rhs=rhs, bias=bias)

    def loss(**changed):
        return float(np.sum(reference.gmm(**{**arguments, **changed}, group_sizes=sizes,
                                          **epilogue) * d_out))

    grads = reference.gmm_epilogue_vjp(lhs, rhs, sizes, d_out, bias=bias, **epilogue)
    for name, value in arguments.items():
        numeric = np.zeros_like(value)
        for index in np.ndindex(value.shape):
            step = np.zeros_like(value)
            step[index] = 1e-6
            numeric[index] = (loss(**{name: value + step}) - loss(**{name: value - step})) / 2e-6
        np.testing.assert_allclose(grads[name], numeric, rtol=1e-6, atol=1e-6, err_msg=name)
    np.testing.assert_array_equal(grads["bias"][1], 0.0)


# ------------------------------------------------------------------ bad epilogue arguments

LHS, RHS = jnp.ones((8, 4)), jnp.ones((2, 4, 6))
SIZES = jnp.array([3, 5], jnp.int32)


@pytest.mark.parametrize("arguments, error, message", [
    (dict(bias=jnp.ones((2, 5))), ValueError, r"bias must have shape \(2, 6\)"),
    (dict(bias=jnp.ones((1, 6))), ValueError, "^bias has local_groups=1"),
    (dict(bias=jnp.ones((2, 3)), glu="silu"), ValueError, r"bias must have shape \(2, 6\)"),
    (dict(bias=jnp.ones((6,))), ValueError, "^bias"),
    (dict(bias=jnp.ones((2, 6), jnp.int32)), TypeError, "bias must have dtype"),
    (dict(bias=jnp.ones((2, 6), jnp.float8_e4m3fn)), TypeError, "bias must have dtype"),
    (dict(rhs=jnp.ones((2, 4, 5)), glu="silu"), ValueError, "glu needs .*even number.*got 5"),
    (dict(rhs=jnp.ones((2, 5, 4)), glu="silu", transpose_rhs=True), ValueError,
     "glu needs .*even number.*got 5"),
    (dict(glu="silu", activation="relu"), ValueError, "activation and glu cannot both"),
    (dict(glu="silu", activation=user_activation), ValueError, "activation and glu cannot both"),
    (dict(activation="swish"), ValueError, "activation must be one of .*'relu'.*got 'swish'"),
    (dict(activation=3), TypeError, "^activation must be"),
    (dict(glu="reglu"), ValueError, "glu must be one of .*'swiglu_oai'.*got 'reglu'"),
    (dict(glu=jax.nn.silu), TypeError, "^glu must be"),
    (dict(glu="silu", glu_layout="stacked"), ValueError,
     "glu_layout must be one of .*'interleaved'.*got 'stacked'"),
    (dict(glu_layout=None), TypeError, "^glu_layout must be"),
    (dict(lhs=jnp.ones((8, 4), jnp.int8), rhs=jnp.ones((2, 4, 6), jnp.int8), activation="relu",
          preferred_element_type=jnp.int32), TypeError, "float preferred_element_type.*int32"),
    (dict(lhs=jnp.ones((8, 4), jnp.int8), rhs=jnp.ones((2, 4, 6), jnp.int8),
          bias=jnp.ones((2, 6)), preferred_element_type=jnp.int32), TypeError,
     "float preferred_element_type.*int32"),
], ids=lambda value: None if isinstance(value, (dict, type)) else str(value)[:40])
def test_bad_epilogue_arguments_name_the_argument(arguments, error, message):
    """One line naming the argument, eagerly and when traced under jit."""
    lhs, rhs = arguments.pop("lhs", LHS), arguments.pop("rhs", RHS)
    eager = lambda lhs, rhs: kernelhub.grouped_matmul(lhs, rhs, SIZES, **arguments)  # noqa: E731
    for gmm in (eager, jax.jit(eager)):
        with pytest.raises(error, match=message) as raised:
            gmm(lhs, rhs)
        assert "\n" not in str(raised.value), str(raised.value)


@pytest.mark.parametrize("arguments, feature", [
    (dict(bias=jnp.ones((2, 6))), "bias"), (dict(activation="identity"), "activation"),
    (dict(activation=user_activation), "activation"), (dict(glu="silu"), "glu"),
    (dict(glu="swiglu_oai", bias=jnp.ones((2, 6))), "bias, glu")])
def test_forcing_an_implementation_without_the_feature_is_an_error(arguments, feature):
    """An implementation registered without epilogue features serves plain calls; forced for a
    call with an epilogue it is a NoImplementationError naming the feature, never a fallback."""
    calls = []

    def plain(lhs, rhs, group_sizes, preferred_element_type=jnp.float32, tiling=None,
              group_offset=None, existing_out=None, transpose_rhs=False, bias=None,
              activation=None, glu=None, glu_layout="concatenated"):
        calls.append(lhs.shape)
        return jnp.zeros((lhs.shape[0], rhs.shape[2]), preferred_element_type)

    # The pallas platform on the backend running here (cpu here and on CI, gpu on a GPU host).
    backend = _dispatch.running_backend().value
    saved = _registry.unregister(GMM, "pallas", backend)
    kernelhub.register(GMM, "pallas", backend, features=["quantized"])(plain)
    try:
        gmm = kernelhub.get(GMM, platform="pallas")
        np.testing.assert_array_equal(np.asarray(gmm(LHS, RHS, SIZES)), 0.0)
        assert calls
        calls.clear()
        with pytest.raises(kernelhub.NoImplementationError,
                           match=f"platform=pallas.*pallas/{backend} does not support {feature}"):
            gmm(LHS, RHS, SIZES, **arguments)
        assert not calls
        # Unforced, the call goes to an implementation that has the features.
        out = kernelhub.grouped_matmul(LHS, RHS, SIZES, **arguments)
        assert out.shape == (8, 3 if "glu" in arguments else 6)
    finally:
        _registry.unregister(GMM, "pallas", backend)
        if saved is not None:
            _registry.restore(saved)


@pytest.mark.parametrize("spec", runnable_implementations(GMM),
                         ids=lambda spec: f"{spec.platform.value}-{spec.backend.value}")
def test_no_rows_or_no_columns(spec):
    """m = 0: an empty output and a bias gradient of exactly 0 (no row adds to it); n = 0
    output columns: an empty output whatever the gate."""
    gmm = call(spec)
    sizes = jnp.array([0, 0, 0], jnp.int32)
    rhs = jnp.ones((3, 8, 12), jnp.float32)
    bias = jnp.ones((3, 12), jnp.float32)

    def loss(bias):
        out = gmm(jnp.ones((0, 8), jnp.float32), rhs, sizes, bias=bias, glu="silu")
        assert out.shape == (0, 6)
        return jnp.sum(out)

    np.testing.assert_array_equal(np.asarray(jax.grad(loss)(bias)), 0.0)
    out = gmm(jnp.ones((5, 8), jnp.float32), jnp.ones((3, 8, 0), jnp.float32),
              jnp.array([2, 0, 3], jnp.int32), bias=jnp.ones((3, 0), jnp.float32),
              glu="swiglu_oai", glu_layout="interleaved")
    assert out.shape == (5, 0)


def _kernels_in_training_step(layer, policy=None) -> dict[str, dict[str, int]]:
    """The grouped-matmul kernels of value_and_grad of sum(layer(x, w, b) * c) lowered for tpu
    and cuda (nothing runs), under a jax.checkpoint policy when given. The loss is linear in
    the layer's output, so the backward pass needs nothing of the output itself."""
    from kernelhub import export as kernelhub_export

    def loss(x, w, b, c):
        return jnp.sum(layer(x, w, b).astype(jnp.float32) * c)

    if policy is not None:
        loss = jax.checkpoint(loss, policy=policy)
    step = jax.value_and_grad(loss, argnums=(0, 1, 2))
    bf16 = jnp.bfloat16
    args = (jax.ShapeDtypeStruct((64, 32), bf16), jax.ShapeDtypeStruct((4, 32, 64), bf16),
            jax.ShapeDtypeStruct((4, 64), bf16), jax.ShapeDtypeStruct((64, 32), jnp.float32))
    exported = kernelhub_export.export(step, *args, platforms=("tpu", "cuda"))
    return kernelhub_export.kernels_by_platform(exported)


def _fused_layer(x, w, b):
    return kernelhub.grouped_matmul(x, w, jnp.array([16, 0, 30, 18], jnp.int32),
                                    preferred_element_type=jnp.bfloat16, bias=b, glu="silu")


def _unfused_layer(x, w, b):
    sizes = jnp.array([16, 0, 30, 18], jnp.int32)
    z = kernelhub.grouped_matmul(x, w, sizes, preferred_element_type=jnp.bfloat16)
    z = z.astype(jnp.float32) + jnp.repeat(b.astype(jnp.float32), sizes, axis=0,
                                           total_repeat_length=64)
    return (jax.nn.silu(z[:, :32]) * z[:, 32:]).astype(jnp.bfloat16)


def test_a_fused_training_step_runs_no_more_kernels_than_the_unfused_one():
    """Forward + gradient of a fused glu + bias call: the forward kernel, the lhs-gradient and
    the rhs-gradient kernels, as the same math written unfused; the backward pass reuses the
    pre-activation the forward kernel wrote (it used to run the forward kernel again)."""
    fused = _kernels_in_training_step(_fused_layer)
    unfused = _kernels_in_training_step(_unfused_layer)
    assert fused == unfused == {"tpu": {"mosaic": 3}, "cuda": {"triton": 3}}


def test_checkpoint_policies_keep_or_recompute_the_pre_activation_by_its_name():
    """kernelhub_pre_activation is a checkpoint name: a policy that saves it keeps the step at
    3 kernels, one that saves nothing runs the forward kernel again in the backward pass."""
    policies = jax.checkpoint_policies
    assert kernelhub.ops.grouped_matmul.PRE_ACTIVATION == "kernelhub_pre_activation"
    kept = _kernels_in_training_step(
        _fused_layer, policies.save_only_these_names("kernelhub_pre_activation"))
    recomputed = _kernels_in_training_step(_fused_layer, policies.nothing_saveable)
    assert kept == {"tpu": {"mosaic": 3}, "cuda": {"triton": 3}}
    assert recomputed == {"tpu": {"mosaic": 4}, "cuda": {"triton": 4}}


def test_the_gpu_kernels_erf_polynomial_is_within_float32_rounding():
    """kernelhub/_grouped_matmul/polynomial_erf.py against math.erf in float64, across both of
    its pieces, their seam and the clamp."""
    import math

    from kernelhub._grouped_matmul import polynomial_erf

    x = np.concatenate([np.linspace(-6.0, 6.0, 200_001),
                        polynomial_erf.ERF_SPLIT + np.array([-1e-6, 0.0, 1e-6])]).astype(np.float32)
    got = np.asarray(jax.jit(polynomial_erf.erf)(jnp.asarray(x)), np.float64)
    expected = np.array([math.erf(v) for v in x.astype(np.float64)])
    assert np.max(np.abs(got - expected)) < 2.5e-7
