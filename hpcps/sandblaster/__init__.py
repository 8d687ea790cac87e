"""Sandblaster-style batch L-BFGS for the logistic model (Dean et al., "Large Scale Distributed
Deep Networks", NIPS 2012, §4.2). Selected by ``[cluster] mode = "sandblaster"``.

Objective (state exactly): ``F(w, b) = (1/n) Σ_i logloss(y_i, b + x_i·w) + (l2/2) ||w||²``
with ``l2 = [model] l2`` and the bias not penalised — the minimiser of scikit-learn's
``LogisticRegression(C = 1/(l2 n))``, whose objective ``C Σ logloss + ½||w||²`` is ``F / l2``.

Roles (:mod:`hpcps.comm.sandblaster`): a **coordinator** (world rank 0) runs L-BFGS holding
only scalars and issues *programs* of vector operations; **servers** (the last ``[cluster]
servers`` ranks) hold the vectors ``x, g, d, x_trial, g_trial, s_i, y_i`` of their key range
(the parameter-server mode's ranges) and execute the programs on their shards, returning
partial dot products; **workers** (the ranks in between) compute the gradient of the data term
over small **work units** handed out by the coordinator on demand, so that a slow worker
simply takes fewer units.

Modules, all without MPI except :mod:`.run`:

``program``     the operations and their encoding
``shard``       a server's vectors and the shard layout
``linesearch``  strong Wolfe line search (Nocedal & Wright Algorithms 3.5/3.6)
``lbfgs``       the coordinator's L-BFGS (two-loop recursion, N&W Algorithm 7.4)
``units``       work units (worker side) and the on-demand dispatcher (coordinator side)
``local``       the same machine in one process, for tests
``baseline``    the objective in numpy and scikit-learn's solution
``run``         the roles over MPI (:func:`run.run_sandblaster`)
"""
