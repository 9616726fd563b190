"""Trains a small mixture-of-experts feed-forward block with kernelhub's grouped matmuls.

    python examples/moe_train.py                  # CPU, or whatever jax's default backend is
    python examples/moe_train.py --steps 50
    python examples/moe_train.py --quantize fp8   # expert matmuls on fp8 (or int8) operands
    python examples/moe_train.py --quantize fp8-blocks  # fp8 with DeepSeek-style scale blocks
    python examples/moe_train.py --quantize mxfp8  # MXFP8 training: every pass, its own axis
    python examples/moe_train.py --quantize mxfp8-fwd  # MXFP8 forward, unquantized backward
    python examples/moe_train.py --quantize int4   # train in float32, serve int4 weights
    python examples/moe_train.py --quantize nvfp4  # train in float32, serve NVFP4 operands
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python examples/moe_train.py  # a mesh

The block: a router picks top_k experts per token, the token choices are sorted by expert, each
expert is a SwiGLU feed-forward (one grouped matmul with glu="silu" over the concatenated gate
and up weights, a grouped matmul down),
and the answers are unsorted and combined with the router's weights. The student block learns
to imitate a fixed random teacher network on random inputs, so the loss must fall.

With --quantize, each expert matmul quantizes its rows and weights first (per row and per
output column, kernelhub.quantize): float8_e4m3fn for fp8, int8 for int8; fp8-blocks gives
each row and each column one scale per 16 elements along k (DeepSeek-V3 uses 128; this toy's
k is 32 or 64). The gradients pass straight through the quantization to the float weights,
which the optimizer keeps. mxfp8 and mxfp8-fwd train with kernelhub.quantized_training's
recipes instead: the forward in OCP MXFP8 (e4m3, one power-of-two scale per 32 along k), the
backward products re-quantized to MXFP8 along their own contraction (mxfp8) or unquantized
(mxfp8-fwd). int4 and nvfp4 are serving formats: the block trains in float32, then the loss
on held-out tokens is measured with its expert weights in int4 (blocks of 32 along k,
activations left float) or with both operands in NVFP4 (e2m1, e4m3 scales per 16).

With one device the block runs as is; with several, the experts are sharded over a mesh axis
with one of kernelhub.parallel's layouts. The matmuls come from kernelhub.get, so the same file
runs the Pallas kernels on TPU and the Triton kernels on GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import kernelhub
from kernelhub import parallel
from kernelhub import quantized_training as qt


@dataclasses.dataclass(frozen=True)
class Config:
    steps: int = 300
    tokens: int = 256
    hidden: int = 32
    expert_hidden: int = 64
    experts: int = 8
    top_k: int = 2
    learning_rate: float = 3e-3
    layout: str = "auto"  # auto, local, replicated or routed
    capacity_factor: float | None = None  # None: a capacity that never drops a token
    quantize: str = "none"  # a name of QUANTIZED_FORMATS or SERVING_FORMATS
    seed: int = 0


# --quantize, for training: both operands' (dtype, scale block along k; None for one scale per
# row or column), quantized straight-through; or a quantized_training recipe; or None.
QUANTIZED_FORMATS = {"none": None, "int8": (jnp.int8, None), "fp8": (jnp.float8_e4m3fn, None),
                     "fp8-blocks": (jnp.float8_e4m3fn, 16), "mxfp8": qt.MXFP8,
                     "mxfp8-fwd": qt.MXFP8_FORWARD}


@dataclasses.dataclass(frozen=True)
class Serving:
    """A serving format: the weights' (dtype or format name, block along k), and the
    activations' (None: left float)."""

    weights: tuple[Any, int | None]
    activations: tuple[Any, int | None] | None = None


# --quantize, for serving a block trained in float32.
SERVING_FORMATS = {"int4": Serving((jnp.int4, 32)),
                   "nvfp4": Serving(("nvfp4", None), ("nvfp4", None))}
FEATURES = {"none": (), "int8": ("quantized",), "fp8": ("quantized",),
            "fp8-blocks": ("quantized", "quantized_blocks"),
            "mxfp8": ("quantized", "quantized_blocks"), "mxfp8-fwd": ("quantized", "quantized_blocks"),
            "int4": ("quantized", "quantized_blocks", "quantized_4bit"),
            "nvfp4": ("quantized", "quantized_blocks", "quantized_4bit")}


def init_params(key: jax.Array, config: Config) -> dict[str, jax.Array]:
    d, f, e = config.hidden, config.expert_hidden, config.experts
    router, gate, up, down = jax.random.split(key, 4)
    # gate and up side by side: one [e, d, 2f] weight, the glu's "concatenated" layout.
    gate_up = jnp.concatenate([jax.random.normal(gate, (e, d, f)),
                               jax.random.normal(up, (e, d, f))], axis=2) / np.sqrt(d)
    return {
        "router": jax.random.normal(router, (d, e)) / np.sqrt(d),
        "experts": {
            "gate_up": gate_up,
            "down": jax.random.normal(down, (e, f, d)) / np.sqrt(f),
        },
    }


def swiglu_experts(rows, group_sizes, experts, group_offset, quantize="none"):
    """A kernelhub.parallel.ExpertFn: each expert's SwiGLU feed-forward on its rows."""
    gmm = kernelhub.get("grouped_matmul")
    form = SERVING_FORMATS.get(quantize) or QUANTIZED_FORMATS[quantize]

    def matmul(lhs, weights, **epilogue):
        if isinstance(form, qt.Recipe):  # each pass quantized along its own contraction
            return qt.grouped_matmul(lhs, weights, group_sizes, recipe=form,
                                     group_offset=group_offset, **epilogue)
        # Along k, the axis each product sums over.
        lhs_form, weights_form = ((form.activations, form.weights) if isinstance(form, Serving)
                                  else (form, form))
        if lhs_form is not None:
            lhs = kernelhub.quantize(lhs, lhs_form[0], axis=1, block_size=lhs_form[1])
        if weights_form is not None:
            weights = kernelhub.quantize(weights, weights_form[0], axis=1,
                                         block_size=weights_form[1])
        return gmm(lhs, weights, group_sizes, group_offset=group_offset, **epilogue)

    # silu(gate) * up inside the kernel, from one [e, d, 2f] weight: the gate and up sums are
    # never written out.
    hidden = matmul(rows, experts["gate_up"], glu="silu", preferred_element_type=rows.dtype)
    return matmul(hidden, experts["down"])


def router_choices(router: jax.Array, tokens: jax.Array, top_k: int) -> tuple[jax.Array, jax.Array]:
    """(expert_ids, combine_weights): the top_k experts of each token, weights summing to 1."""
    logits = tokens @ router
    top_logits, expert_ids = jax.lax.top_k(logits, top_k)
    return expert_ids, jax.nn.softmax(top_logits, axis=-1)


def moe_block(params, tokens, apply_layout) -> tuple[jax.Array, jax.Array]:
    """(output, dropped token choices) of the MoE block, its experts placed by apply_layout."""
    expert_ids, weights = router_choices(params["router"], tokens, apply_layout.top_k)
    return apply_layout(tokens, expert_ids, weights, params["experts"])


@dataclasses.dataclass(frozen=True)
class Layout:
    """How the experts are placed: `name` is local, replicated or routed."""

    name: str
    top_k: int
    mesh: Mesh | None = None
    axis: str = "expert"
    capacity: int = 0
    quantize: str = "none"

    def __call__(self, tokens, expert_ids, weights, experts):
        no_drops = jnp.zeros((), jnp.int32)
        experts_fn = functools.partial(swiglu_experts, quantize=self.quantize)
        if self.name == "local":
            out = parallel.apply_experts(experts_fn, tokens, expert_ids, weights, experts)
            return out, no_drops
        if self.name == "replicated":
            out = parallel.replicated_tokens(experts_fn, tokens, expert_ids, weights, experts,
                                             mesh=self.mesh, axis_name=self.axis)
            return out, no_drops
        return parallel.routed_tokens(experts_fn, tokens, expert_ids, weights, experts,
                                      mesh=self.mesh, axis_name=self.axis, capacity=self.capacity)

    def place_tokens(self, batch: jax.Array) -> jax.Array:
        if self.mesh is None:
            return batch
        spec = PartitionSpec(self.axis) if self.name == "routed" else PartitionSpec()
        return jax.device_put(batch, NamedSharding(self.mesh, spec))

    def place_params(self, params: dict[str, Any]) -> dict[str, Any]:
        if self.mesh is None:
            return params
        replicated = NamedSharding(self.mesh, PartitionSpec())
        by_expert = NamedSharding(self.mesh, PartitionSpec(self.axis))
        return {"router": jax.device_put(params["router"], replicated),
                "experts": jax.device_put(params["experts"], by_expert)}


def choose_layout(config: Config) -> Layout:
    """Local on one device; else a mesh over the most devices that divide experts and tokens."""
    devices = jax.devices()
    size = max(n for n in range(1, len(devices) + 1)
               if config.experts % n == 0 and config.tokens % n == 0)
    name = config.layout
    if name == "auto":
        name = "local" if size == 1 else "routed"
    if name == "local":
        return Layout("local", config.top_k, quantize=config.quantize)
    if name not in ("replicated", "routed"):
        raise ValueError(f"layout must be auto, local, replicated or routed, got {name!r}")
    mesh = jax.make_mesh((size,), ("expert",), devices=devices[:size])
    tokens_here, experts_here = config.tokens // size, config.experts // size
    if config.capacity_factor is None:
        capacity = parallel.safe_capacity(tokens_here, config.top_k, experts_here)
    else:
        capacity = parallel.balanced_capacity(tokens_here, config.top_k, size, experts_here,
                                              config.capacity_factor)
    return Layout(name, config.top_k, mesh, capacity=capacity, quantize=config.quantize)


def teacher(key: jax.Array, hidden: int) -> Callable[[jax.Array], jax.Array]:
    """The fixed random network the block learns to imitate."""
    first, second = jax.random.split(key)
    w1 = jax.random.normal(first, (hidden, 4 * hidden)) / np.sqrt(hidden)
    w2 = jax.random.normal(second, (4 * hidden, hidden)) / np.sqrt(4 * hidden)
    return lambda x: jnp.tanh(x @ w1) @ w2


def train(config: Config, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Runs the training loop; returns the losses, the throughput and the layout used."""
    layout = choose_layout(config)
    # With the mesh set, arrays made outside the step (the optimizer's step count) live on the
    # mesh too, so the second step finds the shardings of the first and does not recompile.
    with contextlib.nullcontext() if layout.mesh is None else jax.set_mesh(layout.mesh):
        return _train(config, layout, log)


def _train(config: Config, layout: Layout, log: Callable[[str], None]) -> dict[str, Any]:
    key = jax.random.PRNGKey(config.seed)
    init_key, teacher_key, data_key = jax.random.split(key, 3)
    serving = layout if config.quantize in SERVING_FORMATS else None
    if serving is not None:  # a serving format: train in float32, then serve (below)
        layout = dataclasses.replace(layout, quantize="none")
    target = teacher(teacher_key, config.hidden)
    params = layout.place_params(init_params(init_key, config))
    optimizer = optax.adam(config.learning_rate)
    state = optimizer.init(params)

    def loss_fn(params, batch):
        out, dropped = moe_block(params, batch, layout)
        return jnp.mean((out - target(batch)) ** 2), dropped

    @jax.jit
    def step(params, state, batch):
        (loss, dropped), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss, dropped

    mesh_text = "one device" if layout.mesh is None else f"mesh {dict(layout.mesh.shape)}"
    kernel = kernelhub.resolve("grouped_matmul",
                               features=FEATURES[config.quantize]).platform.value
    log(f"layout={layout.name} on {mesh_text} ({jax.default_backend()}), "
        f"grouped_matmul={kernel}, expert matmuls quantized: {config.quantize}, "
        f"steps={config.steps}")
    losses, dropped_total = [], 0
    batches = jax.random.split(data_key, config.steps)
    started = None
    for i in range(config.steps):
        batch = layout.place_tokens(jax.random.normal(batches[i], (config.tokens, config.hidden)))
        params, state, loss, dropped = step(params, state, batch)
        losses.append(float(loss))
        dropped_total += int(dropped)
        if i == 0:
            started = time.perf_counter()  # the first step compiles: time the rest
        if i % max(1, config.steps // 10) == 0 or i == config.steps - 1:
            log(f"step {i:4d}  loss {losses[-1]:.5f}")
    timed_steps = config.steps - 1
    elapsed = time.perf_counter() - started
    steps_per_second = timed_steps / elapsed if timed_steps else float("nan")
    log(f"final loss {losses[-1]:.5f} (first {losses[0]:.5f}), {steps_per_second:.1f} steps/s, "
        f"dropped token choices {dropped_total}")
    result = {"losses": losses, "steps_per_second": steps_per_second, "layout": layout.name,
              "devices": 1 if layout.mesh is None else layout.mesh.size, "dropped": dropped_total}
    if serving is not None:
        held_out = layout.place_tokens(
            jax.random.normal(jax.random.fold_in(data_key, config.steps),
                              (config.tokens, config.hidden)))

        def held_out_loss(placed: Layout) -> float:
            out, _ = jax.jit(lambda p, x: moe_block(p, x, placed))(params, held_out)
            return float(jnp.mean((out - target(held_out)) ** 2))

        result["float_loss"], result["served_loss"] = (held_out_loss(layout),
                                                       held_out_loss(serving))
        log(f"served with {config.quantize}: held-out loss {result['served_loss']:.5f} "
            f"(float32 weights: {result['float_loss']:.5f})")
    return result


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = Config()
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--tokens", type=int, default=defaults.tokens)
    parser.add_argument("--experts", type=int, default=defaults.experts)
    parser.add_argument("--top-k", type=int, default=defaults.top_k)
    parser.add_argument("--layout", default=defaults.layout,
                        choices=("auto", "local", "replicated", "routed"))
    parser.add_argument("--capacity-factor", type=float, default=None,
                        help="routed layout: exchange capacity as a multiple of even routing "
                             "(default: a capacity that never drops)")
    parser.add_argument("--quantize", default=defaults.quantize,
                        choices=(*QUANTIZED_FORMATS, *SERVING_FORMATS),
                        help="train the expert matmuls on int8, fp8 (e4m3) or MXFP8 operands, "
                             "or train in float32 and serve int4 weights or NVFP4 operands")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    args = parser.parse_args(argv)
    config = Config(steps=args.steps, tokens=args.tokens, experts=args.experts, top_k=args.top_k,
                    layout=args.layout, capacity_factor=args.capacity_factor,
                    quantize=args.quantize, seed=args.seed)
    return train(config)


if __name__ == "__main__":
    main()
