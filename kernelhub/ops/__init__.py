"""Op contracts: one module per op holds its signature, docstring and checks.

Importing a contract module declares its op (`define_op`); implementations are registered by
the backends, which kernelhub/_loader.py loads after the contracts.
"""

from kernelhub._grouped_matmul.names import GROUPED_MATMUL, TRANSPOSED_GROUPED_MATMUL
from kernelhub.ops import grouped_matmul as _gmm_contract  # noqa: F401  (declares the op)
from kernelhub.ops import transposed_grouped_matmul as _tgmm_contract  # noqa: F401
from kernelhub.ops import _sharding  # noqa: F401  (the ops' splits over explicit mesh axes)
from kernelhub.ops.token_exchange import NAME as TOKEN_EXCHANGE

__all__ = ["GROUPED_MATMUL", "TOKEN_EXCHANGE", "TRANSPOSED_GROUPED_MATMUL"]
