"""Cython kernels (``nogil``, typed memoryviews, float32/float64): no MPI, no I/O.

- :mod:`hpcps.kernels.optim` — server-side update rules and the duplicate-key merge.
- :mod:`hpcps.kernels.logistic` — worker-side logistic loss / gradient on a CSR batch.
- :mod:`hpcps.kernels.keys` — the key permutation ``p(k) = k * A mod num_keys``.
- :mod:`hpcps.kernels.svmlight` — svmlight text (a ``bytes`` buffer) to CSR arrays with
  int64 indices.
- :mod:`hpcps.kernels.hashtable` — dynamic sparse tables: an open-addressing hash index
  over a row arena (any 64-bit key), the update rules applied through it.
"""

from hpcps.kernels.keys import choose_multiplier, inverse_multiplier, permute_keys, permute_keys_into
from hpcps.kernels.logistic import logistic_loss_grad, logistic_predict
from hpcps.kernels.optim import (
    OPTIMIZERS,
    apply_sparse,
    dense_adagrad,
    dense_adam,
    dense_ftrl,
    dense_sgd,
    merge_duplicates,
    new_state,
    sparse_adagrad,
    sparse_adam,
    sparse_ftrl,
    sparse_sgd,
    state_dtype,
)

__all__ = [
    "OPTIMIZERS",
    "apply_sparse",
    "choose_multiplier",
    "dense_adagrad",
    "dense_adam",
    "dense_ftrl",
    "dense_sgd",
    "inverse_multiplier",
    "logistic_loss_grad",
    "logistic_predict",
    "merge_duplicates",
    "new_state",
    "permute_keys",
    "permute_keys_into",
    "sparse_adagrad",
    "sparse_adam",
    "sparse_ftrl",
    "sparse_sgd",
    "state_dtype",
]
