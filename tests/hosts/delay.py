#!/usr/bin/env python3
"""Delay every packet a test host receives by a fixed time: the latency of a link, where the
kernel has no ``netem`` (``tc qdisc ... netem delay``; the test machine's kernel is built
without it).

Runs inside the host's network namespace (``testhosts.py delay HOST MS`` starts it there and
adds the rule): an ``iptables`` rule of that namespace hands every packet arriving on ``eth0`` to
netfilter queue ``--queue`` (``NFQUEUE --queue-bypass``: while nothing listens the packets
pass), and this program gives each its verdict (accept) ``--ms`` milliseconds after it was
queued, in the order they came (a constant delay keeps the order). Packets are held by
``libnetfilter_queue`` through the ``NetfilterQueue`` binding (pip; apt: iptables,
libnetfilter-queue-dev); only their metadata is copied to this process.

Precision: the release is late by this process's scheduling delay (a Python loop woken by
``select``; tens of microseconds on an idle machine, more on a loaded one), which the
measurements that use it (bench/bench_hosts.py) report beside the stated delay.
"""

from __future__ import annotations

import argparse
import collections
import os
import select
import signal
import sys
import time

#: SCHED_FIFO priority of the delaying process (1..99; below the kernel's threads at 50)
RT_PRIORITY = 10


def serve(queue: int, seconds: float, ready=None) -> None:
    """Hold each packet of netfilter queue ``queue`` for ``seconds``, then accept it; until
    SIGTERM/SIGINT. ``ready``: a callable called once the queue is bound."""
    from netfilterqueue import COPY_META, NetfilterQueue

    held = collections.deque()           # (release time, packet), in arrival order
    now = time.monotonic

    def take(pkt):
        held.append((now() + seconds, pkt))

    nfq = NetfilterQueue()
    nfq.bind(queue, take, max_len=65536, mode=COPY_META)
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    fd = nfq.get_fd()
    if ready is not None:
        ready()
    try:
        while not stop:
            t = now()
            while held and held[0][0] <= t:
                held.popleft()[1].accept()
            wait = max(0.0, held[0][0] - t) if held else 1.0
            try:
                r, _, _ = select.select([fd], [], [], wait)
            except InterruptedError:
                continue
            if r:
                nfq.run(False)
    finally:
        while held:                       # nothing is lost when it stops
            held.popleft()[1].accept()
        nfq.unbind()


def realtime() -> str:
    """Run this process under SCHED_FIFO (root; it sleeps in ``select`` but for the
    verdicts, so it takes little CPU): its releases then come on time also on a loaded
    machine (a 64-byte TCP round trip under a 1 ms delay each way, load 37 on 2 cores:
    median 2.31 ms as SCHED_OTHER). Returns the policy it got."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(RT_PRIORITY))
        return f"SCHED_FIFO {RT_PRIORITY}"
    except (OSError, AttributeError) as e:
        return f"SCHED_OTHER ({e})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queue", type=int, default=0, help="netfilter queue number (0..65535)")
    ap.add_argument("--ms", type=float, required=True, help="delay per packet, milliseconds (> 0)")
    args = ap.parse_args(argv)
    if not args.ms > 0:
        ap.error(f"--ms must be > 0, not {args.ms:g}")
    try:
        import netfilterqueue  # noqa: F401
    except ImportError:
        print("delay.py: needs the NetfilterQueue package (pip install NetfilterQueue; apt: "
              "libnetfilter-queue-dev)", file=sys.stderr)
        return 2
    prio = realtime()
    serve(args.queue, args.ms / 1000.0,
          ready=lambda: print(f"bound (scheduling: {prio})", flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
