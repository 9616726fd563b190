"""One call, one kernel per target, chosen when XLA lowers the call.

A *target* is a place jax lowers for: cpu, cuda, rocm or tpu (the registry's "platform" is a
kernel's language, its "backend" the hardware). A dispatched call binds the primitive
`kernelhub_call`. Its parameters name the op and, for each target, the implementation chosen
for it. It has one lowering rule per target, and jax lowers each rule for its own target only. So
`jax.export(..., platforms=("cpu", "tpu", "cuda"))` of a function that calls a kernelhub op
holds the XLA loop in its CPU branch, the Mosaic kernel in its TPU branch and the Triton kernel
in its CUDA branch; a plain `jax.jit` lowers just the rule of the device it runs on.

The primitive carries everything else the implementations need through jax's transformations:

- gradients: a custom VJP around it. Its forward binds the primitive's FORWARD stage, which
  lowers the forward half of `jax.vjp` of the target's implementation: the outputs and the
  residuals that implementation's VJP keeps (those that are not inputs). Its backward binds the
  BACKWARD stage with the inputs, those residuals and the cotangents, which lowers the other
  half. So what an implementation's forward computes for its backward (a fused epilogue's
  pre-activation) is computed once. A residual the implementation named with
  `jax.ad_checkpoint.checkpoint_name` carries that name outside the primitive too, so a
  `jax.checkpoint` policy decides whether it is saved or recomputed. This needs the residuals
  of every target's implementation to have the same types (they cross the primitive, whose
  types are fixed before any target is lowered). Where they differ, or an implementation cannot
  be traced for them, the backward binds the primitive's pullback instead (parameter
  `pullbacks`), which lowers all of `jax.vjp` of the target's implementation from the inputs:
  its forward half runs again where the backward needs it. Either backward is differentiable
  in turn, by that pullback, as far as the implementation's own VJP is (plain jax code's is;
  loops with traced bounds and Pallas kernels are not);
- vmap: a batching rule that records the in_axes; rules lower `jax.vmap` of the implementation;
- shard_map: the output's manual axes come from tracing the implementation with the input's
  axes; the rule then lowers the implementation as shard_map(check_vma=False) would, which is
  what lets Pallas's interpreter (not aware of manual axes) run under the default checks.

Non-array arguments (dtypes, flags, tilings) are parameters: hashable, and static under jit.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir

from kernelhub._core import jax_internals as internals
from kernelhub._core import measured_choice
from kernelhub._core.manual_axes import unify_varying
from kernelhub._core.registry import Backend, KernelSpec, NoImplementationError, backend_of_target

# The targets: the platform names jax lowers for, each with its own rule.
TARGETS = ("cpu", "cuda", "rocm", "tpu")


@dataclasses.dataclass(frozen=True)
class Choices:
    """Per target: the implementation, or why there is none (raised if lowered for that
    target)."""

    entries: tuple[tuple[str, KernelSpec | str], ...]
    # Per target, the other implementations a call may lower instead when measurements say
    # they are faster for it (kernelhub/_core/measured_choice.py); none for a forced choice.
    alternates: tuple[tuple[str, tuple[KernelSpec, ...]], ...] = ()

    @classmethod
    def pinned(cls, spec: KernelSpec) -> Choices:
        """`spec` for every target it can lower for: a portable (`any`) one for all, one for a
        backend only for its own hardware's targets (Pallas would refuse a TPU or GPU kernel
        elsewhere with a message about interpret mode, and a CPU one, an interpreter, would
        run where the user asked for a kernel); elsewhere, the reason, raised if lowered
        there."""
        return cls(tuple((target, spec if _lowers_for(spec, target) else _only_for(spec))
                         for target in TARGETS))

    def of(self, target: str) -> KernelSpec:
        choice = dict(self.entries)[target]
        if not isinstance(choice, KernelSpec):
            raise NoImplementationError(f"cannot lower for {target}: {choice}")
        return choice

    def alternates_for(self, target: str) -> tuple[KernelSpec, ...]:
        return dict(self.alternates).get(target, ())

    def shape_source(self) -> KernelSpec:
        """The implementation whose trace gives the output shapes (all agree); the first
        listed, cpu's, is the cheapest to trace."""
        for _, choice in self.entries:
            if isinstance(choice, KernelSpec):
                return choice
        raise NoImplementationError(self.entries[0][1])

    def __repr__(self) -> str:
        return " ".join(f"{target}={_name(choice)}" for target, choice in self.entries)


def _lowers_for(spec: KernelSpec, target: str) -> bool:
    return spec.backend is Backend.ANY or backend_of_target(target) is spec.backend


def _only_for(spec: KernelSpec) -> str:
    targets = [target for target in TARGETS if _lowers_for(spec, target)]
    return (f"{spec.platform.value}/{spec.backend.value} lowers only for {', '.join(targets)}: "
            f"lower for it with jax.jit(fn).trace(*args).lower(lowering_platforms="
            f"{tuple(targets[:1])}), jax.export.export(jax.jit(fn), platforms={targets[:1]}) or "
            f"kernelhub.export")


def _name(choice: KernelSpec | str) -> str:
    if isinstance(choice, KernelSpec):
        return f"{choice.platform.value}/{choice.backend.value}"
    return "none"


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a call's arrays sit among its arguments; the rest of the arguments, kept as is."""

    treedef: Any
    statics: tuple[Any, ...]  # one per leaf; None where an array goes
    is_array: tuple[bool, ...]

    @property
    def num_arrays(self) -> int:
        return sum(self.is_array)

    def arguments(self, arrays: Sequence[Any]) -> dict[str, Any]:
        supply = iter(arrays)
        leaves = [next(supply) if is_array else static
                  for static, is_array in zip(self.statics, self.is_array)]
        return jax.tree.unflatten(self.treedef, leaves)

    def __repr__(self) -> str:
        shown = self.arguments([_ARRAY] * self.num_arrays)
        return " ".join(f"{name}={value!r}" for name, value in shown.items())


class _ArrayMark:
    def __repr__(self) -> str:
        return "array"


_ARRAY = _ArrayMark()


def split(arguments: dict[str, Any]) -> tuple[Layout, list[jax.Array | np.ndarray]]:
    """The layout of keyword `arguments` and their arrays (jax or numpy: both are operands)."""
    leaves, treedef = jax.tree.flatten(arguments)
    is_array = tuple(isinstance(leaf, (jax.Array, np.ndarray)) for leaf in leaves)
    statics = []
    for leaf, array in zip(leaves, is_array):
        if not array:
            try:
                hash(leaf)
            except TypeError:
                raise TypeError(
                    f"non-array arguments are static and must be hashable; got {leaf!r} of "
                    f"type {type(leaf).__name__}") from None
        statics.append(None if array else leaf)
    arrays = [leaf for leaf, array in zip(leaves, is_array) if array]
    return Layout(treedef, tuple(statics), is_array), arrays


def _inexact(dtype: Any) -> bool:
    return jnp.issubdtype(dtype, jnp.inexact)


# What one binding of the primitive runs of an implementation: the call itself, or one half of
# its VJP (module docstring: gradients).
CALL, FORWARD, BACKWARD = "call", "forward", "backward"


class _Traced:
    """A flat function of one implementation (or of its pullbacks), traced per abstract inputs.

    `stage` is CALL, or FORWARD / BACKWARD for a half of the implementation's VJP
    (`_forward_half`, `_backward_half`). `pullbacks` holds, per order of differentiation, how
    many of the function's inputs are primals (the rest are the cotangents of its inexact
    outputs); empty for the forward pass.
    """

    def __init__(self, spec: KernelSpec, layout: Layout, pullbacks: tuple[int, ...], batch: tuple,
                 stage: str = CALL):
        self.spec, self.layout, self.pullbacks, self.batch = spec, layout, pullbacks, batch
        self.stage = stage
        self.out_tree = None

    def forward(self, *arrays: Any) -> list[Any]:
        leaves, tree = jax.tree.flatten(
            self.spec.fn(**self.spec.arguments_for(self.layout.arguments(arrays))))
        self.out_tree = tree
        return leaves

    def function(self) -> Callable[..., list[Any]]:
        fn = {CALL: self.forward, FORWARD: self._forward_half,
              BACKWARD: self._backward_half}[self.stage]
        for primals in self.pullbacks:
            fn = _pullback(fn, primals)
        for in_axes in self.batch:  # innermost vmap first
            fn = jax.vmap(fn, in_axes=in_axes)
        return fn

    def _forward_half(self, *arrays: Any) -> list[Any]:
        """The outputs, then the residuals of the implementation's VJP that are not inputs."""
        kept = _residuals(self.spec, self.layout, _avals(arrays))[0]
        outs, vjp = _vjp(self.forward, arrays)
        leaves = jax.tree.leaves(vjp)
        return [*outs, *(leaves[i] for i in kept.computed)]

    def _backward_half(self, *arrays_residuals_cotangents: Any) -> list[Any]:
        """(inputs, the forward half's residuals, cotangents of the inexact outputs) ->
        cotangents of the inexact inputs."""
        inputs = self.layout.num_arrays
        arrays = arrays_residuals_cotangents[:inputs]
        kept, tree = _residuals(self.spec, self.layout, _avals(arrays))
        computed = iter(arrays_residuals_cotangents[inputs:inputs + len(kept.computed)])
        cotangents = arrays_residuals_cotangents[inputs + len(kept.computed):]
        leaves = [arrays[source] if isinstance(source, int) else next(computed)
                  for source in kept.sources]
        return _apply_vjp(jax.tree.unflatten(tree, leaves), kept.outputs, cotangents)


def _avals(arrays: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(jax.typeof(x) for x in arrays)


def _vjp(fn: Callable[..., list[Any]], values: Sequence[Any]) -> tuple[list[Any], Any]:
    """jax.vjp of `fn` with respect to its inexact arguments (the others held fixed)."""
    wrt = [i for i, x in enumerate(values) if _inexact(x.dtype)]

    def of_inexact(*inexact):
        full = list(values)
        for i, value in zip(wrt, inexact):
            full[i] = value
        return fn(*full)

    return jax.vjp(of_inexact, *(values[i] for i in wrt))


def _apply_vjp(vjp: Callable[..., Any], outs: Sequence[Any], cotangents: Sequence[Any]) -> list:
    """`vjp` of outputs `outs` (values or avals) given the cotangents of the inexact ones."""
    supply = iter(cotangents)
    full = [next(supply) if _inexact(out.dtype) else np.zeros(out.shape, jax.dtypes.float0)
            for out in outs]
    return list(vjp(full))


def _pullback(fn: Callable[..., list[Any]], primals: int) -> Callable[..., list[Any]]:
    """(primals, cotangents of fn's inexact outputs) -> cotangents of the inexact primals."""

    def pullback(*arrays_and_cotangents: Any) -> list[Any]:
        values, cotangents = arrays_and_cotangents[:primals], arrays_and_cotangents[primals:]
        outs, vjp = _vjp(fn, values)
        return _apply_vjp(vjp, outs, cotangents)

    return pullback


@dataclasses.dataclass(frozen=True)
class Residuals:
    """What an implementation's VJP keeps from its forward half for given inputs.

    sources: per residual, the input it is (its position), or (abstract value, name) of one the
    forward half computes, named where the implementation called `checkpoint_name` on it.
    outputs: the abstract values of the implementation's outputs.
    """

    sources: tuple[int | tuple[Any, str | None], ...]
    outputs: tuple[Any, ...]

    @property
    def computed(self) -> tuple[int, ...]:
        """The positions, among all residuals, of those the forward half computes."""
        return tuple(i for i, source in enumerate(self.sources) if not isinstance(source, int))

    @property
    def names(self) -> tuple[str | None, ...]:
        """The checkpoint names of the computed residuals, in order."""
        return tuple(self.sources[i][1] for i in self.computed)


@functools.lru_cache(maxsize=512)
def _residuals(spec: KernelSpec, layout: Layout, avals: tuple) -> tuple[Residuals, Any]:
    """The residuals of `spec`'s VJP for inputs `avals`, and the tree that makes its VJP
    function of them again."""
    traced = _Traced(spec, layout, (), ())
    found = {}

    def forward_and_residuals(*arrays):
        outs, vjp = _vjp(traced.forward, arrays)
        leaves, found["tree"] = jax.tree.flatten(vjp)
        found["outputs"] = len(outs)
        return [*outs, *leaves]

    with internals.unchecked_manual_axes():
        closed = internals.trace(forward_and_residuals, avals)
    outputs = found["outputs"]
    positions = range(outputs, len(closed.out_avals))
    inputs = internals.forwarded_inputs(closed)
    names = internals.output_names(closed, positions)
    sources = tuple(inputs[p] if inputs[p] is not None else (closed.out_avals[p], name)
                    for p, name in zip(positions, names))
    return Residuals(sources, tuple(closed.out_avals[:outputs])), found["tree"]


@functools.lru_cache(maxsize=512)
def _common_residuals(choices: Choices, layout: Layout, avals: tuple) -> Residuals | None:
    """The residuals every target's implementation keeps for `avals`, when they are the same
    for all; else None, and the backward pass recomputes the forward half it needs.

    Implementations registered with one `residuals` name share their VJP code: the first is
    traced for all (the others are checked as they lower, `_checked_residuals`)."""
    specs = list(dict.fromkeys(choice for _, choice in choices.entries
                               if isinstance(choice, KernelSpec)))
    if len({spec.residuals for spec in specs}) == 1 and specs[0].residuals is not None:
        specs = specs[:1]
    found = set()
    for choice in specs:
        try:
            found.add(_residuals(choice, layout, avals)[0])
        except Exception:  # noqa: BLE001
            # An implementation that cannot be differentiated for these inputs raises where a
            # target lowers it, as it always did; the others recompute.
            return None
        if len(found) > 1:
            return None
    return found.pop() if found else None


@functools.lru_cache(maxsize=512)
def _abstract(spec: KernelSpec, layout: Layout, pullbacks: tuple[int, ...], batch: tuple,
              avals: tuple, stage: str = CALL) -> tuple[Any, Any, Any]:
    """(output avals, output tree, effects) of one implementation for `avals`, manual axes
    included. The effects are those of collectives: the mesh axes they name."""
    traced = _Traced(spec, layout, pullbacks, batch, stage)
    closed = internals.trace(traced.function(), avals)
    unsupported = internals.unsupported_effects(closed)
    if unsupported:
        raise TypeError(
            f"{spec.op} ({spec.platform.value}/{spec.backend.value}) has side effects that "
            f"cannot go through a custom VJP ({unsupported}); implementations must be pure "
            f"functions of their arguments (jax.debug.print and collectives are fine)")
    return tuple(closed.out_avals), traced.out_tree, closed.effects


kernelhub_call_p = Primitive("kernelhub_call")
kernelhub_call_p.multiple_results = True


def _impl(*arrays, **params):
    return internals.apply_primitive(kernelhub_call_p, *arrays, **params)


def _abstract_eval(*avals, op, choices, layout, pullbacks, batch, stage):
    del op
    if stage == CALL:
        out_avals, _, out_effects = _abstract(choices.shape_source(), layout, pullbacks, batch,
                                              tuple(avals))
    else:
        out_avals, out_effects = _stage_abstract(choices.shape_source(), layout, pullbacks, batch,
                                                 tuple(avals), stage)
    return list(out_avals), out_effects


@functools.lru_cache(maxsize=512)
def _stage_abstract(spec: KernelSpec, layout: Layout, pullbacks: tuple[int, ...], batch: tuple,
                    avals: tuple, stage: str) -> tuple[tuple[Any, ...], Any]:
    """(output avals, effects) of a half of `spec`'s VJP for `avals`.

    Traced as the lowering rules trace it, without manual axes: traced with them, an
    implementation can keep other residuals (a constant cast to varying becomes one), and the
    halves would not fit together. Then typed: the outputs as the call types them, residuals
    and cotangents varying over every manual axis an input does (the dispatcher makes every
    input vary over all of those)."""
    with internals.unchecked_manual_axes():
        invariant = tuple(internals.invariant(aval) for aval in avals)
        out_avals, _, effects = _abstract(spec, layout, pullbacks, batch, invariant, stage)
    axes = frozenset().union(*(internals.varying_axes(aval) for aval in avals))
    if not axes:
        return out_avals, effects
    typed = [internals.varying(aval, axes) for aval in out_avals]
    if stage == FORWARD and not pullbacks:
        outputs, _, call_effects = _abstract(spec, layout, (), batch, avals)
        typed[:len(outputs)] = outputs
        effects = effects | call_effects
    return tuple(typed), effects


def _lowering_rule(target: str):
    def lower(ctx, *args, op, choices, layout, pullbacks, batch, stage):
        spec = choices.of(target)
        avals = [internals.invariant(aval) for aval in ctx.avals_in]
        with internals.unchecked_manual_axes(), internals.lowering_for(target):
            alternates = choices.alternates_for(target)
            if alternates:
                def trace(candidate: KernelSpec) -> None:
                    internals.trace(_Traced(candidate, layout, pullbacks, batch, stage).function(),
                                    avals)

                spec = measured_choice.fastest(op, target, spec, alternates,
                                               layout.arguments(avals[:layout.num_arrays]),
                                               trace)
            traced = _Traced(spec, layout, pullbacks, batch, stage).function()
            closed = internals.without_dead_code(internals.trace(traced, avals))
            if stage == FORWARD:
                _checked_residuals(spec, closed.out_avals, ctx.avals_out)
            return internals.lower_jaxpr(ctx, closed, *args)

    return lower


def _checked_residuals(spec: KernelSpec, found: Sequence[Any], declared: Sequence[Any]) -> None:
    """Raises if `spec`'s forward half gives other types than the call declared: an
    implementation registered with a `residuals` name whose VJP keeps other residuals than its
    family's first."""
    def types(avals):
        return [(tuple(a.shape), a.dtype) for a in avals]

    if types(found) != types(declared):
        raise TypeError(
            f"{spec.op} ({spec.platform.value}/{spec.backend.value}) was registered with "
            f"residuals={spec.residuals!r}, but its VJP keeps residuals of other types than the "
            f"implementation traced for that name: {types(found)} against {types(declared)}; "
            f"register it without that name, or keep the same residuals")


def _batching_rule(arrays, dims, *, batch, **params):
    outs = kernelhub_call_p.bind(*arrays, batch=batch + (tuple(dims),), **params)
    return outs, [0] * len(outs)


kernelhub_call_p.def_impl(_impl)
kernelhub_call_p.def_effectful_abstract_eval(_abstract_eval)
batching.primitive_batchers[kernelhub_call_p] = _batching_rule
for _target in TARGETS:
    mlir.register_lowering(kernelhub_call_p, _lowering_rule(_target), platform=_target)


@functools.lru_cache(maxsize=512)
def _differentiable(op: str, choices: Choices, layout: Layout, pullbacks: tuple[int, ...] = (),
                    stage: str = CALL) -> Callable[..., list[Any]]:
    """The call (or one of its pullbacks, or the backward half of its VJP) with a custom VJP.

    The call's forward binds the FORWARD stage and keeps its residuals where every target's
    implementation has the same ones, and its backward binds the BACKWARD stage; otherwise, and
    for everything but the call, the backward binds the next pullback."""
    params = dict(op=op, choices=choices, layout=layout, pullbacks=pullbacks, batch=(),
                  stage=stage)

    @jax.custom_vjp
    def call(*arrays):
        return kernelhub_call_p.bind(*arrays, **params)

    def forward(*arrays):
        kept = None
        # Concrete inputs (jax.vjp outside jit) keep only the inputs, as before #35: there each
        # stage is compiled on its own, and two full-suite runs saw XLA:CPU crash compiling an
        # eager FORWARD stage (not reproduced alone). Jitted steps, where the time goes, split.
        traced = any(isinstance(x, jax.core.Tracer) for x in arrays)
        if stage == CALL and not pullbacks and traced:
            invariant = tuple(internals.invariant(aval) for aval in _avals(arrays))
            kept = _common_residuals(choices, layout, invariant)
        if kept is None:
            return call(*arrays), (arrays, None)
        # Differentiable in turn (reverse over reverse differentiates this forward too).
        flat = _differentiable(op, choices, layout, (), FORWARD)(*arrays)
        outs, computed = flat[:len(kept.outputs)], flat[len(kept.outputs):]
        # Named outside the primitive, where jax.checkpoint's policies look for names.
        computed = tuple(x if name is None else checkpoint_name(x, name)
                         for x, name in zip(computed, kept.names))
        return outs, (arrays, computed)

    def backward(residuals, cotangents):
        arrays, computed = residuals
        # Integer outputs' cotangents are float0 zeros: the pullback rebuilds them itself.
        kept = [ct for ct in cotangents if _inexact(ct.dtype)]
        if computed is None:
            pullback = _differentiable(op, choices, layout, pullbacks + (len(arrays),), stage)
            grads = iter(pullback(*arrays, *kept))
        else:
            second_half = _differentiable(op, choices, layout, (), BACKWARD)
            grads = iter(second_half(*arrays, *computed, *kept))
        return tuple(next(grads) if _inexact(x.dtype) else None for x in arrays)

    call.defvjp(forward, backward)
    return call


@functools.lru_cache(maxsize=512)
def _compiled(op: str, choices: Choices, layout: Layout) -> Callable[..., list[Any]]:
    """The call as a jitted function, for eager calls: jax's fast path for jitted functions
    costs less per call than binding the primitive outside jit."""
    params = dict(op=op, choices=choices, layout=layout, pullbacks=(), batch=(), stage=CALL)
    return jax.jit(lambda *arrays: kernelhub_call_p.bind(*arrays, **params))


def call(op: str, choices: Choices, arguments: dict[str, Any]) -> Any:
    """Runs `op` on its normalised keyword `arguments` with one implementation per target."""
    return call_split(op, choices, *split(arguments))


def call_split(op: str, choices: Choices, layout: Layout, arrays: list[Any]) -> Any:
    """`call` with the arguments already split into their layout and arrays."""
    if any(isinstance(x, jax.core.Tracer) for x in arrays):
        # The backward pass's cotangents vary over every manual axis any input does; the
        # inputs must say so too, and the cast's transpose sums a replicated input's gradient.
        arrays = list(unify_varying(*arrays))
        flat = _differentiable(op, choices, layout)(*arrays)
    else:  # concrete inputs: nothing can differentiate this call
        flat = _compiled(op, choices, layout)(*arrays)
    return jax.tree.unflatten(_output_tree(choices, layout, arrays, len(flat)), flat)


def eager(op: str, choices: Choices, layout: Layout,
          constants: dict[int, Any]) -> Callable[[list[Any]], Any]:
    """A runner of eager calls of one layout whose arrays at the positions of `constants` are
    always those: `run(others)` is `call_split(op, choices, layout, arrays)`, without looking
    up its executable and output tree again, and with the constants inside the executable
    (a host constant passed as an argument would be copied to the device at every call)."""
    positions = layout.num_arrays
    params = dict(op=op, choices=choices, layout=layout, pullbacks=(), batch=(), stage=CALL)

    def merged(others: Sequence[Any]) -> list[Any]:
        supply = iter(others)
        return [constants[i] if i in constants else next(supply) for i in range(positions)]

    compiled = jax.jit(lambda *others: kernelhub_call_p.bind(*merged(others), **params))
    tree = None

    def run(others: list[Any]) -> Any:
        nonlocal tree
        flat = compiled(*others)
        if tree is None or tree.num_leaves != len(flat):
            tree = _output_tree(choices, layout, merged(others), len(flat))
        return jax.tree.unflatten(tree, flat)

    return run


_OUTPUT_TREES: dict[tuple[Any, ...], Any] = {}


def _output_tree(choices: Choices, layout: Layout, arrays: list[jax.Array], leaves: int) -> Any:
    """The tree of an implementation's outputs: the same for every call of one layout, almost
    always, so an eager call need not look up the abstract values of its arrays."""
    spec = choices.shape_source()
    tree = _OUTPUT_TREES.get((spec, layout))
    if tree is None or tree.num_leaves != leaves:
        avals = tuple(jax.typeof(x) for x in arrays)
        tree = _abstract(spec, layout, (), (), avals)[1]
        if len(_OUTPUT_TREES) > 1024:
            _OUTPUT_TREES.clear()
        _OUTPUT_TREES[(spec, layout)] = tree
    return tree
