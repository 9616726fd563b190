"""Everything `import kernelhub` offers, loaded on first use (kernelhub/__init__.py says why):
the ops' contracts, every backend's implementations, and the public names."""


from kernelhub._define import define_op
from kernelhub._dispatch import get, resolve
from kernelhub._registry import (
    Backend, KernelSpec, NoImplementationError, Platform, implementations, needs_device, op_names,
    register)
from kernelhub._runtime_checks import RuntimeCheckError, runtime_checks
from kernelhub.ops.grouped_matmul import grouped_matmul
from kernelhub.ops.ragged_dot import ragged_dot, ragged_dot_general
from kernelhub.ops.transposed_grouped_matmul import transposed_grouped_matmul
from kernelhub.quantization import QuantizedArray, quantize
from kernelhub.tuning import Tilings, autotune

from kernelhub import _xla  # noqa: E402,F401  (registers the xla implementations)
from kernelhub import _collectives  # noqa: E402,F401  (registers the token exchanges)
from kernelhub import parallel  # noqa: E402,F401  (expert parallelism on a mesh; imports in ~5 ms)
from kernelhub._pallas import tpu as _pallas_tpu  # noqa: E402,F401  (registers the Pallas TPU kernels)
from kernelhub._pallas import gpu as _pallas_gpu  # noqa: E402,F401  (registers the triton kernels)
from kernelhub import _composite  # noqa: E402,F401  (ragged_dot from each backend's grouped matmuls)

# kernelhub's jax options (runtime checks, the tuning table) are keys of jax.jit's cache. Made
# now, before the first trace, and not during it: an option made while a jitted function traces
# changes the cache key under that function, which then compiles a second time on its next call.
from kernelhub import _runtime_checks  # noqa: E402
from kernelhub.tuning import _active  # noqa: E402

_runtime_checks.enabled()
_active.define_option()
