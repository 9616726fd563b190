"""Per-call choice by measurements: an op's `measured` (define_op) lets a call lower the
implementation measured fastest for it on this host's device; the grouped matmuls read those
times from the tuning tables (kernelhub/_grouped_matmul/measured.py)."""

from __future__ import annotations

import contextlib
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float

import kernelhub
from kernelhub._core import registry as _registry
from kernelhub._grouped_matmul import active_table, names, tables
from kernelhub._grouped_matmul.passes import TuningSpace
from kernelhub._grouped_matmul.registration import register_grouped_matmuls
from kernelhub._grouped_matmul.tables import Entry, Tuning
from kernelhub._xla.grouped_matmul import raw_grouped_matmul
from kernelhub._xla.transposed_grouped_matmul import raw_transposed_grouped_matmul
from kernelhub._xla.tuning_space import SPACE as XLA_SPACE

_names = itertools.count()


# --- the core, with a user's op ----------------------------------------------------------------


def doubled(x: Float[Array, "n"]) -> Float[Array, "n"]:
    """2 * x."""


@pytest.fixture
def two_ways():
    """An op with two CPU implementations of 2 * x sharing their VJP's residuals: "xla"
    (x + x, registered first) and "pallas" (x - (-x)), and `measured` seconds for each, set by
    the test (a missing key: not measured)."""
    seconds: dict[str, float] = {}
    traced: list[str] = []

    def measured(arguments, trace):
        assert set(arguments) == {"x"} and arguments["x"].shape == (4,)
        before = len(traced)
        trace()
        return seconds.get(traced[before]) if len(traced) > before else None

    name = f"doubled_{next(_names)}"
    op = kernelhub.define_op(doubled, name=name, measured=measured)

    def by_addition(x):
        traced.append("xla")
        return x + x

    def by_difference(x):  # linear too: no residuals beside by_addition's
        traced.append("pallas")
        return x - (-x)

    kernelhub.register(op, "xla", "cpu", priority=1, residuals="doubling")(by_addition)
    kernelhub.register(op, "pallas", "cpu", priority=0, residuals="doubling")(by_difference)
    yield op, seconds
    _registry.remove_op(name)


def _lowered_ops(fn, *args) -> set[str]:
    # A new function each time: jax keeps a function's lowering, and the test's measurements
    # change where no trace context does (a table's do: kernelhub/_grouped_matmul/tables.py).
    text = jax.jit(lambda *a: fn(*a)).lower(*args).as_text()
    return {op for op in ("stablehlo.add", "stablehlo.subtract") if op in text}


def test_the_measured_faster_implementation_lowers(two_ways):
    op, seconds = two_ways
    x = jnp.arange(4.0)
    assert _lowered_ops(op, x) == {"stablehlo.add"}  # nothing measured: the priority's
    seconds.update(xla=2e-3, pallas=1e-3)
    assert _lowered_ops(op, x) == {"stablehlo.subtract"}
    np.testing.assert_array_equal(jax.jit(op)(x), 2 * np.arange(4.0))
    seconds.update(pallas=3e-3)
    assert _lowered_ops(op, x) == {"stablehlo.add"}
    seconds.update(pallas=2e-3)  # a tie keeps the registered choice
    assert _lowered_ops(op, x) == {"stablehlo.add"}


def test_only_another_measured_keeps_the_registered_choice(two_ways):
    op, seconds = two_ways
    seconds.update(pallas=1e-6)
    assert _lowered_ops(op, jnp.arange(4.0)) == {"stablehlo.add"}


def test_a_forced_platform_is_never_overridden(two_ways):
    op, seconds = two_ways
    seconds.update(xla=2e-3, pallas=1e-3)
    forced = kernelhub.get(_registry.op_name(op), platform="xla")
    assert _lowered_ops(forced, jnp.arange(4.0)) == {"stablehlo.add"}


def test_gradients_through_a_measured_choice(two_ways):
    op, seconds = two_ways
    seconds.update(xla=2e-3, pallas=1e-3)
    x = jnp.arange(4.0)
    value, grad = jax.jit(jax.value_and_grad(lambda x: jnp.sum(op(x) ** 2)))(x)
    np.testing.assert_allclose(value, np.sum((2 * np.arange(4.0)) ** 2))
    np.testing.assert_allclose(grad, 8 * np.arange(4.0))


# --- the grouped matmuls, from tuning tables ----------------------------------------------------

TWIN = "xla-twin"


@pytest.fixture
def twin():
    """The XLA kernels registered a second time, for the cpu as (pallas, cpu) below xla's
    priority under the tuning name "xla-twin"; yields the passes each kernel lowered for (not
    counting traces for measurement): "gmm", "gmm transposed" (the lhs gradient), "tgmm"."""
    with _registered_twin(TuningSpace(TWIN, XLA_SPACE.candidates, XLA_SPACE.default,
                                      XLA_SPACE.accepts), features=()) as lowered:
        yield lowered


@contextlib.contextmanager
def _registered_twin(space: TuningSpace, features: tuple[str, ...]):
    lowered: list[str] = []

    def counted(raw, kernel):
        def run(*args, **kwargs):
            if not isinstance(active_table.value(), tables.Observer):
                # gmm's lhs gradient is gmm with the weights transposed (argument 7).
                lowered.append(kernel + (" transposed" if kernel == "gmm" and args[7] else ""))
            return raw(*args, **kwargs)
        return run

    saved = [_registry.unregister(op, "pallas", "cpu")
             for op in (names.GROUPED_MATMUL, names.TRANSPOSED_GROUPED_MATMUL)]
    register_grouped_matmuls("pallas", "cpu", counted(raw_grouped_matmul, "gmm"),
                             counted(raw_transposed_grouped_matmul, "tgmm"), space,
                             features=features, fold_scales=False, priority=-1)
    try:
        yield lowered
    finally:
        for op in (names.GROUPED_MATMUL, names.TRANSPOSED_GROUPED_MATMUL):
            _registry.unregister(op, "pallas", "cpu")
        for spec in saved:
            if spec is not None:
                _registry.restore(spec)


M, K, N, G = 96, 32, 48, 4
SIZES = np.array([30, 0, 41, 17], np.int32)  # 88 of 96 rows: the last 8 belong to no group


def _operands():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((M, K)).astype(np.float32),
            rng.standard_normal((G, K, N)).astype(np.float32))


def _reference(x, w):
    out = np.zeros((M, N))
    start = 0
    for group, size in enumerate(SIZES):
        out[start:start + size] = x[start:start + size].astype(np.float64) @ w[group]
        start += size
    return out


def _table(times: dict[tuple[str, str], float], fn, *args) -> Tuning:
    """Entries for each (implementation, pass) in `times` (milliseconds), keyed as the kernel
    calls `fn(*args)` makes are."""
    observer = tables.Observer(None)
    with active_table.activated(observer):
        jax.make_jaxpr(fn)(*args)
    entries = {}
    for call in observer.calls:
        for (implementation, pass_name), ms in times.items():
            if pass_name != call.pass_name:
                continue
            key = tables.TuningKey.of("cpu", implementation, call.op, call.pass_name,
                                      call.problem)
            tiling = XLA_SPACE.default(call.problem)
            entries[key] = Entry(tiling, tiling, ms, ms, "balanced")
    return Tuning(entries, "test table")


def _loss(x, w):
    return jnp.sum(kernelhub.grouped_matmul(x, w, jnp.asarray(SIZES)) ** 2)


def test_grouped_matmul_lowers_the_kernel_the_table_measured_faster(twin):
    x, w = _operands()
    gmm = lambda x, w: kernelhub.grouped_matmul(x, w, jnp.asarray(SIZES))  # noqa: E731
    faster = _table({(TWIN, "forward"): 1.0, ("xla", "forward"): 2.0}, gmm, x, w)
    with faster:
        out = jax.jit(gmm)(x, w)
    assert set(twin) == {"gmm"}
    np.testing.assert_allclose(out, _reference(x, w), rtol=1e-5, atol=1e-4)

    # The choices below are read from what lowers (nothing is compiled): the twin's result
    # was checked above, xla's is every other test's.
    twin.clear()
    slower = _table({(TWIN, "forward"): 3.0, ("xla", "forward"): 2.0}, gmm, x, w)
    with slower:
        jax.jit(gmm).lower(x, w)
    assert twin == []

    twin.clear()
    with faster:  # an explicit tiling is one backend's: no measured choice
        jax.jit(lambda x, w: kernelhub.grouped_matmul(
            x, w, jnp.asarray(SIZES), tiling=(32, 32, 48))).lower(x, w)
    assert twin == []

    with faster:  # forced
        jax.jit(lambda x, w: kernelhub.get("grouped_matmul", platform="xla")(
            x, w, jnp.asarray(SIZES))).lower(x, w)
    assert twin == []


def test_an_epilogue_the_tables_never_timed_keeps_the_registered_choice():
    """A backend whose tuning space says a table's time is not its time under an epilogue
    (Mosaic GPU gathers an interleaved gated unit's columns of weights [G, k, n], a copy of
    them, before its kernel) gets no measured time for such a call: the table's faster entry
    does not lower it. Under the concatenated layout, which it times, it does; both results
    against float64."""
    from kernelhub._pallas.mosaic_gpu import tuning_space as mosaic_space

    space = TuningSpace(TWIN, XLA_SPACE.candidates, XLA_SPACE.default, XLA_SPACE.accepts,
                        times_epilogue=mosaic_space.space("mosaic").times_epilogue)
    x, w = _operands()
    with _registered_twin(space, features=(names.GLU,)) as lowered:
        for layout, twin_lowers in (("interleaved", False), ("concatenated", True)):
            def gated(x, w, layout=layout):
                return kernelhub.grouped_matmul(x, w, jnp.asarray(SIZES), glu="silu",
                                                glu_layout=layout)

            lowered.clear()
            with _table({(TWIN, "forward"): 1.0, ("xla", "forward"): 2.0}, gated, x, w):
                out = jax.jit(gated)(x, w)
            assert (lowered == ["gmm"]) == twin_lowers, layout
            z = _reference(x, w)
            gate, up = ((z[:, 0::2], z[:, 1::2]) if layout == "interleaved"
                        else (z[:, :N // 2], z[:, N // 2:]))
            np.testing.assert_allclose(out, gate / (1 + np.exp(-gate)) * up, rtol=1e-4,
                                       atol=1e-4)


def test_a_table_times_a_call_with_scale_blocks_only_under_their_key():
    """A key names scale blocks beside dtypes (kernels step through blocks or widen first):
    int8 weights in blocks of 16 along k lower the table's faster twin under entries tuned
    with those blocks, and keep the registered choice under entries tuned with one scale per
    column or with blocks of 8. Each result against float64."""
    from kernelhub.quantization import quantize

    def quantized(x, w, block_size):
        return kernelhub.grouped_matmul(
            x, quantize(w, jnp.int8, axis=1, block_size=block_size), jnp.asarray(SIZES))

    x, w = _operands()
    weights = np.asarray(quantize(w, jnp.int8, axis=1, block_size=16).dequantize())
    features = (names.QUANTIZED, names.QUANTIZED_BLOCKS)
    with _registered_twin(TuningSpace(TWIN, XLA_SPACE.candidates, XLA_SPACE.default,
                                      XLA_SPACE.accepts), features=features) as lowered:
        for tuned_block, twin_lowers in ((None, False), (8, False), (16, True)):
            table = _table({(TWIN, "forward"): 1.0, ("xla", "forward"): 2.0},
                           functools.partial(quantized, block_size=tuned_block), x, w)
            lowered.clear()
            with table:
                out = jax.jit(functools.partial(quantized, block_size=16))(x, w)
            assert (lowered == ["gmm"]) == twin_lowers, tuned_block
            np.testing.assert_allclose(out, _reference(x, weights), rtol=1e-4, atol=1e-3)


def test_each_half_of_the_gradient_takes_its_faster_kernels(twin):
    x, w = _operands()
    # The twin is faster forward, xla in the gradients: the forward half lowers the twin's
    # gmm, the backward half xla's two gradient kernels (the residuals are the same kit's).
    table = _table({(TWIN, "forward"): 1.0, ("xla", "forward"): 2.0,
                    (TWIN, "lhs_gradient"): 5.0, ("xla", "lhs_gradient"): 2.0,
                    (TWIN, "rhs_gradient"): 5.0, ("xla", "rhs_gradient"): 2.0},
                   jax.grad(_loss, argnums=(0, 1)), x, w)
    with table:
        value, (dx, dw) = jax.jit(jax.value_and_grad(_loss, argnums=(0, 1)))(x, w)
    assert set(twin) == {"gmm"}
    out = _reference(x, w)
    np.testing.assert_allclose(value, np.sum(out ** 2), rtol=1e-5)
    d_out = 2 * out
    expected_dx = np.zeros((M, K))
    expected_dw = np.zeros((G, K, N))
    start = 0
    for group, size in enumerate(SIZES):
        rows = slice(start, start + size)
        expected_dx[rows] = d_out[rows] @ w[group].T.astype(np.float64)
        expected_dw[group] = x[rows].T.astype(np.float64) @ d_out[rows]
        start += size
    np.testing.assert_allclose(dx, expected_dx, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(dw, expected_dw, rtol=1e-4, atol=1e-3)

    twin.clear()
    # A pass without an entry: that half keeps the registered choice (read from what lowers:
    # both halves' results are checked around it).
    partial = _table({(TWIN, "forward"): 1.0, ("xla", "forward"): 2.0,
                      (TWIN, "lhs_gradient"): 1.0, ("xla", "lhs_gradient"): 2.0},
                     jax.grad(_loss, argnums=(0, 1)), x, w)
    with partial:
        jax.jit(jax.grad(_loss, argnums=(0, 1))).lower(x, w)
    assert set(twin) == {"gmm"}

    twin.clear()
    with _table({(TWIN, "forward"): 3.0, ("xla", "forward"): 2.0,
                 (TWIN, "lhs_gradient"): 1.0, ("xla", "lhs_gradient"): 2.0,
                 (TWIN, "rhs_gradient"): 1.0, ("xla", "rhs_gradient"): 2.0},
                jax.grad(_loss, argnums=(0, 1)), x, w):
        dx, dw = jax.jit(jax.grad(_loss, argnums=(0, 1)))(x, w)
    assert set(twin) == {"gmm transposed", "tgmm"}
    np.testing.assert_allclose(dx, expected_dx, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(dw, expected_dw, rtol=1e-4, atol=1e-3)


def test_a_cpu_host_has_no_alternates_and_pays_nothing():
    """On a CPU the only non-interpreting implementation is XLA's: no target has alternates,
    so lowering traces nothing more (the interpreters are never alternates)."""
    from kernelhub._core import dispatch

    for op in (names.GROUPED_MATMUL, names.TRANSPOSED_GROUPED_MATMUL):
        choices = dispatch.per_target(op, _registry.version())
        assert choices.alternates_for("cpu") == ()
