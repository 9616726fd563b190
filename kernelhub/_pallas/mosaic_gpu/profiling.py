"""On-device traces of the Mosaic GPU kernels, for finding what limits them on a GPU.

Mosaic GPU records, per warpgroup, when each `jax.named_scope` region of a kernel's body starts
and ends, when the kernel is compiled with a profile buffer (`profile_space` regions per
warpgroup, 16 bytes each, in shared memory beside the kernel's own) and a folder to write its
trace to. A warpgroup that enters more regions than that overwrites shared memory next to the
buffer (jax 0.10-0.11 have no bounds check): size it from above. The kernels name three
regions per work item: REGIONS below. Nothing is recorded unless a call is traced inside
`profiled(...)`, which only a developer's tool uses (kernelhub/_cli/bench/mosaic_profile.py);
elsewhere the regions cost nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

from kernelhub._core import jax_internals

# A work item's regions: its contraction pipeline (TMA loads, waits and wgmma), each pipeline
# step's body (the wgmma issued and the previous one waited for; the time between steps is
# the wait for a step's tiles), and the store of its result (epilogue, shared memory, TMA).
SUMS, STEP, STORE = "sums", "step", "store"
REGIONS = (SUMS, STEP, STORE)


@dataclasses.dataclass(frozen=True)
class Profile:
    directory: str
    regions: int  # per warpgroup


_OPTION = "kernelhub_mosaic_gpu_profile"
_option_state = None


def _option():
    """A jax option that jax's trace caches key on (a function traced without the profile is
    traced again inside `profiled`), made by the first `profiled`: never inside a trace."""
    global _option_state
    if _option_state is None:
        _option_state = jax_internals.jit_keyed_object(
            _OPTION, "kernelhub: Mosaic GPU kernels traced with the on-device profiler on "
                     "(set by kernelhub._pallas.mosaic_gpu.profiling.profiled only)")
    return _option_state


@contextlib.contextmanager
def profiled(directory: str, regions: int) -> Iterator[None]:
    """Kernels traced inside write a trace of up to `regions` regions per warpgroup into
    `directory` each time they run."""
    with _option()(Profile(str(directory), int(regions))):
        yield


def compiler_params_fields() -> dict[str, object]:
    """The CompilerParams fields that turn the profile on, or none."""
    profile = None if _option_state is None else _option_state.value
    if profile is None:
        return {}
    if not isinstance(profile, Profile):
        raise ValueError(f"{_OPTION.upper()}={profile!r}: the Mosaic GPU profile is set by "
                         f"kernelhub._pallas.mosaic_gpu.profiling.profiled(folder, regions), "
                         f"not by the environment")
    return dict(profile_space=profile.regions, profile_dir=profile.directory)
