"""The core: the registry, `define_op`, dispatch, the per-target lowering primitive, the runtime
checks, and helpers over jax's internals and error messages.

It knows no op and no backend: it imports nothing of kernelhub outside this package
(docs/architecture.md), so that a user's op is served exactly as kernelhub's own are.
"""
