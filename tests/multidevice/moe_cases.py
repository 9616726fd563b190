"""Shared by the expert-parallel tests: MoE problems, an expert function, float64 references.

The references are written from the contracts with plain numpy loops over tokens and share
no code with kernelhub.parallel.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib
import sys
from types import ModuleType

import jax.numpy as jnp
import numpy as np

import kernelhub

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "moe_train.py"


def load_example() -> ModuleType:
    """examples/moe_train.py as a module (it is a script, not part of the package)."""
    if "moe_train" not in sys.modules:
        spec = importlib.util.spec_from_file_location("moe_train", EXAMPLE)
        module = importlib.util.module_from_spec(spec)
        sys.modules["moe_train"] = module  # its dataclasses look their module up by name
        spec.loader.exec_module(module)
    return sys.modules["moe_train"]


@dataclasses.dataclass(frozen=True)
class MoeProblem:
    tokens: np.ndarray       # [T, d]
    expert_ids: np.ndarray   # [T, k], distinct experts per token
    weights: np.ndarray      # [T, k]
    params: dict             # w_in [E, d, f], w_out [E, f, d]

    @property
    def num_experts(self) -> int:
        return self.params["w_in"].shape[0]

    def jax_inputs(self):
        params = {name: jnp.asarray(w) for name, w in self.params.items()}
        return (jnp.asarray(self.tokens), jnp.asarray(self.expert_ids), jnp.asarray(self.weights),
                params)


def moe_problem(seed: int, tokens: int = 32, hidden: int = 8, expert_hidden: int = 16,
                experts: int = 8, top_k: int = 2, skew: float = 0.0) -> MoeProblem:
    """Random tokens and routing; `skew` > 0 crowds the choices onto the first experts."""
    rng = np.random.default_rng(seed)
    preference = np.exp(-skew * np.arange(experts))
    preference /= preference.sum()
    ids = np.stack([rng.choice(experts, top_k, replace=False, p=preference) for _ in range(tokens)])
    weights = rng.random((tokens, top_k)).astype(np.float32)
    weights /= weights.sum(axis=1, keepdims=True)
    def weights_of(fan_in: int, fan_out: int) -> np.ndarray:
        return (rng.normal(size=(experts, fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)

    params = {"w_in": weights_of(hidden, expert_hidden), "w_out": weights_of(expert_hidden, hidden)}
    return MoeProblem(rng.normal(size=(tokens, hidden)).astype(np.float32), ids.astype(np.int32),
                      weights, params)


def mlp_experts(gmm=None):
    """A kernelhub.parallel.ExpertFn: two-layer tanh experts with the given grouped_matmul.

    Two grouped matmuls rather than the example's three keep the compile times of the
    multi-device tests down; the example's SwiGLU runs on a mesh in test_example_on_mesh.py.
    """
    gmm = gmm or kernelhub.get("grouped_matmul", platform="xla")

    def expert_fn(rows, group_sizes, params, group_offset):
        hidden = jnp.tanh(gmm(rows, params["w_in"], group_sizes, group_offset=group_offset))
        return gmm(hidden, params["w_out"], group_sizes, group_offset=group_offset)

    return expert_fn


def moe_reference(problem: MoeProblem, kept: np.ndarray | None = None) -> np.ndarray:
    """float64 output of the MoE block; kept[t, j] False leaves token t's j-th choice out."""
    p = {name: np.asarray(w, np.float64) for name, w in problem.params.items()}
    x = np.asarray(problem.tokens, np.float64)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for j, e in enumerate(problem.expert_ids[t]):
            if kept is None or kept[t, j]:
                hidden = np.tanh(x[t] @ p["w_in"][e])
                out[t] += problem.weights[t, j] * (hidden @ p["w_out"][e])
    return out


def routed_kept(problem: MoeProblem, devices: int, capacity: int) -> np.ndarray:
    """Which choices the routed layout keeps: the first `capacity` of each (source, owner) run.

    Device b holds tokens [b*T/D, (b+1)*T/D); its choices, in (token, choice) order, are
    sorted stably by expert, and the run for each owning device is cut after `capacity` rows.
    """
    ids = problem.expert_ids
    tokens_here = ids.shape[0] // devices
    experts_here = problem.num_experts // devices
    kept = np.zeros(ids.shape, bool)
    for b in range(devices):
        choices = [(ids[t, j], t, j) for t in range(b * tokens_here, (b + 1) * tokens_here)
                   for j in range(ids.shape[1])]
        choices.sort(key=lambda c: c[0])  # stable: ties keep (token, choice) order
        sent = np.zeros(devices, int)
        for expert, t, j in choices:
            owner = expert // experts_here
            if sent[owner] < capacity:
                kept[t, j] = True
            sent[owner] += 1
    return kept
