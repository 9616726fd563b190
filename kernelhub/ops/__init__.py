"""Op contracts: one module per op holds its signature, docstring and checks."""

from kernelhub.ops import grouped_matmul as _gmm_contract
from kernelhub.ops import transposed_grouped_matmul as _tgmm_contract

GROUPED_MATMUL = _gmm_contract.NAME
TRANSPOSED_GROUPED_MATMUL = _tgmm_contract.NAME
from kernelhub.ops.token_exchange import NAME as TOKEN_EXCHANGE  # noqa: E402
