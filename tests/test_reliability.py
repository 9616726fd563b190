"""What kernelhub promises under bad input, threads and hostile files (issue 23;
docs/contract.md, "What kernelhub promises under bad input"). One command runs them all:

    pytest tests/test_reliability.py
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernelhub
import kernelhub.export
import reference
from conftest import assert_close, call, implementation_params
from kernelhub import tuning
from kernelhub._grouped_matmul import tables
from slices import each_value_once

GMM = "grouped_matmul"
TGMM = "transposed_grouped_matmul"
INT32_MAX = 2**31 - 1


def _subprocess(script: str, **environment: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu", **environment)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, text=True,
                          capture_output=True, timeout=300)


# ---------------------------------------------------------------- 1. sizes whose sums wrap

WRAPPING_SIZES = [pytest.param([2**30, 2**30, 5], id="2^30+2^30"),
                  pytest.param([INT32_MAX, INT32_MAX, 3], id="max+max"),
                  pytest.param([5, INT32_MAX, INT32_MAX], id="5+max+max")]


# Every implementation and every wrapping pattern at least once, not every pair: the
# boundaries are summed and clamped by one shared function (_grouped_matmul/groups.py), and
# each kernel reads its clamped bounds the same whatever the sizes were. tgmm's turn meets
# other patterns on each implementation than gmm's.
@pytest.mark.parametrize("spec, sizes", each_value_once(implementation_params(GMM),
                                                       WRAPPING_SIZES))
def test_gmm_sizes_whose_int32_sum_wraps_stay_in_bounds(spec, sizes):
    """Under jit (no value check) every boundary is clamped to the rows as if summed without
    wrapping: the first group to reach the end owns the rest, and nothing is left unwritten."""
    rng = np.random.default_rng(0)
    m, k, n = 16, 8, 8
    lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
    rhs = jnp.asarray(rng.standard_normal((3, k, n)), jnp.float32)
    out = jax.jit(call(spec))(lhs, rhs, jnp.asarray(sizes, jnp.int32))
    assert_close(out, reference.gmm(lhs, rhs, sizes), jnp.float32, contraction=k)


@pytest.mark.parametrize("spec, sizes", each_value_once(implementation_params(TGMM),
                                                       WRAPPING_SIZES, turn=1))
def test_tgmm_sizes_whose_int32_sum_wraps_stay_in_bounds(spec, sizes):
    rng = np.random.default_rng(1)
    m, k, n = 16, 8, 8
    lhs = jnp.asarray(rng.standard_normal((k, m)), jnp.float32)
    rhs = jnp.asarray(rng.standard_normal((m, n)), jnp.float32)
    out = jax.jit(call(spec))(lhs, rhs, jnp.asarray(sizes, jnp.int32))
    assert_close(out, reference.tgmm(lhs, rhs, sizes), jnp.float32, contraction=m)


@pytest.mark.parametrize("spec", implementation_params("ragged_dot"))
def test_ragged_dot_sizes_whose_int32_sum_wraps_stay_in_bounds(spec):
    lhs, rhs = jnp.ones((16, 8)), jnp.arange(3 * 8 * 4, dtype=jnp.float32).reshape(3, 8, 4)
    sizes = [2**30, 2**30, 5]
    out = jax.jit(call(spec))(lhs, rhs, jnp.asarray(sizes, jnp.int32))
    assert_close(out, reference.gmm(lhs, rhs, sizes), jnp.float32, contraction=8)


# ---------------------------------------------------------------- 3, 4. threads


def test_first_use_from_several_threads():
    """A fresh interpreter whose first use of kernelhub comes from three threads at once, each
    through another entry point."""
    script = """
        import threading
        import jax.numpy as jnp
        import kernelhub

        barrier = threading.Barrier(3)
        failures = []

        def run(work):
            barrier.wait()
            try:
                work()
            except Exception as error:
                failures.append(repr(error))

        lhs, rhs, sizes = jnp.ones((8, 4)), jnp.ones((2, 4, 4)), jnp.asarray([3, 5], jnp.int32)
        works = [
            lambda: kernelhub.tuning.heuristic(),
            lambda: kernelhub.export.export(kernelhub.grouped_matmul, lhs, rhs, sizes,
                                            platforms=("cpu",)),
            lambda: kernelhub.parallel.route(jnp.zeros((4, 2), jnp.int32), 4),
        ]
        threads = [threading.Thread(target=run, args=(work,)) for work in works]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not failures, failures
        print("ok")
    """
    for _ in range(2):  # a fresh interpreter each, about 3 s
        done = _subprocess(script)
        assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_one_table_entered_from_two_threads():
    """Each thread's `with table:` block is its own: one thread leaving it leaves the other
    inside, and neither ends up in the other's context."""
    table = tuning.Tuning()
    inside, left = threading.Barrier(2), threading.Barrier(2)
    seen = {}

    def first():
        with table:
            inside.wait()
            left.wait()  # the second thread has left its block by now
            seen["first, inside"] = tables.active()
        seen["first, after"] = tables.active()

    def second():
        with tuning.heuristic():
            with table:
                inside.wait()
            seen["second, after"] = tables.active()
            left.wait()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen["first, inside"] is table
    assert seen["first, after"] is None
    assert seen["second, after"] is kernelhub._grouped_matmul.active_table.HEURISTIC


# ---------------------------------------------------------------- 5. tuning tables


@pytest.mark.parametrize("platform, tiling", [("xla", (12, 16, 8)), ("triton", (12, 16, 16, 4, 3))])
def test_a_table_entry_the_kernel_refuses_never_breaks_a_call(platform, tiling):
    gmm = kernelhub.get(GMM, platform=platform)
    lhs, rhs, sizes = jnp.ones((32, 16)), jnp.ones((2, 16, 16)), jnp.asarray([10, 22], jnp.int32)
    recorder = tuning._autotune.Recorder()
    with kernelhub._grouped_matmul.active_table.activated(recorder):
        jax.eval_shape(gmm, lhs, rhs, sizes)
    (key,) = recorder.calls
    table = tuning.Tuning({key: tuning.Entry(tiling, tiling, 1.0, 1.0, "test")}, "hand.json")
    with table, pytest.warns(UserWarning, match=r"hand.json: tiling .* heuristic's tiling"):
        out = gmm(lhs, rhs, sizes)
    assert_close(out, reference.gmm(lhs, rhs, [10, 22]), jnp.float32, contraction=16)


# ---------------------------------------------------------------- 6. sizes int32 cannot hold


def test_sizes_int32_cannot_hold_are_refused_before_narrowing():
    lhs, rhs = jnp.ones((8, 4)), jnp.ones((2, 4, 3))
    with pytest.raises(ValueError, match=r"must fit in int32.*4294967295 at index 0"):
        kernelhub.grouped_matmul(lhs, rhs, np.asarray([2**32 - 1, 3], np.uint32))


def test_runtime_checks_see_sizes_before_the_int32_cast():
    """With x64 on, int64 sizes [2**32 + 5, 3] under jit are not read as [5, 3]."""
    # jax's x64 context, not a process started with it (4 s): jit traces and caches per setting.
    with jax.enable_x64(True):
        lhs, rhs = jnp.ones((8, 4), jnp.float32), jnp.ones((2, 4, 3), jnp.float32)
        f = jax.jit(lambda sizes: kernelhub.grouped_matmul(lhs, rhs, sizes))
        sizes = jnp.asarray([2**32 + 5, 3], jnp.int64)
        assert sizes.dtype == jnp.int64
        assert int((f(sizes)[:, 0] != 0).sum()) == 8  # saturated, not wrapped
        with pytest.raises(kernelhub.RuntimeCheckError, match="group_sizes must fit in int32"):
            with kernelhub.runtime_checks():
                jax.block_until_ready(f(sizes))


# ---------------------------------------------------------------- 7. runtime checks and export


def test_export_under_runtime_checks_leaves_them_out_with_one_warning():
    specs = (jax.ShapeDtypeStruct((8, 4), jnp.float32), jax.ShapeDtypeStruct((2, 4, 4), jnp.float32),
             jax.ShapeDtypeStruct((2,), jnp.int32))
    with kernelhub.runtime_checks(), pytest.warns(UserWarning, match="runtime checks are left out"):
        exported = kernelhub.export.export(kernelhub.grouped_matmul, *specs, platforms=("cpu",))
    restored = jax.export.deserialize(exported.serialize())
    out = restored.call(jnp.ones((8, 4)), jnp.ones((2, 4, 4)), jnp.asarray([3, 5], jnp.int32))
    assert_close(out, reference.gmm(np.ones((8, 4)), np.ones((2, 4, 4)), [3, 5]), jnp.float32,
                 contraction=4)


# ---------------------------------------------------------------- 8. rebuilt QuantizedArrays


def _rebuilt(quantized, **replace):
    leaves, tree = jax.tree.flatten(quantized)
    names = ("values", "scale")
    return jax.tree.unflatten(tree, [replace.get(name, leaf) for name, leaf in zip(names, leaves)])


@pytest.mark.parametrize("replace, error, message", [
    (lambda q: {"scale": jnp.ones((1, 1, 16), jnp.float32)}, ValueError, "rhs: scale must have shape"),
    (lambda q: {"scale": q.scale.astype(jnp.int32)}, TypeError, "rhs: scale must have dtype float32"),
    (lambda q: {"scale": jnp.ones((2, 3, 16), jnp.float32)}, ValueError, "rhs: scale must have shape"),
])
def test_a_quantized_array_rebuilt_from_leaves_is_checked(replace, error, message):
    rhs = kernelhub.quantize(jnp.ones((2, 16, 16)), jnp.int8, axis=1, block_size=8)
    bad = _rebuilt(rhs, **replace(rhs))
    with pytest.raises(error, match=message):
        kernelhub.grouped_matmul(jnp.ones((8, 16)), bad, jnp.asarray([3, 5], jnp.int32))


# ---------------------------------------------------------------- 9. autotune, again and again


def test_autotune_works_again_and_again():
    # 32 rows: few tuning candidates (a compilation each), and still an entry for every pass.
    lhs, rhs, sizes = jnp.ones((32, 16)), jnp.ones((4, 16, 16)), jnp.asarray([8] * 4, jnp.int32)
    kernelhub.grouped_matmul(lhs, rhs, sizes)  # an eager call first, as in a notebook
    forward, every_pass = {"forward"}, set(tuning.PASSES)
    for round_ in range(2):
        def loss(x, w, s):
            return kernelhub.grouped_matmul(x, w, s).sum()

        # A jitted function, then a new one of the same shapes; after jax's caches are
        # cleared, the gradient, whose trace records every pass. (An unjitted function traces
        # as a jitted one.)
        again = jax.jit(lambda x, w, s: loss(x, w, s))
        fns = (((jax.jit(loss), forward), (again, forward)) if round_ == 0
               else ((jax.grad(loss), every_pass),))
        for fn, passes in fns:
            table = kernelhub.autotune(fn, lhs, rhs, sizes, repeats=1, draws=1, progress=False)
            assert {key.pass_name for key in table.entries} == passes, (round_, fn)
        jax.clear_caches()


# ---------------------------------------------------------------- 10. one clean error


def test_a_failed_runtime_check_logs_no_traceback(caplog):
    f = jax.jit(lambda sizes: kernelhub.grouped_matmul(jnp.ones((8, 4)), jnp.ones((2, 4, 3)), sizes))
    with caplog.at_level(logging.DEBUG), pytest.raises(kernelhub.RuntimeCheckError):
        with kernelhub.runtime_checks():
            jax.block_until_ready(f(jnp.asarray([3, 9], jnp.int32)))
    assert "callback failed" not in caplog.text
