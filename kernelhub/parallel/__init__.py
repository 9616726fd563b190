"""Expert parallelism on a device mesh: two layouts of the MoE block, and their pieces.

    replicated_tokens   every device sees all tokens, holds E/D experts; one reduction
    routed_tokens       tokens and experts sharded; rows travel to their expert and back
    apply_experts       the same block on one device (the reference both reproduce)
    gated_experts       a ready ExpertFn: gated feed-forward experts, gate fused into the matmul

Both take an ExpertFn (grouped matmuls on expert-sorted rows), a Mesh and an axis name.
See docs/parallel.md for when to use which and what each costs.
"""

from kernelhub.parallel.capacity import (
    TokenOverflowError,
    balanced_capacity,
    raise_on_overflow,
    safe_capacity,
)
from kernelhub.parallel.experts import ExpertFn, apply_experts, count_experts
from kernelhub.parallel.gated import gated_experts
from kernelhub.parallel.replicated import replicated_tokens, replicated_tokens_on_device
from kernelhub.parallel.routed import routed_tokens, routed_tokens_on_device
from kernelhub.parallel.routing import Routing, combine_rows, gather_rows, route

__all__ = [
    "ExpertFn",
    "Routing",
    "TokenOverflowError",
    "apply_experts",
    "balanced_capacity",
    "combine_rows",
    "count_experts",
    "gated_experts",
    "gather_rows",
    "raise_on_overflow",
    "replicated_tokens",
    "replicated_tokens_on_device",
    "route",
    "routed_tokens",
    "routed_tokens_on_device",
    "safe_capacity",
]
