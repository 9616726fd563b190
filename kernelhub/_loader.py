"""Loads kernelhub's own ops and implementations: once per process, whichever thread asks first.

The core never does (it knows no op). The facade (kernelhub/_public.py) calls `load`, and so
does each entry point that needs kernelhub's ops without going through the facade:
kernelhub.testing, kernelhub.parallel, kernelhub.export and the command line. Threads that ask
while another loads wait for it, so none sees a half-registered op.
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_loaded = False


def load() -> None:
    """Declares kernelhub's ops, registers their implementations and makes kernelhub's jax
    options, once."""
    global _loaded
    if _loaded:
        return
    with _lock:
        if _loaded:
            return
        # The contracts declare the ops; the backends register implementations of them; the
        # composites register ragged_dot for every backend that has both grouped matmuls, so
        # they come last.
        import kernelhub.ops.grouped_matmul  # noqa: F401
        import kernelhub.ops.ragged_dot  # noqa: F401
        import kernelhub.ops.token_exchange  # noqa: F401
        import kernelhub.ops.transposed_grouped_matmul  # noqa: F401
        import kernelhub._xla  # noqa: F401
        import kernelhub._pallas.tpu  # noqa: F401
        import kernelhub._pallas.gpu  # noqa: F401
        import kernelhub._collectives  # noqa: F401
        from kernelhub import _composite

        _composite.register_ragged_dots()
        # kernelhub's jax options (runtime checks, the tuning table) are keys of jax.jit's
        # cache. Made now, before the first trace, and not during it: an option made while a
        # jitted function traces changes the cache key under that function, which then
        # compiles a second time on its next call.
        from kernelhub._core import runtime_checks
        from kernelhub._grouped_matmul import active_table

        runtime_checks.enabled()
        active_table.define_option()
        _loaded = True
