"""Every implementation under explicit sharding (jax.set_mesh with AxisType.Explicit axes):
operands sharded over explicit axes, the result typed with the sharding dot_general's rule
gives (or `out_sharding`, as lax honours it), forward and gradients against the float64
reference, and a ValueError naming the operand for a layout no kernel can split.

Run with 8 simulated CPU devices (tests/test_parallel.py launches this folder so).
"""

from __future__ import annotations

import jax
import pytest

if jax.device_count() < 8:
    pytest.skip("needs 8 devices: tests/test_parallel.py runs this in a subprocess",
                allow_module_level=True)

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import AxisType, PartitionSpec as P

import kernelhub
import ragged_reference
import reference
from conftest import assert_close, call, implementation_params

GMM, TGMM = "grouped_matmul", "transposed_grouped_matmul"
SIZES = np.array([3, 0, 6, 4], np.int32)  # 4 groups; rows 13.. of 16 belong to none
BASIC = lax.RaggedDotDimensionNumbers((([1], [1]), ([], [])), [0], [0])  # lax.ragged_dot's


def _mesh(shape=(2, 4), names=("x", "y")):
    return jax.make_mesh(shape, names, axis_types=(AxisType.Explicit,) * len(names),
                         devices=jax.devices()[:int(np.prod(shape))])


def _normal(rng, shape):
    return rng.normal(size=shape).astype(np.float32)


def _without(op: str, platform: str) -> list:
    """Every implementation, the Mosaic GPU interpreter too, less one interpreter: the
    explicit-sharding rules are the kit's, the same around every kernel, but each kernel meets
    its own local shapes (a few rows and columns a device, far under one tile). The Pallas and
    Triton interpreters each still run two of this file's four kernel tests (the suite runs in
    one process, CI's time), the Mosaic GPU interpreter all four (its launches take turns
    across the devices: ragged_dot_general's test, with the most kernels in one program, is
    the one that hung on too few threads)."""
    return [param for param in implementation_params(op)
            if param.values[0].platform.value != platform or not param.values[0].interpret_only]


def _spec(x):
    return jax.typeof(x).sharding.spec


def _ragged64(*args, **kwargs):
    with jax.enable_x64(True):
        return np.asarray(ragged_reference.ragged_dot_general(*args, **kwargs))


@pytest.mark.parametrize("spec", _without("ragged_dot_general", "pallas"))
def test_lax_out_sharding_scenario(spec):
    """jax's lax_test RaggedTest.test_ragged_dot(_general)_out_sharding, on kernelhub: a
    one-device explicit mesh, out_sharding=P("x", None), eager and jitted, and the sharding
    constraint in the lowered module."""
    mesh = _mesh((1,), ("x",))
    ragged_dot = kernelhub.get("ragged_dot", platform=spec.platform)
    general = call(spec)
    with jax.set_mesh(mesh):
        args = [jnp.ones((16, 4)), jnp.ones((2, 4, 3)), jnp.array([8, 8])]
        for f in (lambda a, b, g: ragged_dot(a, b, g, out_sharding=P("x", None)),
                  lambda a, b, g: general(a, b, g, BASIC, out_sharding=P("x", None))):
            seen = []

            def typed(a, b, g, f=f, seen=seen):
                out = f(a, b, g)
                seen.append(_spec(out))
                return out

            want = jax.NamedSharding(mesh, P("x", None))
            assert typed(*args).sharding == want
            jitted = jax.jit(typed)
            out = jitted(*args)
            assert out.sharding == want and seen == [P("x", None)] * 2
            np.testing.assert_array_equal(out, np.full((16, 3), 4.0))
            text = jitted.lower(*args).as_text()
            assert "sdy.sharding_constraint" in text or "@Sharding" in text


@pytest.mark.parametrize("spec", implementation_params(GMM))
def test_grouped_matmul_rows_columns_and_experts_sharded(spec):
    """lhs rows over x, rhs columns over y, experts (with their biases) over e: each device
    cuts the group sizes to its rows and moves group_offset to its first expert; the result is
    typed as lax.dot_general's, gradients keep their operands' shardings."""
    rng = np.random.default_rng(0)
    m, k, n = 16, 8, 8
    lhs, rhs, d_out = _normal(rng, (m, k)), _normal(rng, (4, k, n)), _normal(rng, (m, n))
    bias = _normal(rng, (4, n))
    gmm = call(spec)
    with jax.set_mesh(_mesh((2, 2, 2), ("x", "y", "e"))):
        a, b = jax.device_put(lhs, P("x", None)), jax.device_put(rhs, P("e", None, "y"))
        c = jax.device_put(bias, P("e", "y"))

        @jax.jit
        def run(a, b, c):
            out, pullback = jax.vjp(lambda a, b, c: gmm(a, b, jnp.asarray(SIZES), bias=c,
                                                        activation="silu"), a, b, c)
            dense = lax.dot_general(a, jax.sharding.reshard(b, P(None, None, "y"))[0],
                                    (([1], [0]), ([], [])))
            return out, *pullback(jax.sharding.reshard(jnp.asarray(d_out), _spec(out))), dense

        out, d_lhs, d_rhs, d_bias, dense = run(a, b, c)
        assert _spec(out) == _spec(dense) == P("x", "y")
        assert (_spec(d_lhs), _spec(d_rhs), _spec(d_bias)) == (_spec(a), _spec(b), _spec(c))
    epilogue = dict(bias=bias, activation="silu")
    want = reference.gmm_epilogue_vjp(lhs, rhs, SIZES, d_out, **epilogue)
    assert_close(out, reference.gmm(lhs, rhs, SIZES, **epilogue), jnp.float32, contraction=k)
    assert_close(d_lhs, want["lhs"], jnp.float32, contraction=n)
    assert_close(d_rhs, want["rhs"], jnp.float32, contraction=m)
    assert_close(d_bias, want["bias"], jnp.float32, contraction=m)


@pytest.mark.parametrize("spec", implementation_params(TGMM))
def test_transposed_grouped_matmul_sums_split_rows(spec):
    """The ragged contraction over x: partial products summed over the devices in float32,
    cast once to bfloat16; lhs's k over y shards the result."""
    rng = np.random.default_rng(1)
    k, m, n = 8, 16, 8
    lhs, rhs, d_out = _normal(rng, (k, m)), _normal(rng, (m, n)), _normal(rng, (4, k, n))
    tgmm = call(spec)
    with jax.set_mesh(_mesh()):
        a, b = jax.device_put(lhs, P("y", "x")), jax.device_put(rhs, P("x", None))

        @jax.jit
        def run(a, b):
            out, pullback = jax.vjp(lambda a, b: tgmm(a, b, jnp.asarray(SIZES),
                                                      preferred_element_type=jnp.bfloat16), a, b)
            return out, *pullback(jnp.asarray(d_out, jnp.bfloat16))

        out, d_lhs, d_rhs = run(a, b)
        assert (_spec(out), _spec(d_lhs), _spec(d_rhs)) == (P(None, "y", None), _spec(a), _spec(b))
    assert out.dtype == jnp.bfloat16
    d_out = np.asarray(jnp.asarray(d_out, jnp.bfloat16), np.float32)
    want_lhs, want_rhs, _ = reference.tgmm_vjp(lhs, rhs, SIZES, d_out)
    assert_close(out, reference.tgmm(lhs, rhs, SIZES), jnp.bfloat16, contraction=m)
    assert_close(d_lhs, want_lhs, jnp.float32, contraction=n)
    assert_close(d_rhs, want_rhs, jnp.float32, contraction=k)


@pytest.mark.parametrize("sizes", [[3, 2**31 - 1, 2**31 - 1, 4], [10, 2**31 - 1, 5, 2**31 - 1]])
def test_split_rows_of_sizes_whose_int32_sums_wrap(sizes):
    """Each device cuts traced group sizes to its rows with sums that saturate at the rows, as
    an unsharded call's bounds do: a wrapped int32 sum would end a group before the first row
    (until 2026-11-29 each device took a running sum that wrapped: 10.5 absolute error)."""
    rng = np.random.default_rng(2)
    m, k, n = 16, 8, 8
    lhs, rhs, d_out = _normal(rng, (m, k)), _normal(rng, (4, k, n)), _normal(rng, (m, n))
    sizes = np.array(sizes, np.int32)
    gmm = kernelhub.get(GMM, platform="xla")
    tgmm = kernelhub.get(TGMM, platform="xla")
    with jax.set_mesh(_mesh((2,), ("x",))):
        out, tgmm_out = jax.jit(lambda a, t, b, d, s: (gmm(a, b, s), tgmm(t, d, s)))(
            jax.device_put(lhs, P("x", None)), jax.device_put(lhs.T, P(None, "x")), rhs,
            jax.device_put(d_out, P("x", None)), jnp.asarray(sizes))
    assert_close(out, reference.gmm(lhs, rhs, sizes), jnp.float32, contraction=k)
    assert_close(tgmm_out, reference.tgmm(lhs.T, d_out, sizes), jnp.float32, contraction=m)


def test_the_mosaic_gpu_interpreter_on_more_devices_than_threads_is_refused(monkeypatch):
    """Interpreted launches take turns, each device's waiting call holding one of XLA's CPU
    client threads: with too few threads the calls wait forever (8 devices on 8 threads hung),
    so such a call is a ValueError saying how many threads to give the client."""
    monkeypatch.setenv("NPROC", "8")
    gmm = kernelhub.get(GMM, platform="mosaic")
    rng = np.random.default_rng(4)
    with jax.set_mesh(_mesh()):
        lhs = jax.device_put(_normal(rng, (16, 8)), P("x", None))
        with pytest.raises(ValueError, match=r"from 8 devices at once .* set NPROC=10 or more"):
            jax.jit(lambda a: gmm(a, jnp.asarray(_normal(rng, (4, 8, 8))),
                                  jnp.asarray(SIZES)))(lhs)


@pytest.mark.parametrize("op", [GMM, TGMM])
def test_compiled_kernels_sum_over_devices_only_what_a_replicated_operand_needs(op):
    """Lowered from this host for each target, forward and gradients under explicit axes: each
    kernel's output varies over the mesh axes its operands do, so the program holds only the
    collectives the layout needs, the same for the Mosaic GPU kernels as for the Triton and Pallas
    TPU ones and the XLA loops (gmm: d rhs summed over the rows' devices; tgmm: the split
    contraction summed, forward and d lhs's partial sums). Typed the same on every device, as
    plgpu.kernel types its output, the Mosaic GPU forward's cotangent was first summed over the
    devices: one all-reduce more, and every gradient wrong (values: the interpreted cases above)."""
    m, k, n = 256, 128, 128
    sizes = jnp.asarray(np.array([64, 0, 100, 60], np.int32))
    put = jax.device_put
    counts = {}
    with jax.set_mesh(_mesh((2,), ("x",))):
        for platform, backend, target in (("xla", None, "cpu"), ("pallas", "tpu", "tpu"),
                                          ("triton", "gpu", "cuda"), ("mosaic", "gpu", "cuda")):
            call = kernelhub.get(op, platform=platform, backend=backend)
            if op == GMM:
                operands = (put(jnp.ones((m, k), jnp.bfloat16), P("x", None)),
                            jnp.ones((4, k, n), jnp.bfloat16))
                cotangent = put(jnp.ones((m, n), jnp.float32), P("x", None))
            else:
                operands = (put(jnp.ones((k, m), jnp.bfloat16), P(None, "x")),
                            put(jnp.ones((m, n), jnp.bfloat16), P("x", None)))
                cotangent = jnp.ones((4, k, n), jnp.float32)

            def step(a, b, d_out, call=call):
                out, pullback = jax.vjp(lambda a, b: call(a, b, sizes), a, b)
                return out, *pullback(d_out)

            lowered = jax.jit(step).trace(*operands, cotangent).lower(
                lowering_platforms=(target,))
            counts[platform] = lowered.as_text().count("all_reduce")
    assert counts["mosaic"] == counts["triton"] == counts["pallas"] == counts["xla"] >= 1, counts


@pytest.mark.parametrize("spec", _without("ragged_dot_general", "triton"))
def test_ragged_dot_general_modes_with_sharded_batch(spec):
    """Mode 2 (ragged contraction over y: summed) and mode 3 (ragged batch over y), a batch
    dim over x and group_sizes replicated over it; mode 1 with its rows over y and its experts
    over x (each device's group_offset at its first expert), its gradients, and out_sharding
    honoured."""
    rng = np.random.default_rng(2)
    general = call(spec)
    k, m, n = 4, 16, 4
    mode2 = lax.RaggedDotDimensionNumbers((([2], [1]), ([0], [0])), [2], [])
    lhs2, rhs2 = _normal(rng, (2, k, m)), _normal(rng, (2, m, n))
    sizes2 = np.stack([SIZES, np.array([1, 1, 1, 10], np.int32)])
    mode3 = lax.RaggedDotDimensionNumbers((([2], [1]), ([0], [0])), [0], [])
    lhs3, rhs3 = _normal(rng, (8, 2, k)), _normal(rng, (8, k, n))
    sizes3 = np.array([2, 3, 1, 1], np.int32)
    lhs1, rhs1, d_out1 = _normal(rng, (m, k)), _normal(rng, (4, k, n)), _normal(rng, (m, n))
    with jax.set_mesh(_mesh()):

        @jax.jit  # one program: interpret-mode kernels cost a compilation each
        def run(lhs2, rhs2, lhs3, rhs3, lhs1, rhs1):
            out2 = general(lhs2, rhs2, jnp.asarray(sizes2), mode2)
            out3 = general(lhs3, rhs3, jnp.asarray(sizes3), mode3)
            out1, pullback = jax.vjp(lambda a, b: general(
                a, b, jnp.asarray(SIZES), BASIC, out_sharding=P(None, "x")), lhs1, rhs1)
            d_out = jax.sharding.reshard(jnp.asarray(d_out1), P(None, "x"))
            return out2, out3, out1, *pullback(d_out)

        put = jax.device_put
        out2, out3, out1, d_lhs1, d_rhs1 = run(
            put(lhs2, P("x", None, "y")), put(rhs2, P("x", "y", None)),
            put(lhs3, P("y", "x")), put(rhs3, P("y", None, None)),
            put(lhs1, P("y", None)), put(rhs1, P("x", None, None)))
        assert _spec(out2) == P(None, "x", None, None)  # the group dim leads, then batch
        assert _spec(out3) == P("y", "x", None)
        assert (_spec(out1), _spec(d_lhs1), _spec(d_rhs1)) == (P(None, "x"), P("y", None),
                                                                 P("x", None, None))
    want2 = _ragged64(lhs2, rhs2, sizes2, mode2)
    assert_close(out2, want2, jnp.float32, contraction=m)
    assert_close(out3, _ragged64(lhs3, rhs3, sizes3, mode3), jnp.float32, contraction=k)
    want_lhs1, want_rhs1, _ = reference.gmm_vjp(lhs1, rhs1, SIZES, d_out1)
    assert_close(out1, reference.gmm(lhs1, rhs1, SIZES), jnp.float32, contraction=k)
    assert_close(d_lhs1, want_lhs1, jnp.float32, contraction=n)
    assert_close(d_rhs1, want_rhs1, jnp.float32, contraction=m)


def _refusals():
    rng = np.random.default_rng(3)
    lhs, rhs = _normal(rng, (16, 8)), _normal(rng, (4, 8, 8))
    sizes = jnp.asarray(SIZES)
    gmm, tgmm = kernelhub.get(GMM), kernelhub.get(TGMM)
    general = kernelhub.get("ragged_dot_general")
    mode2 = lax.RaggedDotDimensionNumbers((([0], [0]), ([], [])), [0], [])
    put = jax.device_put
    return [
        ("lhs's dim 1 is sharded over 'x', but it is a contracting dim",
         lambda: gmm(put(lhs, P(None, "x")), put(rhs, P(None, "x", None)), sizes)),
        ("group_sizes' dim 0 is sharded over 'x', but it holds the groups",
         lambda: gmm(put(lhs, P()), rhs, put(sizes, P("x")))),
        ("existing_out cannot be given while rhs's group dim is sharded",
         lambda: gmm(lhs, put(rhs, P("x")), sizes, existing_out=np.zeros((16, 8), np.float32))),
        ("existing_out's dim 0 is sharded over 'y' but lhs's dim 0",
         lambda: gmm(put(lhs, P("x")), rhs, sizes, existing_out=put(np.zeros((16, 8), np.float32),
                                                                    P("y")))),
        ("mesh axis 'x' shards both lhs's dim 0 and rhs's dim 2",
         lambda: gmm(put(lhs, P("x")), put(rhs, P(None, None, "x")), sizes)),
        ("existing_out cannot be given while the ragged contracting dim is sharded",
         lambda: tgmm(put(lhs.T, P(None, "x")), put(lhs, P("x")), sizes,
                      existing_out=np.zeros((4, 8, 8), np.float32))),
        ("activation cannot be given while the ragged contracting dim is sharded",
         lambda: general(put(lhs, P("x")), put(lhs, P("x")), sizes, mode2, activation="relu")),
        ("lhs is quantized and sharded over explicit mesh axes",
         lambda: gmm(kernelhub.quantize(put(lhs, P("x")), jnp.int8, axis=1), rhs, sizes)),
        ("out_sharding must be a jax.sharding.PartitionSpec or NamedSharding",
         lambda: kernelhub.get("ragged_dot")(put(lhs, P("x")), rhs, sizes, out_sharding="x")),
    ]


@pytest.mark.parametrize("index", range(9))
def test_layouts_no_kernel_can_split_are_refused(index):
    with jax.set_mesh(_mesh()):
        message, bad_call = _refusals()[index]
        with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(")):
            bad_call()
