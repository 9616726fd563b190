"""Everything `import kernelhub` offers, loaded on first use (kernelhub/__init__.py says why):
the public names, and kernelhub's ops with their implementations (kernelhub/_loader.py)."""

from kernelhub import _loader
from kernelhub._core.define import define_op
from kernelhub._core.dispatch import get, resolve
from kernelhub._core.errors import ShapeError
from kernelhub._core.registry import (
    Backend, KernelSpec, NoImplementationError, Platform, implementations, needs_device, op_names,
    register)
from kernelhub._core.runtime_checks import RuntimeCheckError, runtime_checks
from kernelhub.ops.grouped_matmul import grouped_matmul
from kernelhub.ops.ragged_dot import ragged_dot, ragged_dot_general
from kernelhub.ops.transposed_grouped_matmul import transposed_grouped_matmul
from kernelhub.quantization import QuantizedArray, quantize
from kernelhub.tuning import Tilings, autotune

_loader.load()
