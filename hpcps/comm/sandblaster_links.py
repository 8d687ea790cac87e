"""The three ends of the Sandblaster protocol (:mod:`hpcps.comm.sandblaster`: roles,
message table, waiting): the coordinator's, a server's and a worker's link. Every method
names the ranks that must make the matching call."""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from hpcps.comm.core import irecv_array, isend_array, native_contiguous
from hpcps.comm.sandblaster import (MAX_OPS, OP_WIDTH, TAG_ACTIVE, TAG_ACTIVE_SIZE, TAG_GRAD,
                                    TAG_GRAD_BIAS, TAG_PARAMS, TAG_PARAMS_BIAS, TAG_SHARD,
                                    TAG_SHARD_BIAS, TAG_UNIT, TAG_UNIT_REQ, LinkStats,
                                    SandblasterRoles, wait_all)

__all__ = ["CoordinatorLink", "ServerLink", "WorkerLink"]


def _f64(n: int) -> np.ndarray:
    return np.zeros(n, dtype=np.float64)


class _Link:
    def __init__(self, roles: SandblasterRoles, max_bytes: int):
        self.roles = roles
        self.max_bytes = int(max_bytes)
        self.stats = LinkStats()
        self._ops = np.zeros(1 + OP_WIDTH * MAX_OPS, dtype=np.int64)
        self._scalars = np.zeros(MAX_OPS, dtype=np.float64)


class CoordinatorLink(_Link):
    """The coordinator's side of the protocol. Every method is called on the coordinator only;
    the matching call on the other ranks is named in each docstring.

    Parameters
    ----------
    roles : SandblasterRoles
        With ``role == COORDINATOR``.
    max_bytes : int
        Largest single message in bytes (``[comm] max_message_bytes``).
    """

    def send_program(self, ops: np.ndarray, scalars: np.ndarray) -> None:
        """Broadcast a program to every server (matches :meth:`ServerLink.recv_program`).

        Parameters
        ----------
        ops : int64 (n, 4)
            Op code and three slot indices per operation, ``n <= MAX_OPS``.
        scalars : float64 (n,)
            One scalar per operation.

        Raises
        ------
        ValueError
            For more than :data:`MAX_OPS` operations or mismatched shapes.
        """
        ops = np.asarray(ops, dtype=np.int64).reshape(-1, OP_WIDTH)
        n = ops.shape[0]
        if n > MAX_OPS or np.shape(scalars) != (n,):
            raise ValueError(f"a program has at most {MAX_OPS} operations and one scalar each, "
                             f"got ops {ops.shape} and scalars {np.shape(scalars)}")
        t0 = time.perf_counter()
        self._ops[0] = n
        self._ops[1:1 + OP_WIDTH * n] = ops.reshape(-1)
        self._scalars[:n] = scalars
        wait_all([self.roles.cs.Ibcast(self._ops, root=0),
                  self.roles.cs.Ibcast(self._scalars, root=0)])
        k = self.roles.n_servers
        self.stats.add("program", t0, messages=2 * k,
                       out=k * (self._ops.nbytes + self._scalars.nbytes))

    def reduce_results(self, n_sums: int, n_maxes: int) -> tuple[np.ndarray, np.ndarray]:
        """Receive a program's results (matches :meth:`ServerLink.reduce_results`).

        Parameters
        ----------
        n_sums, n_maxes : int
            Lengths of the summed and of the maximised result vectors; a vector of length 0
            is not exchanged.

        Returns
        -------
        sums : float64 (n_sums,)
            Sum over servers of their partial results.
        maxes : float64 (n_maxes,)
            Maximum over servers.
        """
        t0 = time.perf_counter()
        sums, maxes = _f64(n_sums), _f64(n_maxes)
        reqs: list = []
        zeros = (_f64(n_sums), _f64(n_maxes))
        if n_sums:
            reqs.append(self.roles.cs.Ireduce(zeros[0], sums, op=MPI.SUM, root=0))
        if n_maxes:
            reqs.append(self.roles.cs.Ireduce(zeros[1], maxes, op=MPI.MAX, root=0))
        wait_all(reqs)
        k = self.roles.n_servers
        self.stats.add("results", t0, messages=k * ((n_sums > 0) + (n_maxes > 0)),
                       inn=k * 8 * (n_sums + n_maxes))
        return sums, maxes

    def command_workers(self, cmd: int, ident: int) -> None:
        """Broadcast a command (``CMD_EVAL`` with the evaluation id, or ``CMD_STOP``) to every
        worker (matches :meth:`WorkerLink.recv_command`)."""
        t0 = time.perf_counter()
        buf = np.array([cmd, ident], dtype=np.int64)
        wait_all([self.roles.cw.Ibcast(buf, root=0)])
        self.stats.add("command", t0, messages=self.roles.n_workers,
                       out=self.roles.n_workers * buf.nbytes)

    def recv_unit_request(self) -> tuple[int, int, int]:
        """Wait for the next work-unit request of any worker (sent by
        :meth:`WorkerLink.request_unit`).

        Returns
        -------
        worker : int
            Index of the asking worker.
        eval_id : int
            The evaluation the worker is working on.
        done : int
            The unit it just finished, or -1 (first request of an evaluation).
        """
        t0 = time.perf_counter()
        buf = np.zeros(2, dtype=np.int64)
        status = MPI.Status()
        wait_all([self.roles.p2p.Irecv(buf, source=MPI.ANY_SOURCE, tag=TAG_UNIT_REQ)], status)
        worker = self.roles.worker_ranks.index(status.Get_source())
        self.stats.add("units", t0, inn=buf.nbytes)
        return worker, int(buf[0]), int(buf[1])

    def send_unit(self, worker: int, unit: int) -> None:
        """Answer a request of worker ``worker`` with a unit id, or -1 for none left."""
        t0 = time.perf_counter()
        buf = np.array([unit], dtype=np.int64)
        wait_all([self.roles.p2p.Isend(buf, dest=self.roles.worker_ranks[worker], tag=TAG_UNIT)])
        self.stats.add("units", t0, out=buf.nbytes)

    def gather_worker_stats(self, width: int) -> np.ndarray:
        """Collect one float64 row of ``width`` values per worker (matches
        :meth:`WorkerLink.gather_stats`).

        Returns
        -------
        float64 (n_workers, width)
            Row ``i`` from worker ``i``.
        """
        t0 = time.perf_counter()
        out = np.zeros((self.roles.n_workers + 1, width), dtype=np.float64)
        mine = _f64(width)
        wait_all([self.roles.cw.Igather(mine, out, root=0)])
        self.stats.add("stats", t0, messages=self.roles.n_workers,
                       inn=self.roles.n_workers * width * 8)
        return out[1:]

    def recv_active(self) -> np.ndarray:
        """Receive worker 0's sorted active key positions (sent by
        :meth:`WorkerLink.send_active`).

        Returns
        -------
        int64 (n_active,)
        """
        t0 = time.perf_counter()
        src = self.roles.worker_ranks[0]
        size = np.zeros(1, dtype=np.int64)
        wait_all([self.roles.p2p.Irecv(size, source=src, tag=TAG_ACTIVE_SIZE)])
        active = np.empty(int(size[0]), dtype=np.int64)
        reqs: list = []
        irecv_array(self.roles.p2p, active, src, TAG_ACTIVE, self.max_bytes, reqs)
        wait_all(reqs)
        self.stats.add("setup", t0, messages=2, inn=8 + active.nbytes)
        return active

    def bcast_bounds(self, bounds: np.ndarray) -> None:
        """Broadcast the servers' compact index bounds, int64 (n_servers + 1,), to every server
        (matches :meth:`ServerLink.recv_bounds`)."""
        t0 = time.perf_counter()
        buf = native_contiguous(np.asarray(bounds, dtype=np.int64))
        if buf.shape != (self.roles.n_servers + 1,):
            raise ValueError(f"bounds must have shape ({self.roles.n_servers + 1},), "
                             f"got {buf.shape}")
        wait_all([self.roles.cs.Ibcast(buf, root=0)])
        self.stats.add("setup", t0, messages=self.roles.n_servers,
                       out=self.roles.n_servers * buf.nbytes)

    def recv_shard(self, server: int, w_out: np.ndarray, bias_out: np.ndarray | None) -> None:
        """Receive server ``server``'s weights into ``w_out`` and, from the bias server, the
        bias into ``bias_out`` (float64 (1,)); matches :meth:`ServerLink.send_shard`.

        ``w_out`` must be a C-contiguous float64 view (e.g. a slice of the whole vector).
        """
        t0 = time.perf_counter()
        src = self.roles.server_ranks[server]
        reqs: list = []
        irecv_array(self.roles.p2p, w_out, src, TAG_SHARD, self.max_bytes, reqs)
        if bias_out is not None:
            irecv_array(self.roles.p2p, bias_out, src, TAG_SHARD_BIAS, self.max_bytes, reqs)
        wait_all(reqs)
        self.stats.add("shard", t0, messages=1 + (bias_out is not None),
                       inn=w_out.nbytes + (bias_out.nbytes if bias_out is not None else 0))


class ServerLink(_Link):
    """A server's side of the protocol. Every method is called on a server only.

    Parameters
    ----------
    roles : SandblasterRoles
        With ``role == SERVER``.
    max_bytes : int
        Largest single message in bytes.
    """

    def recv_program(self) -> tuple[np.ndarray, np.ndarray]:
        """Receive the next program (broadcast by :meth:`CoordinatorLink.send_program`).

        Returns
        -------
        ops : int64 (n, 4)
        scalars : float64 (n,)
        """
        t0 = time.perf_counter()
        wait_all([self.roles.cs.Ibcast(self._ops, root=0),
                  self.roles.cs.Ibcast(self._scalars, root=0)])
        n = int(self._ops[0])
        if not 0 <= n <= MAX_OPS:
            raise ValueError(f"corrupt program: {n} operations (at most {MAX_OPS})")
        self.stats.add("program", t0, messages=2,
                       inn=self._ops.nbytes + self._scalars.nbytes)
        return (self._ops[1:1 + OP_WIDTH * n].reshape(n, OP_WIDTH).copy(),
                self._scalars[:n].copy())

    def recv_bounds(self) -> np.ndarray:
        """Receive the compact index bounds of every server, int64 (n_servers + 1,)
        (broadcast by :meth:`CoordinatorLink.bcast_bounds`)."""
        t0 = time.perf_counter()
        buf = np.zeros(self.roles.n_servers + 1, dtype=np.int64)
        wait_all([self.roles.cs.Ibcast(buf, root=0)])
        self.stats.add("setup", t0, inn=buf.nbytes)
        return buf

    def reduce_results(self, sums: np.ndarray, maxes: np.ndarray) -> None:
        """Contribute this shard's partial results (matches
        :meth:`CoordinatorLink.reduce_results`); vectors of length 0 are not exchanged."""
        t0 = time.perf_counter()
        sums = native_contiguous(np.asarray(sums, dtype=np.float64))
        maxes = native_contiguous(np.asarray(maxes, dtype=np.float64))
        reqs: list = []
        if sums.size:
            reqs.append(self.roles.cs.Ireduce(sums, None, op=MPI.SUM, root=0))
        if maxes.size:
            reqs.append(self.roles.cs.Ireduce(maxes, None, op=MPI.MAX, root=0))
        wait_all(reqs)
        self.stats.add("results", t0, messages=(sums.size > 0) + (maxes.size > 0),
                       out=sums.nbytes + maxes.nbytes)

    def send_params(self, w: np.ndarray, bias: np.ndarray | None) -> None:
        """Send this shard's weights ``w`` (float64 (n_w,)) and, on the bias server, ``bias``
        (float64 (1,)) to every worker; returns when the sends completed. Matches
        :meth:`WorkerLink.recv_params` on every worker."""
        t0 = time.perf_counter()
        reqs: list = []
        keep = []
        for dest in self.roles.worker_ranks:
            keep.append(isend_array(self.roles.p2p, w, dest, TAG_PARAMS, self.max_bytes, reqs))
            if bias is not None:
                keep.append(isend_array(self.roles.p2p, bias, dest, TAG_PARAMS_BIAS,
                                        self.max_bytes, reqs))
        wait_all(reqs)
        n = self.roles.n_workers
        self.stats.add("params", t0, messages=n * (1 + (bias is not None)),
                       out=n * (w.nbytes + (bias.nbytes if bias is not None else 0)))

    def recv_grad_sum(self, w_out: np.ndarray, bias_out: np.ndarray | None,
                      scratch: np.ndarray) -> None:
        """Receive every worker's gradient sums for this shard and add them up, in worker
        order (matches :meth:`WorkerLink.send_grads` on every worker).

        Parameters
        ----------
        w_out : float64 (n_w,)
            Output: the sum over workers of their weight-gradient slices.
        bias_out : float64 (1,) or None
            Output on the bias server: the summed bias gradient.
        scratch : float64 (n_w,)
            Receive buffer.
        """
        t0 = time.perf_counter()
        w_out[:] = 0.0
        one = np.zeros(1, dtype=np.float64)
        if bias_out is not None:
            bias_out[:] = 0.0
        for src in self.roles.worker_ranks:
            reqs: list = []
            irecv_array(self.roles.p2p, scratch, src, TAG_GRAD, self.max_bytes, reqs)
            if bias_out is not None:
                irecv_array(self.roles.p2p, one, src, TAG_GRAD_BIAS, self.max_bytes, reqs)
            wait_all(reqs)
            w_out += scratch
            if bias_out is not None:
                bias_out += one
        n = self.roles.n_workers
        self.stats.add("grads", t0, messages=n * (1 + (bias_out is not None)),
                       inn=n * (scratch.nbytes + (8 if bias_out is not None else 0)))

    def send_shard(self, w: np.ndarray, bias: np.ndarray | None) -> None:
        """Send this shard's weights (and bias) to the coordinator (matches
        :meth:`CoordinatorLink.recv_shard`)."""
        t0 = time.perf_counter()
        reqs: list = []
        keep = [isend_array(self.roles.p2p, w, 0, TAG_SHARD, self.max_bytes, reqs)]
        if bias is not None:
            keep.append(isend_array(self.roles.p2p, bias, 0, TAG_SHARD_BIAS, self.max_bytes, reqs))
        wait_all(reqs)
        self.stats.add("shard", t0, messages=len(keep),
                       out=w.nbytes + (bias.nbytes if bias is not None else 0))


class WorkerLink(_Link):
    """A worker's side of the protocol. Every method is called on a worker only.

    Parameters
    ----------
    roles : SandblasterRoles
        With ``role == WORKER``.
    max_bytes : int
        Largest single message in bytes.
    """

    def send_active(self, active: np.ndarray) -> None:
        """Send the sorted active key positions, int64 (n_active,), to the coordinator (worker
        0 only; matches :meth:`CoordinatorLink.recv_active`)."""
        t0 = time.perf_counter()
        active = native_contiguous(np.asarray(active, dtype=np.int64))
        size = np.array([active.size], dtype=np.int64)
        reqs: list = [self.roles.p2p.Isend(size, dest=0, tag=TAG_ACTIVE_SIZE)]
        keep = isend_array(self.roles.p2p, active, 0, TAG_ACTIVE, self.max_bytes, reqs)
        wait_all(reqs)
        del keep
        self.stats.add("setup", t0, messages=2, out=8 + active.nbytes)

    def recv_command(self) -> tuple[int, int]:
        """Receive the next command (broadcast by :meth:`CoordinatorLink.command_workers`).

        Returns
        -------
        (cmd, ident) : (int, int)
        """
        t0 = time.perf_counter()
        buf = np.zeros(2, dtype=np.int64)
        wait_all([self.roles.cw.Ibcast(buf, root=0)])
        self.stats.add("command", t0, inn=buf.nbytes)
        return int(buf[0]), int(buf[1])

    def recv_params(self, w_parts: list, bias_out: np.ndarray, bias_server: int) -> None:
        """Receive the evaluation point from every server (sent by
        :meth:`ServerLink.send_params`).

        Parameters
        ----------
        w_parts : list of float64 arrays
            ``w_parts[s]`` receives server ``s``'s weights; C-contiguous views into the
            worker's whole parameter vector (so nothing is copied).
        bias_out : float64 (1,)
            Receives the bias from server ``bias_server``.
        bias_server : int
            Index of the server that holds the bias.
        """
        t0 = time.perf_counter()
        reqs: list = []
        for s, src in enumerate(self.roles.server_ranks):
            irecv_array(self.roles.p2p, w_parts[s], src, TAG_PARAMS, self.max_bytes, reqs)
        irecv_array(self.roles.p2p, bias_out, self.roles.server_ranks[bias_server],
                    TAG_PARAMS_BIAS, self.max_bytes, reqs)
        wait_all(reqs)
        self.stats.add("params", t0, messages=len(w_parts) + 1,
                       inn=sum(p.nbytes for p in w_parts) + bias_out.nbytes)

    def request_unit(self, eval_id: int, done: int) -> int:
        """Report the finished unit ``done`` (-1 = none) of evaluation ``eval_id`` and ask the
        coordinator for the next one (answered via :meth:`CoordinatorLink.send_unit`).

        Returns
        -------
        int
            The next unit id, or -1 when the evaluation has no unit left for this worker.
        """
        t0 = time.perf_counter()
        req = np.array([eval_id, done], dtype=np.int64)
        rep = np.zeros(1, dtype=np.int64)
        wait_all([self.roles.p2p.Isend(req, dest=0, tag=TAG_UNIT_REQ),
                  self.roles.p2p.Irecv(rep, source=0, tag=TAG_UNIT)])
        self.stats.add("units", t0, messages=2, out=req.nbytes, inn=rep.nbytes)
        return int(rep[0])

    def send_grads(self, w_parts: list, gbias: np.ndarray, bias_server: int) -> None:
        """Send the gradient sums to every server (received by
        :meth:`ServerLink.recv_grad_sum`).

        Parameters
        ----------
        w_parts : list of float64 arrays
            ``w_parts[s]``: the slice of server ``s``.
        gbias : float64 (1,)
            The bias gradient sum, sent to server ``bias_server``.
        bias_server : int
            Index of the server that holds the bias.
        """
        t0 = time.perf_counter()
        reqs: list = []
        keep = []
        for s, dest in enumerate(self.roles.server_ranks):
            keep.append(isend_array(self.roles.p2p, w_parts[s], dest, TAG_GRAD, self.max_bytes,
                                    reqs))
        keep.append(isend_array(self.roles.p2p, gbias, self.roles.server_ranks[bias_server],
                                TAG_GRAD_BIAS, self.max_bytes, reqs))
        wait_all(reqs)
        self.stats.add("grads", t0, messages=len(keep),
                       out=sum(p.nbytes for p in w_parts) + gbias.nbytes)

    def gather_stats(self, row: np.ndarray) -> None:
        """Contribute this worker's float64 statistics row (matches
        :meth:`CoordinatorLink.gather_worker_stats`)."""
        t0 = time.perf_counter()
        row = native_contiguous(np.asarray(row, dtype=np.float64))
        wait_all([self.roles.cw.Igather(row, None, root=0)])
        self.stats.add("stats", t0, out=row.nbytes)
