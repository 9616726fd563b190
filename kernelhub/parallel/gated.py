"""A ready ExpertFn: each expert a gated feed-forward (SwiGLU, GeGLU, GPT-OSS's), fused.

    expert_fn = kernelhub.parallel.gated_experts("silu")
    out = kernelhub.parallel.apply_experts(expert_fn, tokens, expert_ids, weights, params)

params per expert: "gate_up" [E, d, 2f] (gate and up columns laid out by `glu_layout`),
"down" [E, f, d_out], and optionally "gate_up_bias" [E, 2f] and "down_bias" [E, d_out]. The
gate, up, activation and gating are one grouped_matmul call with `glu=` (the [r, 2f]
pre-activation is never materialised when no gradient is taken), the down projection another.
"""

from __future__ import annotations

from typing import Any

import jax

from kernelhub import _loader
from kernelhub._core.dispatch import get
from kernelhub.parallel.experts import ExpertFn

PyTree = Any


def gated_experts(glu: str = "silu", glu_layout: str = "concatenated",
                  platform: str | None = None) -> ExpertFn:
    """An ExpertFn whose experts are gated feed-forwards: down(glu(rows @ gate_up + bias)).

    glu and glu_layout are grouped_matmul's (kernelhub/ops/grouped_matmul.py); platform forces
    an implementation (None: the dispatcher's choice). The hidden activations are in the rows'
    dtype, the sums in float32.
    """
    def expert_fn(rows: jax.Array, group_sizes: jax.Array, params: PyTree,
                  group_offset: jax.Array) -> jax.Array:
        _loader.load()
        gmm = get("grouped_matmul", platform=platform)
        hidden = gmm(rows, params["gate_up"], group_sizes, preferred_element_type=rows.dtype,
                     group_offset=group_offset, bias=params.get("gate_up_bias"), glu=glu,
                     glu_layout=glu_layout)
        return gmm(hidden, params["down"], group_sizes, preferred_element_type=rows.dtype,
                   group_offset=group_offset, bias=params.get("down_bias"))

    return expert_fn
