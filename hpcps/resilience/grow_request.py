"""The run-directory side of ``hpcps grow`` (no MPI): how a user asks a running job for more
workers, and how the job answers (:mod:`hpcps.resilience.elastic` acts on it).

Files in the run directory (JSON, written to a temporary name and renamed into place)
    ``running.json``
        written by the chief (worker 0) while a parameter-server job trains, removed at its
        end: job name, pid and host of the chief, workers and servers now, whether this
        launch can add processes (and why not).
    ``grow-request.json``
        written by ``hpcps grow``: ``{"id", "workers", "oversubscribe", "time", "host",
        "user", "pid"}``; the chief takes (deletes) it between two steps.
    ``grow-answer.json``
        written by the chief: ``{"id", "status": "grown" | "refused", "message", "time",
        ...}``.

No pickle: JSON only, and the request is checked key by key (:func:`read_request`).
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from pathlib import Path

from hpcps.runtime.output import write_metrics
from hpcps.runtime.rundir import ANSWER, CKPT, METRICS, REQUEST, RUNNING  # noqa: F401 (re-exported)
#: Largest request file read, bytes.
MAX_REQUEST_BYTES = 65536
#: Largest number of workers one request may add.
MAX_ADD = 4096


class GrowError(RuntimeError):
    """``hpcps grow`` cannot hand a request to a running job (no job, finished, bad input)."""


def unlink(path: Path) -> None:
    """Remove ``path`` if it exists. Local."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def write_running(run_dir, info: dict) -> None:
    """Write ``RUN_DIR/running.json`` (chief, while the job trains). Local."""
    write_metrics(Path(run_dir) / RUNNING, info)


def write_answer(run_dir, rid, status: str, message: str, **extra) -> None:
    """Answer request ``rid`` in ``RUN_DIR/grow-answer.json`` (chief). Local."""
    write_metrics(Path(run_dir) / ANSWER, {"id": rid, "status": status, "message": message,
                                           "time": time.time(), **extra})


def read_request(path: Path) -> dict:
    """Read and check a request file: ``{"workers": int in [1, MAX_ADD], "oversubscribe":
    bool, "id": str, ...}``. Local.

    Raises
    ------
    GrowError
        Naming the file and what is wrong.
    """
    try:
        raw = path.read_bytes()[:MAX_REQUEST_BYTES + 1]
        if len(raw) > MAX_REQUEST_BYTES:
            raise GrowError(f"{path}: larger than {MAX_REQUEST_BYTES} bytes")
        req = json.loads(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise GrowError(f"{path}: not a readable JSON request: {e}") from None
    if not isinstance(req, dict):
        raise GrowError(f"{path}: expected a JSON object")
    n = req.get("workers")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_ADD:
        raise GrowError(f"{path}: workers: must be an integer in [1, {MAX_ADD}], got {n!r}")
    over = req.setdefault("oversubscribe", False)
    if not isinstance(over, bool):
        raise GrowError(f"{path}: oversubscribe: must be true or false, got {over!r}")
    return req


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host and is an hpcps process."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return b"hpcps" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True


def running_job(run_dir) -> dict:
    """The ``running.json`` record of the job running in ``run_dir``. Local.

    Raises
    ------
    GrowError
        When ``run_dir`` is not a run directory, its job has finished or stopped, its chief
        is no longer alive (on this host), or the job cannot grow.
    """
    d = Path(run_dir)
    if not d.is_dir():
        raise GrowError(f"{d}: no such directory (give the job's run directory, "
                        "[output] dir, e.g. runs/<job name>)")
    marker = d / RUNNING
    if not marker.exists():
        metrics = d / METRICS
        try:
            done = "summary" in json.loads(metrics.read_text())
        except (OSError, ValueError):
            done = False
        if done:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(metrics.stat().st_mtime))
            raise GrowError(f"{d}: the job has finished (its summary was written at {when}); "
                            "there is nothing running to add workers to")
        if metrics.exists() or (d / CKPT).exists():
            raise GrowError(f"{d}: no parameter-server job is running here (no {RUNNING}: the "
                            "last one stopped, or has not started training yet)")
        raise GrowError(f"{d}: not an hpcps run directory (no {RUNNING}, {METRICS} or {CKPT}/)")
    try:
        info = json.loads(marker.read_text())
        pid, host = int(info["pid"]), str(info["host"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise GrowError(f"{marker}: unreadable ({e})") from None
    if host == socket.gethostname() and not _alive(pid):
        raise GrowError(f"{d}: the job is not running: its chief (pid {pid} on {host}) has "
                        "exited without finishing (killed, or it crashed)")
    if not info.get("can_grow", False):
        raise GrowError(f"{d}: this job cannot add workers: {info.get('why_not') or '?'}")
    return info


def submit_request(run_dir, workers: int, oversubscribe: bool = False) -> str:
    """Check that a job runs in ``run_dir`` (:func:`running_job`) and leave it a request for
    ``workers`` more workers; returns the request's id. Local.

    Raises
    ------
    GrowError
        As :func:`running_job`; for ``workers`` outside ``[1, MAX_ADD]``; when a request is
        already pending.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_ADD:
        raise GrowError(f"--workers must be an integer in [1, {MAX_ADD}], got {workers!r}")
    running_job(run_dir)
    path = Path(run_dir) / REQUEST
    if path.exists():
        raise GrowError(f"{path}: a request is already pending (written "
                        f"{time.strftime('%H:%M:%S', time.localtime(path.stat().st_mtime))}); "
                        "wait for its answer in grow-answer.json")
    rid = uuid.uuid4().hex
    write_metrics(path, {"id": rid, "workers": workers, "oversubscribe": bool(oversubscribe),
                         "time": time.time(), "host": socket.gethostname(),
                         "user": os.environ.get("USER", str(os.getuid())), "pid": os.getpid()})
    return rid


def wait_answer(run_dir, rid: str, timeout: float, poll: float = 0.2) -> dict | None:
    """The answer to request ``rid``, waiting up to ``timeout`` seconds; None if none came
    (or the job is gone: then the request is withdrawn). Local."""
    path = Path(run_dir) / ANSWER
    deadline = time.monotonic() + timeout
    while True:
        try:
            ans = json.loads(path.read_text())
            if ans.get("id") == rid:
                return ans
        except (OSError, ValueError):
            pass
        if time.monotonic() >= deadline:
            return None
        if not (Path(run_dir) / RUNNING).exists():     # the job ended: one last look
            time.sleep(poll)
            try:
                ans = json.loads(path.read_text())
                return ans if ans.get("id") == rid else None
            except (OSError, ValueError):
                return None
        time.sleep(poll)
