"""The error class for arguments whose shapes do not fit together."""

from __future__ import annotations


class ShapeError(TypeError, ValueError):
    """Shapes that do not fit: a rank, a contracting or batch size, a group count, group_sizes'
    shape, or dimension numbers that name the wrong axes.

    Both a TypeError, which jax.lax raises when shape inference fails (so code catching lax's
    errors catches kernelhub's), and a ValueError, which kernelhub raised before.
    """
