"""An epoch's evaluation: a worker's test predictions (:func:`predict_test`), and every
worker's predictions and training-loss sums gathered on the chief (:class:`EpochGather`)."""

from __future__ import annotations

import numpy as np

from hpcps.comm.collectives import allgather_rows, gatherv

EVAL_CHUNK = 8192    #: test rows evaluated per pull (the evaluation at the end of an epoch)


def predict_test(model, client, Xt, yt):
    """A worker's predictions of its test rows ``Xt`` (labels ``yt``) by the current model,
    ``EVAL_CHUNK`` rows per pull; the rows are pulled fresh (every update below the worker's
    clock, not from a stale cache). Not collective (its pulls go to the servers).

    Returns
    -------
    preds : ndarray of float64, shape (n * k,)
        The model's predictions (``k`` values per row, e.g. class probabilities), flattened.
    labels : ndarray of float64, shape (n,)
    """
    preds, ys = [], []
    streamed = hasattr(Xt, "start")          # streamed test lines: read in order
    if streamed:
        Xt.start(np.arange(Xt.shape[0], dtype=np.int64))
    for a in range(0, Xt.shape[0], EVAL_CHUNK):
        sel = (np.arange(a, min(a + EVAL_CHUNK, Xt.shape[0]), dtype=np.int64) if streamed
               else slice(a, a + EVAL_CHUNK))
        Xc = Xt[sel]
        ys.append(np.asarray(yt[sel], dtype=np.float64).reshape(-1))
        if Xc.shape[0] == 0:
            continue
        keys = model.batch_keys(Xc)
        params = client.pull_many(keys, fresh=True)    # every table: one round trip
        preds.append(np.asarray(model.predict(Xc, keys, params), dtype=np.float64).reshape(-1))
    return (np.concatenate(preds) if preds else np.empty(0),
            np.concatenate(ys) if ys else np.empty(0))


class EpochGather:
    """Gathers, at the end of each epoch, every worker's training-loss sum, example count and
    test predictions on the chief (rank 0 of the workers' communicator), with one ``Gatherv``
    per epoch: the test labels and the number of values of each worker are gathered at the
    first evaluation on a communicator only (the test rows do not change between epochs;
    :meth:`reset` after a re-plan). Before 2026-12-05 each epoch ran an Allreduce and two
    Allgather + Gatherv pairs, ~1-2 ms of the ~10 ms an Adult epoch's evaluation took on a
    2-core machine, while the other workers waited (issue 20).

    No barrier: a worker that evaluates while another still trains reads the model with
    fresh pulls (every update below its clock), which wait at the servers until then.
    """

    def __init__(self):
        self._fixed = None       # (comm, values per rank, the chief's labels or None)

    def reset(self) -> None:
        """Forget the counts and labels (this worker's test rows changed). Local; every
        worker must call it when any does (a re-plan or a membership change)."""
        self._fixed = None

    def gather(self, comm, loss_sum: float, n_ex: int, preds: np.ndarray, labels):
        """Collective over ``comm``, the workers' communicator.

        Parameters
        ----------
        loss_sum : float
            This worker's training-loss sum over the epoch.
        n_ex : int
            Its examples of the epoch.
        preds : ndarray of float64, shape (n,) or (n, k)
            Its test predictions (the same ``n * k`` at every epoch on ``comm``).
        labels : ndarray of float64, shape (n,)
            Its test labels (gathered at the first gather only).

        Returns
        -------
        tuple or None
            On rank 0: ``(loss_sum, n_ex, preds, labels)`` summed over the workers (the
            predictions and labels of every worker in rank order, 1-D); None elsewhere.

        Raises
        ------
        ValueError
            When ``preds`` holds another number of values than at the first gather (local).
        """
        body = np.empty(2 + preds.size, dtype=np.float64)
        body[0], body[1] = loss_sum, n_ex
        body[2:] = preds.reshape(-1)
        fixed = self._fixed
        if fixed is None or fixed[0] is not comm:
            y = np.asarray(labels, dtype=np.float64).reshape(-1)
            sizes = allgather_rows(comm, [body.size, y.size])
            fixed = self._fixed = (comm, sizes[:, 0], gatherv(comm, y, counts=sizes[:, 1]))
        got = gatherv(comm, body, counts=fixed[1])
        if got is None:
            return None
        starts = np.concatenate(([0], np.cumsum(fixed[1])[:-1]))
        keep = np.ones(got.size, dtype=bool)
        keep[starts] = keep[starts + 1] = False
        return float(got[starts].sum()), float(got[starts + 1].sum()), got[keep], fixed[2]
