"""The summary's lines about what the run went through: ranks lost and the recovery from each
(continue mode, ``summary.failures``), workers added (``summary.growth``) and the launches of
a restarted or resumed run (``summary.launches``). The chief prints each when it happens, but
in a long log those lines scroll away (a trial of 24-48 ranks: the last screen did not tell
that the run had lost a server or grown from 8 to 16 workers). Up to :data:`MANY` events a
line each, more as their spread. No MPI.
"""

from __future__ import annotations

from hpcps.analysis.listing import MANY, id_ranges, spread

__all__ = ["incident_lines"]


def incident_lines(s: dict) -> list[str]:
    """The lines of ``s`` (:func:`hpcps.runtime.report.summarize`'s dict as ``metrics.json``
    keeps it) about its restarted launches, failures and growths; [] for a run that had none.

    Parameters
    ----------
    s : dict
        The run's summary: ``launches``, ``failures``, ``growth`` and ``replicas`` are read
        when present.

    Returns
    -------
    list of str
    """
    return (_launch_lines(s.get("launches") or [])
            + _failure_lines(s.get("failures") or [], s.get("replicas"))
            + _growth_lines(s.get("growth") or []))


def _n(count: int, word: str) -> str:
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def _ids(word: str, ids) -> str:
    """``"worker 3"``, ``"workers 0-2, 5"``."""
    ids = list(ids)
    return f"{word}{'' if len(ids) == 1 else 's'} {id_ranges(ids)}"


def _when(ev: dict) -> str:
    epoch = f" (epoch {ev['epoch']})" if ev.get("epoch") is not None else ""
    return f"clock {int(ev.get('clock') or 0):,}{epoch}"


def _secs(v) -> str:
    return f"{float(v):.2f} s"


def _spread_secs(values) -> str:
    """:func:`spread` of seconds, the unit once: ``"0.01 .. 4.00 s (median 1.95)"``."""
    text = spread(values, lambda v: f"{v:.2f}")
    return text.replace(" (", " s (", 1) if " (" in text else text + " s"


# ------------------------------------------------------------------------------ launches

def _launch_lines(launches: list) -> list[str]:
    """The launches of a run of more than one: when each started, where it resumed, the
    restart and the exit status it followed, and how many of its steps the next one kept."""
    runs = [r for r in launches if isinstance(r, dict)]
    if len(runs) < 2:
        return []
    restarts = [r for r in runs if "restart" in r]
    by = (f"{_n(len(restarts), 'restart')} by hpcps run --max-restarts; " if restarts else "")
    head = f"  launches: {len(runs)} ({by}metrics.json summary.launches)"
    if len(runs) > MANY:
        statuses = sorted({int(r["after_status"]) for r in restarts if "after_status" in r})
        kept = [int(r["steps_kept"]) for r in runs if "steps_kept" in r]
        return [head + ": " + "; ".join(filter(None, (
            f"exit status(es) {', '.join(map(str, statuses))}" if statuses else "",
            f"steps kept per launch {spread(kept)}" if kept else "",
            f"the last resumed at step {int(runs[-1].get('resumed_from_step') or 0):,}")))]
    return [head] + [f"    {_launch(r, i == len(runs) - 1)}" for i, r in enumerate(runs)]


def _launch(r: dict, this: bool) -> str:
    started = str(r.get("started", "")).replace("T", " ").replace("+00:00", " UTC")
    at = r.get("resumed_from_step")
    text = f"launch {r.get('launch', '?')}" + (f" started {started}" if started else "")
    if "restart" in r:
        text += f": restart {r['restart']} after exit status {r.get('after_status', '?')}"
    text += f", resumed at step {int(at):,}" if at is not None else ", from step 0"
    if "steps_kept" in r:
        text += f"; {_n(int(r['steps_kept']), 'step')} of it kept by the next"
    return text + (" (this launch)" if this else "")


# ------------------------------------------------------------------------------ failures

def _failure_lines(events: list, replicas=None) -> list[str]:
    """The ranks lost and the recoveries (continue mode): a line each, or their spread."""
    events = [e for e in events if isinstance(e, dict)]
    if not events:
        return []
    copies = f", {replicas} copies of each key range" if (replicas or 0) > 1 else ""
    head = (f"  failures: {len(events)} survived (continue mode{copies}; "
            "metrics.json summary.failures)")
    if len(events) <= MANY:
        return [head] + [f"    {_failure(e)}" for e in events]
    workers = [w for e in events for w in e.get("dead_workers", [])]
    servers = [v for e in events for v in e.get("dead_servers", [])]
    hosts = sorted({h for e in events for h in e.get("failed_hosts", [])})
    lost = ", ".join(filter(None, (
        f"{_n(len(workers), 'worker')} ({id_ranges(workers)})" if workers else "",
        f"{_n(len(servers), 'server')} ({id_ranges(servers)})" if servers else "")))
    on = (f" on {', '.join(hosts)}" if len(hosts) <= MANY else f" on {len(hosts)} hosts")
    clocks = [int(e.get("clock") or 0) for e in events]
    rec = [float(e["recovery_seconds"]) for e in events if "recovery_seconds" in e]
    gap = [float(e["gap_seconds"]) for e in events if "gap_seconds" in e]
    moved = sum(len(e.get("ranges_moved") or {}) for e in events)
    reloaded = sum(len(e.get("ranges_reloaded") or []) for e in events)
    steps_lost = sum(int(v) for e in events for v in (e.get("lost_steps") or {}).values())
    return [head + f"; lost {lost or 'ranks'}{on}; clocks {spread(clocks)}"
            + (f"; recovery {_spread_secs(rec)}" if rec else "")
            + (f", training paused {_spread_secs(gap)}" if gap else "")
            + f"; {sum(int(e.get('examples_reassigned') or 0) for e in events):,} examples "
              "reassigned"
            + (f"; key ranges taken over by a backup {moved}" if moved else "")
            + (f"; reloaded from a checkpoint {reloaded} ({_n(steps_lost, 'step')} of "
               "updates lost)" if reloaded else "")]


def _failure(e: dict) -> str:
    """One failure: when, who (ranks, hosts), the mode's response, the recovery time."""
    who = []
    if e.get("dead_workers"):
        who.append(_ids("worker", e["dead_workers"]))
    if e.get("dead_servers"):
        who.append(_ids("server", e["dead_servers"]))
    hosts = sorted(set(e.get("failed_hosts") or []))
    where = ", ".join(filter(None, (
        _ids("rank", e["failed_ranks"]) if e.get("failed_ranks") else "",
        f"on {', '.join(hosts)}" if hosts else "")))
    text = (f"{_when(e)}: {' and '.join(who) or 'a rank'} lost"
            + (f" ({where})" if where else ""))
    if e.get("dead_workers"):
        text += (f"; {e.get('survivors', '?')} worker(s) continue, "
                 f"{int(e.get('examples_reassigned') or 0):,} unread example(s) of the epoch "
                 "reassigned")
    for r, v in sorted((e.get("ranges_moved") or {}).items(), key=lambda kv: int(kv[0])):
        text += f"; key range {r} taken over by server {v} (its backup copy)"
    for r in e.get("ranges_reloaded") or []:
        k, n = e.get("reload_step"), int((e.get("lost_steps") or {}).get(str(r), 0))
        src = f"checkpoint step {k:,}" if k else "its initial values"
        text += f"; key range {r} reloaded from {src}, {_n(n, 'step')} of its updates lost"
    if "recovery_seconds" in e:
        text += f"; recovered in {_secs(e['recovery_seconds'])}"
    if "gap_seconds" in e:
        text += f", training paused {_secs(e['gap_seconds'])}"
    return text


# ------------------------------------------------------------------------------ growths

def _before(ev: dict) -> int:
    """Workers before a growth (its record's ``workers_before``; records written before it
    was kept: the workers after it less those added)."""
    if "workers_before" in ev:
        return int(ev["workers_before"])
    return int(ev.get("workers", 0)) - int(ev.get("workers_added", 0))


def _growth_lines(events: list) -> list[str]:
    """The workers added (and the requests refused): a line each, or their spread."""
    events = [e for e in events if isinstance(e, dict)]
    grown = [e for e in events if "refused" not in e and "workers" in e]
    refused = [e for e in events if "refused" in e]
    if not events:
        return []
    path = " -> ".join(str(n) for n in ([_before(grown[0])] if grown else [])
                       + [int(e["workers"]) for e in grown])
    head = (f"  growth: {_n(len(grown), 'growth')}"
            + (f", workers {path}" if grown and len(grown) <= MANY else "")
            + (f", {len(refused)} refused" if refused else "")
            + " (metrics.json summary.growth)")
    if len(events) <= MANY:
        return [head] + [f"    {_growth(e)}" for e in events]
    pause = [float(e["pause_seconds"]) for e in grown if "pause_seconds" in e]
    clocks = [int(e.get("clock") or 0) for e in grown]
    return [head + (f"; workers {_before(grown[0])} -> {int(grown[-1]['workers'])}, "
                    f"{sum(int(e.get('workers_added', 0)) for e in grown):,} added at clocks "
                    f"{spread(clocks)}" if grown else "")
            + (f"; pause {_spread_secs(pause)} (in all {sum(pause):.2f} s)" if pause else "")]


def _growth(e: dict) -> str:
    """One growth: when, from how many workers to how many, what asked, the pause."""
    why = {"job file": " ([elastic] at_step)", "request": " (hpcps grow)"}.get(
        e.get("trigger"), "")
    if "refused" in e:
        return (f"{_when(e)}: {int(e.get('workers_requested', 0))} worker(s) requested{why}; "
                f"refused: {e['refused']}")
    text = (f"{_when(e)}: {int(e.get('workers_added', 0))} worker(s) added{why}: "
            f"{_before(e)} -> {int(e['workers'])} workers")
    lost = _before(e) + int(e.get("workers_added", 0)) - int(e["workers"])
    if lost > 0:
        text += f" ({lost} lost at once)"
    if "pause_seconds" in e:
        text += f"; pause {_secs(e['pause_seconds'])}"
        if "spawn_seconds" in e:
            text += f" (spawn {_secs(e['spawn_seconds'])})"
    return text
