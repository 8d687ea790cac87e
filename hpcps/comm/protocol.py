"""The parameter-server wire protocol over MPI point-to-point buffer calls.

Every request from a worker to a server is

1. a header: 9 int64 ``[op, table, clock, n_keys, n_examples, seq, dim, aux, range]``
   (tag ``TAG_REQ``),
2. for ``PULL`` and ``PUSH``: the keys, int64 ``(n_keys,)`` (tag ``TAG_KEYS``),
3. for ``PUSH``: the gradient rows, table dtype ``(n_keys, dim)`` (tag ``TAG_VALS``).

``PUSH_CLOCK`` is a worker's whole step for one key range in one request: the pushes of
every table it touched and its ``CLOCK`` (one trip through the server loop instead of one per
table plus one; :meth:`hpcps.worker.client.PSClient.clock`). Its header is the CLOCK's
(``n_examples``, ``aux`` = epoch) with ``table`` = the number of pushes ``P``; then an int64
``(P, PART_LEN)`` array, per push ``[table, n_keys, n_examples, dim, version]`` (tag
``TAG_KEYS``), then each push's keys and rows as in 2. and 3.; the server handles it as those
PUSHes followed by the CLOCK.

``PULL_MANY`` is a worker's pulls of several tables from one key range in one request (one
trip through the server loop instead of one per table; :meth:`hpcps.worker.client.PSClient.pull_many`).
Its header is a PULL's (``clock``, ``aux`` = fresh) with ``table`` = the number of pulls ``P``
and ``n_keys`` their total; then an int64 ``(P, PART_LEN)`` array, per pull ``[table, n_keys,
0, dim, 0]`` (tag ``TAG_KEYS``), then each pull's keys (tag ``TAG_KEYS``). The server answers
when the policy allows the read, with each pull's rows and shard clock header in the pulls'
order (as P PULL replies, which the worker's receives, posted in that order, match: MPI keeps
the messages of one tag in order).

``PUSH_CLOCK_PULL`` is a BSP or async worker's whole step for one key range *and* its next
step's pulls in one request (issue 20: one request per worker, server and step;
:meth:`hpcps.worker.client.PSClient.pull_next`). Its header is the ``PUSH_CLOCK``'s
(``clock`` = the step, ``n_examples``, ``aux`` = epoch, ``table`` = the number of pushes
``P >= 0``, ``n_keys`` their total) with ``dim`` = the number of pulls ``Q >= 1``; then an
int64 ``(P + Q, PART_LEN)`` array: the ``P`` pushes' descriptions, then the ``Q`` pulls' as
in a ``PULL_MANY`` (tag ``TAG_KEYS``); then each push's keys and rows, then each pull's keys.
The server handles it as the ``PUSH_CLOCK`` followed by a ``PULL_MANY`` at clock ``clock +
1`` (``aux`` = 0): the pulls are answered, as P PULL replies in order, once the step's clock
is applied — the rows the worker's next ``PULL_MANY`` would have got.

Requests up to 256 KiB and small replies travel as one message (issue 20: each message is a
trip through MPI and Python on both sides). A request whose header and parts given to
:meth:`WorkerEndpoint.send` fit in ``REQUEST_BYTES`` (and in ``max_message_bytes``;
:func:`one_request`) goes as one ``TAG_REQ`` message of bytes: the header, then those parts
(keys, then values) back to back (with ``more``: every part of a ``PULL_MANY``,
``PUSH_CLOCK`` or ``PUSH_CLOCK_PULL``, in the order the server receives them, when all fit);
the server's receives of the request's parts (:meth:`ServerEndpoint.recv_keys`,
:meth:`ServerEndpoint.recv_values`) take them from that message in order. A larger request
goes as its header with its first parts when they fit, and the rest as messages of their own.
Outside continue mode these messages are received, packed and sent by compiled calls
(:mod:`hpcps.comm.fastpath`; the Python path when it is not built). A reply to pulls — the
rows and shard clock header of a ``PULL``, those of every pull of a ``PULL_MANY`` or a
``PUSH_CLOCK_PULL`` in the request's order, or a ``PULL_SHARD`` chunk's rows and keys — that
fits in ``DEFER_MAX_BYTES`` (and ``max_message_bytes``) is one message of bytes on the reply
tag: each part's rows, then its header (:func:`one_reply`); both sides know from the numbers
of keys, the header length and ``max_message_bytes`` which form a reply takes. Up to
``INLINE_BYTES`` the server sends it at once (eager), larger from a pooled copy without waiting.
A larger reply is the rows and then the header, as messages of their own.

``range`` (``H_RANGE``) is the key range the request is for: the server index of the job's
key partition. It equals the index of the server rank that receives it, except after a
continue-mode job lost a server and another server took its range over (:mod:`hpcps.resilience.recovery`);
a server rank may then hold several ranges.

``PULL`` and ``PULL_SHARD`` are answered with rows (tag ``reply_tag(range)``); a ``PULL`` reply
is followed by the shard's int64 clock header (tag ``reply_tag(range) + 1``, layout in
:mod:`hpcps.core.consistency`), from which the worker learns the version it read. Each range has
its own pair of reply tags, so that the replies of two ranges held by one server rank never
match each other's receives, whatever order the server answers in. A ``PULL_SHARD`` of a
chunk of a dynamic table's sorted keys is answered like a ``PULL`` with the chunk's keys in
the place of the clock header. Header slot 7
(``H_AUX``) is, for ``PULL``, 1 when the read must see every update of clocks below the
request's clock whatever the consistency model (evaluation, final model), and for ``PUSH``
the shard version the gradient was computed on (for staleness), for ``PULL_SHARD`` what
part of the shard (0: all of it; a dynamic table's count, keys, rows, or ``n_keys`` of its
keys in ascending order from position ``seq`` with their rows; a fixed table's rows of the
keys ``[seq, seq + n_keys)``: :data:`hpcps.core.tables.PULL_SHARD_SORTED`,
:data:`~hpcps.core.tables.PULL_SHARD_KEY_RANGE`), for ``CLOCK`` the worker's
epoch (0-based; servers count examples per epoch), for ``GROW`` the number of workers to add
(:mod:`hpcps.resilience.elastic`; its ``n_keys`` slot is 1 to let them share cores). MPI keeps messages of
one (source, tag, communicator) in order, so the parts of a request are matched by the server
right after its header. Arrays over ``max_message_bytes`` go in several messages (see
:func:`hpcps.comm.core.chunk_slices`). All traffic uses the ``ps`` communicator of
:class:`hpcps.comm.core.Roles`, never the world communicator used by collectives.

Communication is counted: every endpoint keeps, per op, the number of messages, the bytes
and the seconds spent (:class:`TrafficStats`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from hpcps.comm.core import LaunchError

# ops (worker -> server; GROW: hpcps.resilience.elastic)
PULL, PUSH, CLOCK, PULL_SHARD, STOP, CHECKPOINT, GROW = 1, 2, 3, 4, 5, 6, 7
PUSH_CLOCK = 12
PULL_MANY = 13
PUSH_CLOCK_PULL = 14
# ops (server -> server: chain replication, hpcps.resilience.replica)
REPLICATE, REPL_CLOCK, REPL_ACK, REPL_DONE = 8, 9, 10, 11
OP_NAMES = {PULL: "pull", PUSH: "push", CLOCK: "clock", PULL_SHARD: "pull_shard", STOP: "stop",
            CHECKPOINT: "checkpoint", GROW: "grow", PUSH_CLOCK: "push", PULL_MANY: "pull",
            PUSH_CLOCK_PULL: "push", REPLICATE: "replicate",
            REPL_CLOCK: "replicate", REPL_ACK: "replicate", REPL_DONE: "replicate"}
# tags
TAG_SNAP, TAG_REQ, TAG_KEYS, TAG_VALS, TAG_REPLY, TAG_RHDR = 9, 11, 12, 13, 14, 15
HEADER_LEN = 9
HEADER_BYTES = 8 * HEADER_LEN
#: Bytes up to which a request (header and the parts sent with it) or a reply to pulls is one
#: message sent at once with a blocking send (see the module docstring); Open MPI's
#: shared-memory eager limit is 4 KiB.
INLINE_BYTES = 4096
#: Bytes up to which a request of more than ``INLINE_BYTES`` is still one message: packed by
#: the worker and sent without waiting, received by the server in one call into a buffer of
#: this size, so that its parts are taken apart as a small one's are (a BSP step of Adult's
#: e2e job, ~53 KB, was 7 messages and a Python call for each). Above this size the copies
#: into and out of one message cost more than the messages saved.
REQUEST_BYTES = 1 << 18
#: A reply to pulls of more than ``INLINE_BYTES`` and at most this many bytes is one message
#: (:func:`one_reply`), sent from a pooled copy without waiting (:meth:`ServerEndpoint.reply`):
#: its rendezvous completes only once the worker is inside MPI, which a worker that has just
#: sent its step is not yet. Larger replies are waited for: the copy costs more than it saves
#: (a 512 KiB dense pull took 191-249 us copied, 126-147 us waited for, bench_pushpull, load
#: 1.0-1.2). Until 2026-12-04 a single pull's reply of more than ``INLINE_BYTES`` was two
#: messages (rows, header) through the Python paths of both sides, and this limit 64 KiB:
#: bench_pushpull on one host, dense pull 8 KiB 87 -> 23-27 us (raw MPI 8), 64 KiB 111-147 ->
#: 54-66 us (raw 10); across the two test hosts 8 KiB 275 -> 93 us (raw 62).
DEFER_MAX_BYTES = 1 << 18


def one_reply(nbytes: int, max_bytes: int) -> bool:
    """Whether a reply to pulls (``nbytes`` of rows and shard clock headers in all: one
    ``PULL``'s, or every pull's of a ``PULL_MANY`` or ``PUSH_CLOCK_PULL``) travels as one
    message: at most ``DEFER_MAX_BYTES`` and not split by ``max_message_bytes`` (issue 20:
    a BSP step's weights and bias in one message instead of three; a mid-size pull in one
    message instead of two, both sides in compiled code)."""
    return nbytes <= DEFER_MAX_BYTES and nbytes <= max_bytes


def one_message(nbytes: int, max_bytes: int) -> bool:
    """Whether a request (header and parts) or a reply to pulls of ``nbytes`` in all travels
    as one message sent at once (eager, with a blocking send): at most ``INLINE_BYTES`` and
    not split by the endpoints' ``max_message_bytes`` (both sides apply the same rule)."""
    return nbytes <= INLINE_BYTES and nbytes <= max_bytes


def one_request(nbytes: int, max_bytes: int) -> bool:
    """Whether a request (header and every part) of ``nbytes`` in all travels as one message:
    at most ``REQUEST_BYTES`` and not split by the endpoints' ``max_message_bytes``."""
    return nbytes <= REQUEST_BYTES and nbytes <= max_bytes
H_OP, H_TABLE, H_CLOCK, H_NKEYS, H_NEX, H_SEQ, H_DIM, H_AUX, H_RANGE = range(9)
#: The buffer format of int64 keys (numpy's, native byte order), for the compiled path's
#: checks (:meth:`hpcps.comm.transport.WorkerEndpoint.request`); :func:`buffer_format`
#: gives a table dtype's.
KEY_FMT = memoryview(np.empty(0, dtype=np.int64)).format.encode()


def buffer_format(dtype) -> bytes:
    """The buffer-protocol format of native, C-contiguous numpy arrays of ``dtype``
    (``b"f"`` for float32), as :meth:`hpcps.comm.transport.WorkerEndpoint.request` compares
    it."""
    return memoryview(np.empty(0, dtype=np.dtype(dtype).newbyteorder("="))).format.encode()


def make_header(op: int, table: int = 0, clock: int = 0, n_keys: int = 0,
                n_examples: int = 0, seq: int = 0, dim: int = 0, aux: int = 0,
                rng: int = 0) -> np.ndarray:
    """Build a request header, int64 ``(9,)``; ``rng`` is the key range (``H_RANGE``)."""
    return np.array([op, table, clock, n_keys, n_examples, seq, dim, aux, rng], dtype=np.int64)


#: int64 values describing one part of a ``PUSH_CLOCK`` or ``PULL_MANY``: table, n_keys,
#: n_examples, dim, version (a pull's: table, n_keys, 0, dim, 0)
PART_LEN = 5


def part_of(h: np.ndarray) -> list:
    """The ``PUSH_CLOCK`` (``PULL_MANY``) description (``PART_LEN`` values) of the PUSH
    (PULL) with header ``h``."""
    return [int(h[H_TABLE]), int(h[H_NKEYS]), int(h[H_NEX]), int(h[H_DIM]), int(h[H_AUX])]


def part_header(h: np.ndarray, part) -> np.ndarray:
    """The PUSH header of push ``part`` (``PART_LEN`` values) of the ``PUSH_CLOCK`` ``h``, or
    the PULL header of pull ``part`` of the ``PULL_MANY`` ``h`` (its ``aux``: the
    request's fresh flag)."""
    table, n_keys, n_examples, dim, version = (int(v) for v in part)
    if int(h[H_OP]) == PULL_MANY:
        return make_header(PULL, table, int(h[H_CLOCK]), n_keys, 0, int(h[H_SEQ]), dim,
                           int(h[H_AUX]), int(h[H_RANGE]))
    return make_header(PUSH, table, int(h[H_CLOCK]), n_keys, n_examples, int(h[H_SEQ]), dim,
                       version, int(h[H_RANGE]))


def reply_tag(rng: int) -> int:
    """Tag of the replies for key range ``rng`` (the clock header follows with tag + 1)."""
    return TAG_REPLY + 2 * int(rng)


def max_ranges(tag_ub: int) -> int:
    """Largest number of key ranges whose reply tags fit under MPI's ``tag_ub``."""
    return (int(tag_ub) - TAG_RHDR) // 2


def check_ranges(comm: MPI.Comm, n_ranges: int) -> None:
    """Raise :class:`hpcps.comm.core.LaunchError` when ``n_ranges`` key ranges need reply tags
    beyond this MPI's ``MPI_TAG_UB`` (at least 32767 by the standard: 16376 ranges). Local."""
    ub = comm.Get_attr(MPI.TAG_UB)
    if ub is not None and n_ranges > max_ranges(ub):
        raise LaunchError(f"{n_ranges} servers need message tags up to "
                          f"{reply_tag(n_ranges - 1) + 1}, beyond this MPI's MPI_TAG_UB = {ub}; "
                          f"use at most {max_ranges(ub)} servers")


@dataclass
class TrafficStats:
    """Messages, bytes and seconds per op, counted by one endpoint.

    ``bytes_out``/``bytes_in`` are payload bytes (headers included) sent/received by this rank.
    """

    messages: dict = field(default_factory=dict)
    bytes_out: dict = field(default_factory=dict)
    bytes_in: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)
    keys: dict = field(default_factory=dict)

    def add(self, op: int, *, messages=0, out=0, inn=0, seconds=0.0, keys=0) -> None:
        name = OP_NAMES[op]
        d = self.messages       # unrolled: it runs several times per request on both sides
        d[name] = d.get(name, 0) + messages
        d = self.bytes_out
        d[name] = d.get(name, 0) + out
        d = self.bytes_in
        d[name] = d.get(name, 0) + inn
        d = self.seconds
        d[name] = d.get(name, 0) + seconds
        d = self.keys
        d[name] = d.get(name, 0) + keys

    def total(self, what: str, ops=None) -> float:
        d = getattr(self, what)
        return sum(v for k, v in d.items() if ops is None or k in ops)

    def export(self, what: str) -> float:
        """``what`` (``"bytes_in"``, ``"bytes_out"``, ...) of the final model's export
        (``PULL_SHARD``: the chief streams every table out after training)."""
        return getattr(self, what).get(OP_NAMES[PULL_SHARD], 0)

    def training(self, what: str) -> float:
        """:meth:`total` without the final model's export (at 32 M keys 72 % of a server's
        bytes sent were the export, which the summary gave as its pull replies)."""
        return self.total(what) - self.export(what)
