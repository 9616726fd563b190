"""kernelhub.ragged_dot(_general): jax.lax's API in every mode, on every implementation.

Forward and gradients against an independent float64 reference (tests/ragged_reference.py,
differentiated by kernelhub.testing in float64); forward against jax.lax.ragged_dot_general
itself as a peer (on XLA, which ties the reference to lax); group_offset chains; lax's
signature and dtype rules; bad dimension numbers; and the lowered HLO, which must not copy rhs
to change its layout.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import kernelhub
import kernelhub.export
import ragged_reference
from conftest import implementation_params
from kernelhub import testing
from kernelhub._verify import tpu_ahead_of_time as ahead_of_time
from strategies import PATTERNS, normal, sizes_for

GENERAL = "ragged_dot_general"
Numbers = lax.RaggedDotDimensionNumbers


@dataclasses.dataclass(frozen=True)
class Layout:
    name: str
    lhs_shape: tuple[int, ...]
    rhs_shape: tuple[int, ...]
    numbers: Numbers
    sizes: tuple  # [g] or nested [*prefix, g]
    offset: int | None = None
    dtypes: tuple = (jnp.float32, jnp.float32)
    preferred: object = None
    # Also run on the interpret-mode kernels (they are slow). Transposed operands, batch axes,
    # mode 2 and mode 3 are the kit's rearrangements (ragged_modes.py), the same for every
    # backend: XLA takes every layout. The interpreters take what reaches their kernels'
    # own code, mode 1: rhs read transposed in bf16 (an empty group, a sum below m), and
    # group_offset in mixed dtypes; m1 basic's float32 problem is theirs in
    # test_sizes_summing_past_the_ragged_axis_mean_what_they_mean_in_lax. Their gradients run
    # each interpreter's transposed_grouped_matmul on the call mode 2 makes ([k, m] x [m, n],
    # with and without group_offset; tests/test_ragged_dot_dtypes.py runs mode 2 itself there),
    # and mode 3 is a grouped_matmul whose leading group is not local, as under group_offset.
    interpret: bool = True

    def case(self, seed: int = 0) -> testing.Case:
        rng = np.random.default_rng(seed)
        lhs = jnp.asarray(normal(rng, self.lhs_shape, self.dtypes[0]))
        rhs = jnp.asarray(normal(rng, self.rhs_shape, self.dtypes[1]))
        offset = None if self.offset is None else jnp.array([self.offset], jnp.int32)
        return testing.Case(lhs, rhs, jnp.asarray(self.sizes, jnp.int32), self.numbers,
                            preferred_element_type=self.preferred, group_offset=offset).named(self.name)


def _n(contract, batch, ragged, groups=()):
    return Numbers((contract, batch), ragged, groups)


LAYOUTS = [
    # Mode 1: a free lhs axis is ragged; rhs has a group axis.
    Layout("m1 basic, sum below m", (37, 9), (4, 9, 7), _n(([1], [1]), ([], []), [0], [0]),
           (10, 0, 15, 7), interpret=False),
    Layout("m1 rhs [g, n, k] bf16, sum below m", (30, 9), (4, 7, 9),
           _n(([1], [2]), ([], []), [0], [0]), (10, 0, 15, 2), dtypes=(jnp.bfloat16, jnp.bfloat16)),
    Layout("m1 lhs [k, m], rhs [k, g, n]", (9, 25), (9, 3, 6), _n(([0], [0]), ([], []), [1], [1]),
           (10, 0, 13), interpret=False),
    Layout("m1 batch dims", (2, 11, 5), (3, 2, 5, 4), _n(([2], [2]), ([0], [1]), [1], [0]),
           ((2, 0, 9), (5, 5, 1)), interpret=False),
    Layout("m1 free axes around the ragged one", (2, 6, 3, 4), (3, 4, 5),
           _n(([3], [1]), ([], []), [1], [0]), ((1, 4, 1), (0, 2, 3)), interpret=False),
    Layout("m1 two contracting axes", (13, 3, 4), (2, 4, 3, 5), _n(([1, 2], [2, 1]), ([], []), [0], [0]),
           (6, 7), interpret=False),
    Layout("m1 group_offset, mixed dtypes", (24, 8), (2, 8, 5), _n(([1], [1]), ([], []), [0], [0]),
           (4, 7, 9, 4), offset=1, dtypes=(jnp.bfloat16, jnp.float32)),
    # Mode 2: a contracting axis is ragged; the result has a leading group axis.
    Layout("m2 [m, k] x [m, n], the weight gradient", (37, 6), (37, 5), _n(([0], [0]), ([], []), [0]),
           (10, 0, 15, 7), interpret=False),
    Layout("m2 [k, m] x [m, n] bf16 out", (6, 30), (30, 5), _n(([1], [0]), ([], []), [1]),
           (10, 3, 17), dtypes=(jnp.bfloat16, jnp.bfloat16), interpret=False),
    Layout("m2 batch dims", (2, 10, 3), (2, 10, 4), _n(([1], [1]), ([0], [0]), [1]),
           ((4, 6), (0, 9)), interpret=False),
    Layout("m2 contracting axis before the ragged one", (3, 2, 8), (2, 8, 4),
           _n(([1, 2], [0, 1]), ([], []), [2]), ((3, 5), (8, 0)), interpret=False),
    Layout("m2 group_offset", (20, 4), (20, 3), _n(([0], [0]), ([], []), [0]), (5, 5, 6, 4),
           offset=1, interpret=False),
    # Mode 3: a batch axis is ragged.
    Layout("m3 basic, sum below b", (7, 4, 5), (7, 5, 3), _n(([2], [1]), ([0], [0]), [0]), (2, 4),
           interpret=False),
    Layout("m3 group_offset", (7, 4, 5), (7, 5, 3), _n(([2], [1]), ([0], [0]), [0]), (2, 4, 1),
           offset=1, interpret=False),
    Layout("m3 batch axes around the ragged one", (2, 5, 2, 3, 4), (2, 5, 2, 4, 6),
           _n(([4], [3]), ([0, 1, 2], [0, 1, 2]), [1]), ((2, 3), (5, 0)), interpret=False),
    Layout("m3 rhs [b, n, k]", (6, 3, 4), (6, 5, 4), _n(([2], [2]), ([0], [0]), [0]), (1, 5),
           dtypes=(jnp.bfloat16, jnp.bfloat16), interpret=False),
]


def exactly_zero_outside_the_groups(arguments, out) -> None:
    """Where no local group reaches (the reference on all-ones inputs is 0 there), exactly 0."""
    ones = {**arguments, "lhs": np.ones(arguments["lhs"].shape), "rhs": np.ones(arguments["rhs"].shape)}
    with jax.enable_x64(True):
        reached = np.asarray(ragged_reference.ragged_dot_general(**ones)) != 0
    assert (np.asarray(out, np.float32)[~reached] == 0).all()
    assert reached.any() or not np.asarray(out, np.float32).any()


def _run_layouts(spec, reference, gradients=True, layouts=LAYOUTS):
    cases = [layout.case(i) for i, layout in enumerate(layouts)
             if layout.interpret or not spec.interpret_only]
    return testing.check_implementations(GENERAL, reference, cases, gradients=gradients,
                                         check=exactly_zero_outside_the_groups,
                                         implementations=[spec])


def lax_peer(lhs, rhs, group_sizes, ragged_dot_dimension_numbers, **_):
    return lax.ragged_dot_general(lhs, rhs, group_sizes, ragged_dot_dimension_numbers)


# lax has no group_offset, and computes mode 3 entries past the groups: full sizes there.
LAX_COMPARABLE = [layout for layout in LAYOUTS if layout.offset is None
                  and (ragged_reference.mode_of(layout.numbers, len(layout.lhs_shape)) != 3
                       or np.sum(layout.sizes, axis=-1).min() == layout.lhs_shape[0])]
LAX_COMPARABLE.append(dataclasses.replace(LAYOUTS[12], name="m3 full sizes", sizes=(3, 4)))


@pytest.mark.parametrize("spec", implementation_params(GENERAL))
def test_every_mode_against_the_float64_reference_and_lax(spec):
    """Forward and gradients against the float64 reference; then the forward against lax
    itself where lax is defined, in the same test, so that it reuses the forward's
    compilations. The interpreters are held to the reference only: XLA's run ties the
    reference to lax on every layout they take but group_offset's, which lax lacks."""
    _run_layouts(spec, ragged_reference.ragged_dot_general).assert_ok()
    if not spec.interpret_only:
        _run_layouts(spec, lax_peer, gradients=False, layouts=LAX_COMPARABLE).assert_ok()



def drawn_layout(rng: np.random.Generator, mode: int) -> testing.Case:
    """A layout of `mode` no list above names: 0 to 2 batch dims (at least 1 in mode 3), 1 or 2
    contracting dims, free dims on each side (the ragged one among lhs's in mode 1), every dim
    of each operand in a random order, pairs matched in a random order; sizes over lax's prefix
    axes or not, in the contract suite's patterns (tests/strategies.py), sometimes past the
    ragged axis; group_offset or not; f32 or bf16."""
    dims = {"batch": [int(rng.integers(1, 5)) for _ in range(rng.integers(int(mode == 3), 3))],
            "contract": [int(rng.integers(1, 5)) for _ in range(rng.integers(1, 3))],
            "lhs_free": [int(rng.integers(1, 5)) for _ in range(rng.integers(int(mode == 1), 3))],
            "rhs_free": [int(rng.integers(1, 5)) for _ in range(rng.integers(0, 3))]}
    ragged_kind = {1: "lhs_free", 2: "contract", 3: "batch"}[mode]
    ragged_index = int(rng.integers(len(dims[ragged_kind])))
    dims[ragged_kind][ragged_index] = int(rng.integers(1, 13))
    groups = int(rng.integers(1, 5))
    local = int(rng.integers(1, groups + 1)) if rng.random() < 0.3 else groups
    offset = int(rng.integers(0, groups - local + 1)) if local < groups else None

    def order(kinds):
        axes = [(kind, i) for kind in kinds
                for i in range(len(dims[kind]) if kind != "group" else 1)]
        return [axes[i] for i in rng.permutation(len(axes))]

    lhs_axes = order(("batch", "contract", "lhs_free"))
    rhs_axes = order(("batch", "contract", "rhs_free") + (("group",) if mode == 1 else ()))
    lhs_shape = tuple(dims[kind][i] for kind, i in lhs_axes)
    rhs_shape = tuple(local if kind == "group" else dims[kind][i] for kind, i in rhs_axes)
    pairs = {kind: [int(i) for i in rng.permutation(len(dims[kind]))]
             for kind in ("batch", "contract")}
    numbers = Numbers(
        tuple(([lhs_axes.index((kind, i)) for i in pairs[kind]],
               [rhs_axes.index((kind, i)) for i in pairs[kind]]) for kind in ("contract", "batch")),
        [lhs_axes.index((ragged_kind, ragged_index))],
        [rhs_axes.index(("group", 0))] if mode == 1 else [])
    extent = lhs_shape[numbers.lhs_ragged_dimensions[0]]
    prefix = ragged_reference.prefix_axes(numbers, len(lhs_shape))
    prefix_shape = tuple(lhs_shape[a] for a in prefix) if prefix and rng.random() < 0.4 else ()
    sizes = np.zeros(prefix_shape + (groups,), np.int32)
    for index in np.ndindex(*prefix_shape):
        sizes[index] = sizes_for(str(rng.choice(PATTERNS)), extent, groups, rng)
        if rng.random() < 0.15:  # past the ragged axis: lax drops the excess
            sizes[index][rng.integers(groups)] += int(rng.integers(1, 5))
    dtype = jnp.bfloat16 if rng.random() < 0.25 else jnp.float32
    return testing.Case(
        jnp.asarray(normal(rng, lhs_shape, dtype)), jnp.asarray(normal(rng, rhs_shape, dtype)),
        jnp.asarray(sizes), numbers,
        group_offset=None if offset is None else jnp.array([offset], jnp.int32),
    ).named(f"mode {mode}: lhs {lhs_shape}, rhs {rhs_shape}, {numbers}, sizes {sizes.tolist()}, "
            f"offset {offset}, {jnp.dtype(dtype).name}")


@pytest.mark.parametrize("mode", [1, 2, 3])
def test_drawn_layouts_against_the_float64_reference(mode):
    """How the kit maps a mode's dims onto the grouped matmuls (ragged_modes.py) is the same
    for every backend, so XLA takes the drawn layouts, forward and gradients: 3 a mode here.
    (On 2026-11-29 the same kind of draw ran 400 layouts on XLA and 100 on each of the Mosaic
    GPU and Pallas TPU interpreters: none failed.)"""
    xla = next(spec for spec in testing.runnable_implementations(GENERAL)
               if spec.platform.value == "xla")
    testing.check_implementations(GENERAL, ragged_reference.ragged_dot_general,
                                  functools.partial(drawn_layout, mode=mode), examples=3,
                                  check=exactly_zero_outside_the_groups, seed=mode,
                                  implementations=[xla]).assert_ok()


# Sizes summing past the ragged axis, which lax takes: the first groups own the indices that
# exist and the excess is dropped. BIG + BIG wraps in int32 arithmetic. The layouts reuse shapes
# (and so compilations) of LAYOUTS, except qwix's own case (XLA only: a new shape costs an
# interpret-mode kernel seconds). Mode 3 hands the kernels sizes it computed, always within
# their rows, and mode 2 hands transposed_grouped_matmul the call mode 1's rhs gradient makes:
# XLA takes both; the interpreters take mode 1 on m1 basic's problem, with its gradients. The
# int32 wrap is the same at any row count: m1 basic's rows take it, qwix's 128 its pattern.
BIG = 2**31 - 1
PAST_THE_AXIS = [
    Layout("m1 qwix's sizes (128, 100, 0, 28) on 128 rows", (128, 8), (4, 8, 8),
           _n(([1], [1]), ([], []), [0], [0]), (128, 100, 0, 28), interpret=False),
    dataclasses.replace(LAYOUTS[0], name="m1 qwix's pattern on 37 rows", sizes=(37, 30, 0, 8),
                        interpret=True),
    dataclasses.replace(LAYOUTS[0], name="m1 sums past int32", sizes=(30, BIG, BIG, 1),
                        interpret=True),
    dataclasses.replace(LAYOUTS[4], name="m1 sums past int32, 3 rows per ragged index",
                        sizes=((BIG, BIG, 1), (4, 5, 0))),
    dataclasses.replace(LAYOUTS[7], name="m2 a group cut", sizes=(20, 20, 3)),
    dataclasses.replace(LAYOUTS[7], name="m2 sums past int32", sizes=(BIG, BIG, 3)),
    dataclasses.replace(LAYOUTS[12], name="m3 a group cut", sizes=(5, 4), interpret=False),
    dataclasses.replace(LAYOUTS[13], name="m3 sums past int32, group_offset", sizes=(3, BIG, BIG),
                        interpret=False),
]


def _lax_vjp(cotangent, /, lhs, rhs, group_sizes, ragged_dot_dimension_numbers, **_):
    with jax.enable_x64(True):
        _, vjp = jax.vjp(lambda a, b: lax.ragged_dot_general(a, b, group_sizes,
                                                              ragged_dot_dimension_numbers),
                         jnp.asarray(lhs, jnp.float64), jnp.asarray(rhs, jnp.float64))
        return dict(zip(("lhs", "rhs"), map(np.asarray, vjp(jnp.asarray(cotangent)))))


@pytest.mark.parametrize("spec", implementation_params(GENERAL))
def test_sizes_summing_past_the_ragged_axis_mean_what_they_mean_in_lax(spec):
    """Forward and gradients against the float64 reference (which cuts at the axis's end), in
    every mode; then against lax itself where lax is defined (no int32 wrap): the forward, and
    in mode 1 (the only one lax differentiates) its float64 gradients. The interpreters are
    held to the reference only, which XLA's run ties to lax wherever lax is defined."""
    _run_layouts(spec, ragged_reference.ragged_dot_general, layouts=PAST_THE_AXIS).assert_ok()
    if spec.interpret_only:
        return
    for index, layout in enumerate(PAST_THE_AXIS):
        if np.sum(layout.sizes, axis=-1, dtype=np.int64).max() >= 2**31:
            continue
        mode_1 = ragged_reference.mode_of(layout.numbers, len(layout.lhs_shape)) == 1
        testing.check_implementations(
            GENERAL, lax_peer, [layout.case(index)], gradients=mode_1, reference_vjp=_lax_vjp,
            implementations=[spec]).assert_ok()


def test_sums_past_the_ragged_axis_are_reported_under_runtime_checks_only():
    """lax-valid, so no error by default, eager or traced; kernelhub.runtime_checks() reports
    them (eager and traced), as grouped_matmul, whose contract forbids them, always does."""
    lhs, rhs = jnp.ones((8, 4)), jnp.ones((2, 4, 3))
    sizes = jnp.array([6, 5], jnp.int32)
    np.testing.assert_array_equal(kernelhub.ragged_dot(lhs, rhs, sizes), lax.ragged_dot(lhs, rhs, sizes))
    traced = jax.jit(kernelhub.ragged_dot_general, static_argnums=3)
    np.testing.assert_array_equal(traced(lhs, rhs, sizes, BASIC), lax.ragged_dot(lhs, rhs, sizes))
    for call in (kernelhub.ragged_dot, jax.jit(kernelhub.ragged_dot)):
        with pytest.raises(kernelhub.RuntimeCheckError, match="sum to 11, more than the 8 rows"):
            with kernelhub.runtime_checks():
                jax.block_until_ready(call(lhs, rhs, sizes))
    with pytest.raises(ValueError, match="sum to 11, more than the 8 rows .*grouped_matmul"):
        kernelhub.grouped_matmul(lhs, rhs, sizes)


def _reference(*args, **kwargs) -> np.ndarray:
    with jax.enable_x64(True):
        return np.asarray(ragged_reference.ragged_dot_general(*args, **kwargs))


def test_group_offset_shards_add_up_to_the_whole():
    """Experts split over 3 shards of 2: mode 1 outputs add up, mode 2 outputs' first 2 entries
    are each shard's groups; the float64 reference of the unsharded call decides."""
    rng = np.random.default_rng(4)
    sizes = jnp.array([3, 0, 7, 5, 2, 4], jnp.int32)
    lhs, rhs = jnp.asarray(normal(rng, (23, 6), jnp.float32)), jnp.asarray(normal(rng, (6, 6, 4), jnp.float32))
    numbers = kernelhub.ops.ragged_dot.BASIC_DIMENSION_NUMBERS
    whole = _reference(lhs, rhs, sizes, numbers)
    summed = sum(np.asarray(kernelhub.ragged_dot(lhs, rhs[2 * s:2 * s + 2], sizes,
                                                 group_offset=jnp.array([2 * s])), np.float64)
                 for s in range(3))
    np.testing.assert_allclose(summed, whole, rtol=2e-5, atol=2e-5)

    gradient = Numbers((([0], [0]), ([], [])), [0], [])
    x, dy = lhs, jnp.asarray(normal(rng, (23, 5), jnp.float32))
    whole = _reference(x, dy, sizes, gradient)
    parts = [np.asarray(kernelhub.ragged_dot_general(x, dy, sizes, gradient, group_offset=2 * s))[:2]
             for s in range(3)]
    np.testing.assert_allclose(np.concatenate(parts), whole, rtol=2e-5, atol=2e-5)
    # Past the last group, mode 2's entries are exactly 0.
    tail = np.asarray(kernelhub.ragged_dot_general(x, dy, sizes, gradient, group_offset=4))
    assert (tail[2:] == 0).all()


def test_signatures_and_result_dtypes_are_laxs():
    for ours, theirs in ((kernelhub.ragged_dot, lax.ragged_dot),
                         (kernelhub.ragged_dot_general, lax.ragged_dot_general)):
        mine = [(p.name, p.default) for p in inspect.signature(ours).parameters.values()]
        lax_ = [(p.name, p.default) for p in inspect.signature(theirs).parameters.values()]
        # lax's, then kernelhub's fused activation (tokamax's argument) after them
        assert mine == lax_ + [("activation", None)]
    sizes = jnp.array([2, 4], jnp.int32)
    # A result's dtype is settled when the call is traced (an eager call traces it too):
    # jax.eval_shape reads it without compiling.
    for lhs_dtype, rhs_dtype, preferred in [(jnp.bfloat16, jnp.bfloat16, None),
                                            (jnp.bfloat16, jnp.float32, None),
                                            (jnp.bfloat16, jnp.bfloat16, jnp.float32),
                                            (jnp.float32, jnp.float32, jnp.bfloat16)]:
        lhs, rhs = jnp.ones((6, 3), lhs_dtype), jnp.ones((2, 3, 2), rhs_dtype)
        ours = jax.eval_shape(functools.partial(kernelhub.ragged_dot,
                                                preferred_element_type=preferred), lhs, rhs, sizes)
        theirs = jax.eval_shape(functools.partial(lax.ragged_dot,
                                                  preferred_element_type=preferred), lhs, rhs, sizes)
        assert ours.dtype == theirs.dtype, (lhs_dtype, rhs_dtype, preferred)


def test_forcing_reaches_the_kernels_of_that_platform(platform_variable):
    lhs, rhs, sizes = jnp.ones((8, 4)), jnp.ones((2, 4, 3)), jnp.array([3, 5], jnp.int32)
    assert kernelhub.resolve("ragged_dot").platform is kernelhub.Platform.XLA
    pallas = kernelhub.get("ragged_dot", platform="pallas")
    assert pallas.resolve().interpret_only
    np.testing.assert_allclose(pallas(lhs, rhs, sizes), np.full((8, 3), 4.0))
    platform_variable("triton")
    assert kernelhub.resolve("ragged_dot_general").platform is kernelhub.Platform.TRITON
    # Unforced, one export holds each platform's grouped-matmul kernels.
    platform_variable(None)
    exported = kernelhub.export.export(lambda a, b, s: kernelhub.ragged_dot(a, b, s),
                                       lhs, rhs, sizes)
    assert kernelhub.export.kernels_by_platform(exported) == {
        "cpu": {}, "tpu": {"mosaic": 1}, "cuda": {"triton": 1}}


LHS, RHS, SIZES = jnp.ones((8, 4)), jnp.ones((2, 4, 3)), jnp.array([3, 5], jnp.int32)
BASIC = Numbers((([1], [1]), ([], [])), [0], [0])

BAD_NUMBERS = [
    ("RaggedDotDimensionNumbers", TypeError, dict(ragged_dot_dimension_numbers=((([1], [1]), ([], [])), [0], [0]))),
    ("exactly one lhs axis", ValueError, dict(ragged_dot_dimension_numbers=_n(([1], [1]), ([], []), [0, 1], [0]))),
    ("must be axes of lhs", ValueError, dict(ragged_dot_dimension_numbers=_n(([1], [1]), ([], []), [2], [0]))),
    ("must be axes of rhs", ValueError, dict(ragged_dot_dimension_numbers=_n(([1], [3]), ([], []), [0], [0]))),
    ("same size", ValueError, dict(ragged_dot_dimension_numbers=_n(([1], [2]), ([], []), [0], [0]))),
    ("as many contracting dims", ValueError, dict(ragged_dot_dimension_numbers=_n(([1], []), ([], []), [0], [0]))),
    ("repeats an axis", ValueError, dict(ragged_dot_dimension_numbers=_n(([1, 1], [1, 1]), ([], []), [0], [0]))),
    ("rhs_group_dimensions must hold one", ValueError, dict(ragged_dot_dimension_numbers=_n(([1], [1]), ([], []), [0], []))),
    ("must not be a contracting", ValueError, dict(ragged_dot_dimension_numbers=_n(([1], [1]), ([], []), [0], [1]))),
    ("rhs_group_dimensions must be empty", ValueError,
     dict(lhs=jnp.ones((8, 4)), rhs=jnp.ones((8, 3)), ragged_dot_dimension_numbers=_n(([0], [0]), ([], []), [0], [0]))),
    ("rhs must hold 2 groups", ValueError, dict(rhs=jnp.ones((3, 4, 3)))),
    ("rhs must hold 2 groups", ValueError, dict(rhs=jnp.ones((1, 4, 3)))),  # lax's rule, no offset
    ("rhs must hold between 1 and 2 groups", ValueError,
     dict(rhs=jnp.ones((3, 4, 3)), group_offset=0)),
    ("group_sizes must have shape", ValueError, dict(group_sizes=jnp.ones((2, 2), jnp.int32))),
    ("group_sizes", TypeError, dict(group_sizes=SIZES.astype(jnp.float32))),
    ("group_offset", ValueError, dict(rhs=jnp.ones((1, 4, 3)), group_offset=jnp.array([2]))),
    ("group_offset must be .*; its shape must be \\[1\\]", TypeError, dict(group_offset=jnp.array([0, 1]))),
    ("lhs must have dtype", TypeError, dict(lhs=LHS.astype(jnp.int16))),
    ("preferred_element_type", TypeError, dict(preferred_element_type=jnp.complex64)),
    ("precision", TypeError, dict(precision="very high")),
]


@pytest.mark.parametrize("message,error,changes", BAD_NUMBERS, ids=[m for m, _, _ in BAD_NUMBERS])
def test_bad_input_is_named_before_tracing(message, error, changes):
    arguments = dict(lhs=LHS, rhs=RHS, group_sizes=SIZES, ragged_dot_dimension_numbers=BASIC)
    arguments.update(changes)
    with pytest.raises(error, match=message):
        kernelhub.ragged_dot_general(**arguments)
    with pytest.raises(error, match=message):  # the same, traced: the checks are static
        jax.make_jaxpr(lambda: kernelhub.ragged_dot_general(**arguments))()


# The rows above that lax also refuses: it raises TypeError for each (its shape inference).
LAX_REFUSES = [row for row in BAD_NUMBERS if row[0] in (
    "exactly one lhs axis", "must be axes of lhs", "must be axes of rhs", "same size",
    "as many contracting dims", "rhs_group_dimensions must hold one", "must not be a contracting",
    "rhs_group_dimensions must be empty", "rhs must hold 2 groups", "group_sizes must have shape",
    "group_sizes")]


@pytest.mark.parametrize("message,error,changes", LAX_REFUSES, ids=[m for m, _, _ in LAX_REFUSES])
def test_what_lax_refuses_is_refused_with_an_error_of_laxs_type(message, error, changes):
    """Code that catches TypeError around lax's ragged_dot_general catches kernelhub's error;
    code that caught kernelhub's ValueError still does (kernelhub.ShapeError is both)."""
    del error
    arguments = dict(lhs=LHS, rhs=RHS, group_sizes=SIZES, ragged_dot_dimension_numbers=BASIC)
    arguments.update(changes)
    with pytest.raises(TypeError):
        lax.ragged_dot_general(**arguments)
    with pytest.raises(TypeError, match=message) as raised:
        kernelhub.ragged_dot_general(**arguments)
    assert "\n" not in str(raised.value)
    if raised.type is not TypeError:  # a dtype is a TypeError only, as in lax
        assert raised.type is kernelhub.ShapeError and isinstance(raised.value, ValueError)


def test_simple_ragged_dot_refuses_as_lax_does():
    """The group count and the contraction, through ragged_dot's own checks (the annotations)."""
    for rhs in (jnp.ones((3, 4, 3)), jnp.ones((1, 4, 3)), jnp.ones((2, 5, 3)), jnp.ones((4, 3))):
        with pytest.raises(TypeError):
            lax.ragged_dot(LHS, rhs, SIZES)
        with pytest.raises(kernelhub.ShapeError):
            kernelhub.ragged_dot(LHS, rhs, SIZES)
    with pytest.raises(kernelhub.ShapeError, match="group_sizes must .* shape"):
        kernelhub.ragged_dot(LHS, RHS, jnp.ones((2, 2), jnp.int32))
    # with group_offset, rhs holds the local groups only: fewer than group_sizes' count
    out = kernelhub.ragged_dot(LHS, RHS[:1], SIZES, group_offset=1)
    np.testing.assert_array_equal(np.asarray(out[:3]), 0)
    np.testing.assert_allclose(np.asarray(out[3:]), 4.0)


def _transposes_of(text: str, shape: tuple[int, ...], dtype: str = "f32") -> int:
    operand = "tensor<" + "x".join(map(str, shape)) + f"x{dtype}>"
    return sum(1 for line in text.splitlines()
               if "stablehlo.transpose" in line and f"({operand})" in line)


@pytest.mark.parametrize("rhs_layout", ["[g, k, n]", "[g, n, k]"])
def test_rhs_is_read_in_its_own_layout_forward_and_backward(rhs_layout):
    """As JAX's ragged-dot tests do: the lowered HLO must not transpose rhs, in either layout,
    whose contraction the kernels read in place (transpose_rhs)."""
    m, k, n, g = 64, 32, 16, 4
    transposed = rhs_layout == "[g, n, k]"
    rhs_shape = (g, n, k) if transposed else (g, k, n)
    numbers = _n(([1], [2 if transposed else 1]), ([], []), [0], [0])
    sizes = jnp.array([10, 20, 0, 30], jnp.int32)

    def loss(lhs, rhs):
        return jnp.sum(kernelhub.ragged_dot_general(lhs, rhs, sizes, numbers) ** 2)

    args = (jax.ShapeDtypeStruct((m, k), jnp.float32), jax.ShapeDtypeStruct(rhs_shape, jnp.float32))
    forward = jax.jit(lambda a, b: kernelhub.ragged_dot_general(a, b, sizes, numbers)).lower(*args).as_text()
    backward = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(*args).as_text()
    assert _transposes_of(forward, rhs_shape) == 0 and _transposes_of(backward, rhs_shape) == 0
    assert _transposes_of(forward, (m, k)) == 0


TPU_MODES = [
    ("mode 1", (512, 256), (8, 256, 256), _n(([1], [1]), ([], []), [0], [0]), 8),
    ("mode 2", (512, 256), (512, 256), _n(([0], [0]), ([], []), [0]), 8),
    ("mode 3", (32, 16, 256), (32, 256, 256), _n(([2], [1]), ([0], [0]), [0]), 4),
]


@pytest.mark.slow
@pytest.mark.skipif(not ahead_of_time.libtpu_available(), reason="needs libtpu (the tpu extra)")
@pytest.mark.parametrize("name,lhs_shape,rhs_shape,numbers,groups", TPU_MODES,
                         ids=[m[0] for m in TPU_MODES])
def test_every_mode_compiles_for_tpu_with_its_gradients(name, lhs_shape, rhs_shape, numbers, groups):
    """The real Mosaic compiler, for a v5e chip: the layouts ragged_dot hands the kernels
    (one group per batch entry in mode 3, a transposed lhs in mode 2) must compile, forward
    and VJP, into Mosaic kernels."""
    import os

    from jax.experimental import topologies

    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    device = topologies.get_topology_desc(topology_name=ahead_of_time.TOPOLOGIES["v5e"],
                                          platform="tpu").devices[0]
    op = kernelhub.get(GENERAL, platform="pallas", backend="tpu")
    where = jax.sharding.SingleDeviceSharding(device)

    def loss(lhs, rhs, sizes):
        return jnp.sum(op(lhs, rhs, sizes, numbers, preferred_element_type=jnp.float32))

    specs = [jax.ShapeDtypeStruct(lhs_shape, jnp.bfloat16, sharding=where),
             jax.ShapeDtypeStruct(rhs_shape, jnp.bfloat16, sharding=where),
             jax.ShapeDtypeStruct((groups,), jnp.int32, sharding=where)]
    with jax.default_device(device):
        lowered = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(*specs)
    text = lowered.compile().as_text()
    assert text.count(f'custom_call_target="{ahead_of_time.MOSAIC_CALL}"') >= 3
