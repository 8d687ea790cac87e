"""The communication layer: the only part of hpcps that imports :mod:`mpi4py`.

Submodules
----------
core
    World checks, the server/worker role split, abort-on-error, dtype-derived buffer sends
    with splitting of messages over ``max_message_bytes``.
notices
    When one rank finds an input error, every other rank prints why the job stops (a notice
    sent before the abort, heard by a thread on each rank).
progress
    Whether the MPI gives one-sided reads passive progress, and what to set if not.
transport
    The parameter-server wire protocol (request headers, tags, ops) over point-to-point
    buffer calls, with per-op counters of messages, bytes and seconds.
sandblaster
    Sandblaster L-BFGS (``[cluster] mode = "sandblaster"``): the coordinator/worker/server
    split and the messages between them (programs, results, work units, parameters,
    gradients), all non-blocking buffer calls completed by polling with short sleeps.
"""
