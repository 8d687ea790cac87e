"""What ``hpcps run`` says after mpirun ended the job because a rank was lost. No MPI.

In restart mode (``[fault_tolerance] mode = "restart"``, the default) a rank that dies —
``kill -9``, the out-of-memory killer, a crash — is noticed by MPI's runtime, not by hpcps:
without ULFM no MPI call of the other ranks returns an error for it. Open MPI's ``prterun``
sees its process end, prints its own message ("prterun noticed that process rank 3 with PID
... exited on signal 9") and ends every other rank (SIGTERM, then SIGKILL) within about a
second, wherever they were waiting: in the final checkpoint (the chief writing the manifest,
the other workers in the totals' Allreduce, the servers serving), in a step, in the report.
No hpcps code runs on them again, so no rank can explain the loss; ``hpcps run`` can, from
mpirun's stderr (which rank ended, and how: :func:`find_lost`) and the run directory (the
checkpoints, the epochs recorded): :func:`explain`.
"""

from __future__ import annotations

import json
import re
import signal
from dataclasses import dataclass
from pathlib import Path

from hpcps import checkpoint as ckpt

#: Open MPI 5 (``prterun``) and 4 (``mpirun``): help text ``prun:proc-aborted(-strsignal)``
_SIGNALLED = re.compile(r"noticed that process rank (\d+) with PID (\d+) on node (\S+) "
                        r"exited on\s+signal (\d+)")
#: Open MPI 5: help text ``prun:non-zero-exit`` (``Process name: [prterun-HOST-PID@1,RANK]``)
_NONZERO = re.compile(r"detected that one or more processes exited with non-zero status.*?"
                      r"Process name:\s*\[[^\]]*?,(\d+)\]\s*Exit code:\s*(\d+)", re.S)
#: MPICH's Hydra: ``RANK 3 PID 123 RUNNING AT host`` then ``KILLED BY SIGNAL: 9 (Killed)``
_HYDRA = re.compile(r"RANK (\d+) PID (\d+) RUNNING AT (\S+)\s*=?\s*KILLED BY SIGNAL: (\d+)")


@dataclass(frozen=True)
class Lost:
    """A rank that mpirun saw end, from its message.

    Attributes
    ----------
    rank : int
        World rank (of the launch's ranks).
    signal : int or None
        The signal that ended it, or None when it exited with ``status``.
    status : int or None
        Its exit status when it was not ended by a signal.
    host : str or None
    pid : int or None
    """

    rank: int
    signal: int | None = None
    status: int | None = None
    host: str | None = None
    pid: int | None = None

    def how(self) -> str:
        """``"killed by signal 9 (SIGKILL) on host vm"`` or ``"exited with status 1"``."""
        if self.signal is not None:
            text = f"killed by signal {self.signal}{_signal_name(self.signal)}"
        else:
            text = f"exited with status {self.status}"
        return f"{text} on host {self.host}" if self.host else text


def _signal_name(signum: int) -> str:
    try:
        return f" ({signal.Signals(signum).name})"
    except ValueError:
        return ""


def find_lost(text: str) -> Lost | None:
    """The rank mpirun's message in ``text`` (the end of its stderr) names as the first to
    end, or None when there is no such message (Open MPI 4 and 5, MPICH's Hydra). Local."""
    found = []
    for m in _SIGNALLED.finditer(text):
        found.append((m.start(), Lost(int(m[1]), signal=int(m[4]), host=m[3], pid=int(m[2]))))
    for m in _HYDRA.finditer(text):
        found.append((m.start(), Lost(int(m[1]), signal=int(m[4]), host=m[3], pid=int(m[2]))))
    for m in _NONZERO.finditer(text):
        found.append((m.start(), Lost(int(m[1]), status=int(m[2]))))
    return min(found, key=lambda f: f[0])[1] if found else None


def role_of(cfg, n_ranks: int, rank: int) -> str:
    """``"worker 0, the chief"``, ``"worker 2"``, ``"server 1"`` or ``"the coordinator"``:
    what world rank ``rank`` of ``n_ranks`` does in the job (its layout at the launch:
    servers are the last ``[cluster] servers`` ranks). Local."""
    mode, k = cfg.cluster.mode, cfg.cluster.servers
    if not 0 <= rank < n_ranks:
        return "not one of the launch's ranks: an added worker?"
    if mode == "allreduce":
        return f"worker {rank}" + (", the chief" if rank == 0 else "")
    if mode == "sandblaster":
        if rank == 0:
            return "the coordinator"
        return f"server {rank - (n_ranks - k)}" if rank >= n_ranks - k else f"worker {rank - 1}"
    if rank >= n_ranks - k:
        return f"server {rank - (n_ranks - k)}"
    return f"worker {rank}" + (", the chief" if rank == 0 else "")


def _fresh(path: Path, since: float) -> bool:
    """Whether ``path`` or an entry of it (a directory) changed at or after ``since``."""
    try:
        times = [path.stat().st_mtime]
        if path.is_dir():
            times += [p.stat().st_mtime for p in path.iterdir()]
    except OSError:
        return False
    return max(times) >= since - 1.0


def _epochs_done(run_dir: Path, since: float) -> int | None:
    """Epochs recorded in ``metrics.json`` when this launch wrote it, else None."""
    path = run_dir / "metrics.json"
    if not _fresh(path, since):
        return None
    try:
        return len(json.loads(path.read_text()).get("epochs", []))
    except (OSError, ValueError, AttributeError):
        return None


def where(cfg, since: float) -> tuple[str, str]:
    """``(when, resume)``: when in the run the loss came, and where the run resumes, from the
    run directory (``[output] dir``) as this launch (started at ``since``, a ``time.time()``)
    left it. Local; reads the checkpoints (:func:`hpcps.checkpoint.scan`: the newest is
    verified, as a relaunch does)."""
    run_dir = Path(cfg.output.dir)
    epochs, done = cfg.train.epochs, _epochs_done(run_dir, since)
    found, tried = ckpt.scan(run_dir)
    whole = found[0].name if found else None
    # the checkpoint being written at the loss: the newest, unusable, written by this launch
    broken = tried[0] if tried and _fresh(ckpt.ckpt_root(run_dir) / tried[0][0], since) else None
    skipped = ""
    if broken:
        name, why = broken
        step = int(name.rsplit("-", 1)[1])
        if done is not None and done >= epochs:
            when = (f"during the final checkpoint of step {step} (after the last epoch, "
                    f"{epochs} of {epochs})")
        else:
            when = f"during the checkpoint of step {step}"
        skipped = f"checkpoint {name} is incomplete ({_incomplete(why)}) and will be skipped; "
    elif done is not None and done >= epochs:
        when = (f"after the last epoch ({epochs} of {epochs}), after its final checkpoint "
                f"{whole} was written, while the run ended (totals, model, report)"
                if whole and _fresh(found[0], since) else
                f"after the last epoch ({epochs} of {epochs}), while the run ended")
    elif done is not None:
        when = f"during training (epoch {done + 1} of {epochs})"
    else:
        when = "during training"
    if whole:
        resume = (f"{skipped}the run resumes from checkpoint {whole}, the newest whole one "
                  f"(in {ckpt.ckpt_root(run_dir)})")
    else:
        resume = f"{skipped}no whole checkpoint in {ckpt.ckpt_root(run_dir)}: the run starts afresh"
    return when, resume


def _incomplete(why: str) -> str:
    """:func:`hpcps.checkpoint.scan`'s reason for an unusable checkpoint, shorter when it is
    the usual one after a loss: ``"no manifest.h5 written; .shard-0000.h5.x1y2.tmp left by
    an interrupted write"``."""
    m = re.fullmatch(rf"no {re.escape(ckpt.MANIFEST)} \(checkpoint incomplete(?:: (.*))?\)", why)
    if m is None:
        return why
    return f"no {ckpt.MANIFEST} written" + (f"; {m[1]}" if m[1] else "")


def explain(cfg, n_ranks: int, status: int, stderr: str, since: float, command: str,
            relaunch: str | None = None) -> str | None:
    """The lines ``hpcps run`` prints after mpirun exited with ``status`` because a rank was
    lost, or None when ``stderr`` (the end of mpirun's) names no rank that ended and
    ``status`` is no signal's (``128 + N``). Call it only when no rank aborted the job
    (those say why themselves) and no stop signal was forwarded. Local.

    Parameters
    ----------
    cfg : hpcps.config.JobConfig
    n_ranks : int
        The launch's ranks.
    status : int
        mpirun's exit status.
    stderr : str
        The end of mpirun's stderr (:data:`hpcps.runtime.launch.last`).
    since : float
        ``time.time()`` at the launch's start: what the run directory holds from before is
        not this launch's.
    command : str
        The command that resumes the run (``hpcps run ...``).
    relaunch : str or None
        ``"restart 1/2"`` when ``hpcps run`` relaunches the job itself now.

    Returns
    -------
    str or None
        Lines, each starting ``hpcps run: ``, ending with a newline.
    """
    lost = find_lost(stderr)
    if lost is None and not 128 < status < 128 + 65:
        return None
    if lost is not None:
        who = f"rank {lost.rank} ({role_of(cfg, n_ranks, lost.rank)}) was lost: {lost.how()}"
    else:
        who = (f"a rank was lost (mpirun exited with status {status}: a process was killed "
               f"by signal {status - 128}{_signal_name(status - 128)})")
    try:
        when, resume = where(cfg, since)
    except Exception as e:          # noqa: BLE001 - the explanation must not fail the launcher
        when, resume = "", f"the run directory could not be read ({e}); the run resumes " \
                           "from its newest whole checkpoint"
    mode = ("; a lost rank stops the job in restart mode ([fault_tolerance] mode = "
            "\"restart\", the default)" if cfg.fault_tolerance.mode == "restart" else "")
    lines = [f"{who}{', ' + when if when else ''}{mode}.", resume[:1].upper() + resume[1:]]
    if relaunch:
        lines[-1] += f": relaunching it now ({relaunch})."
    else:
        lines[-1] += ", with:"
        lines.append(f"  {command}")
    return "".join(f"hpcps run: {line}\n" for line in lines)
