"""Loads kernelhub's own ops and implementations: once per process, whichever thread asks first.

The core never does (it knows no op). The facade (kernelhub/_public.py) calls `load`, and so
does each entry point that needs kernelhub's ops without going through the facade:
kernelhub.testing, kernelhub.parallel, kernelhub.export and the command line. Threads that ask
while another loads wait for it, so none sees a half-registered op.

It is also where jax is first imported: kernelhub/__init__.py calls `load` before it imports
the module behind any name, so whichever thread and name come first, one thread imports jax
whole under this lock while the others wait. Threads that entered jax at once at different
modules (one `import jax`, another `from jax._src import api_util`) failed: Python does not
make the import of a submodule wait for a package that another thread is still initialising,
and when the two imports then wait on each other across jax's own import cycle, Python ends the
wait by handing one of them a partial module ("cannot import name 'AbstractValue' from
partially initialized module 'jax._src.core'").
"""

from __future__ import annotations

import threading

# Reentrant: a module that `load` imports may ask for a kernelhub name (`from kernelhub import
# quantization`), which calls `load` again in the same thread; `_loading` answers that call.
_lock = threading.RLock()
_loaded = False
_loading = False


def load() -> None:
    """Imports jax, declares kernelhub's ops, registers their implementations and makes
    kernelhub's jax options, once."""
    global _loaded, _loading
    if _loaded:
        return
    with _lock:
        if _loaded or _loading:
            return
        _loading = True
        try:
            _load()
            _loaded = True
        finally:
            _loading = False


def _load() -> None:
    # jax first and whole, before any kernelhub module that enters it at one of its submodules.
    import jax  # noqa: F401

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
    import kernelhub._pallas.mosaic_gpu  # noqa: F401
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
