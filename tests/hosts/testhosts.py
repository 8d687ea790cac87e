#!/usr/bin/env python3
"""Test hosts on one machine: N "nodes" made of Linux namespaces, for multi-host tests.

Each host ``hpcps-hK`` (K = 1..N) is

* a network namespace ``hpcps-hK`` (``ip netns``) with ``lo`` and ``eth0`` up, ``eth0``
  having the address ``10.213.7.K/24``;
* a persistent UTS namespace (a bind-mounted file under ``/run/hpcps-hosts/uts/``) whose
  hostname is ``hpcps-hK`` (Open MPI's daemons fail to wire up when two hosts share a name);
* the other end of ``eth0``, a veth ``hpcps-vK`` on the machine, enslaved to one bridge
  ``hpcps-br0`` (address ``10.213.7.254/24``, so that daemons in the machine's own namespace,
  e.g. a slurmctld, can reach the hosts).

The subnet ``10.213.7.0/24`` exists only on that bridge and inside these namespaces: every
address a test uses belongs to a test host (or the bridge). Nothing is routed elsewhere.

``python tests/hosts/testhosts.py up N`` makes the hosts (idempotent: what exists is kept,
what is missing made, hosts beyond N removed); ``down`` removes everything (processes in the
namespaces, UTS mounts, namespaces, veths, bridge, state); ``status`` prints it; ``run HOST
CMD...`` runs CMD on HOST; ``delay MS`` delays every packet the hosts receive by MS milliseconds
(:func:`delay`; ``delay 0`` ends it). ``tests/hosts/rsh-agent HOST CMD...`` is Open MPI's
launch agent (``--mca plm_rsh_agent``). Needs root, iproute2 and util-linux (``nsenter``,
``unshare``); the delay also iptables and the NetfilterQueue package.

The names and the subnet are fixed: one set of test hosts per machine, so one user at a time
(``up``/``down``, ``tests/multihost`` and ``bench/bench_hosts.py`` take them over and kill
what runs on them). When done, or after an interrupted run, ``down`` (tests/hosts/README.md).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PREFIX = "hpcps-h"
BRIDGE = "hpcps-br0"
VETH = "hpcps-v"
SUBNET = ipaddress.ip_network("10.213.7.0/24")
BRIDGE_ADDR = "10.213.7.254"
STATE = Path("/run/hpcps-hosts")
UTS = STATE / "uts"
NETNS = Path("/run/netns")
HERE = Path(__file__).resolve().parent
AGENT = HERE / "rsh-agent"
DELAY = HERE / "delay.py"
#: The netfilter queue a host's delaying process reads (queues are per network namespace)
#: and the rule of the host's namespace that hands it every packet arriving on eth0 (on the
#: way in: held on the sender's way out, TCP small queues throttled the flow; bypass:
#: while nothing reads the queue, packets pass undelayed).
DELAY_QUEUE = 0
DELAY_RULE = ["INPUT", "-i", "eth0", "-j", "NFQUEUE", "--queue-num", str(DELAY_QUEUE),
              "--queue-bypass"]


@dataclass(frozen=True)
class Host:
    """One test host: ``name`` (also its hostname and network namespace), ``addr``, ``veth``."""

    index: int

    @property
    def name(self) -> str:
        return f"{PREFIX}{self.index}"

    @property
    def addr(self) -> str:
        return str(SUBNET.network_address + self.index)

    @property
    def veth(self) -> str:
        return f"{VETH}{self.index}"

    @property
    def netns(self) -> Path:
        return NETNS / self.name

    @property
    def uts(self) -> Path:
        return UTS / self.name

    def prefix(self) -> list[str]:
        """Command prefix that runs a program on this host (its network and UTS namespaces)."""
        return [shutil.which("nsenter") or "nsenter", f"--net={self.netns}", f"--uts={self.uts}", "--"]

    def cmd(self, *args) -> list[str]:
        return self.prefix() + [str(a) for a in args]


def _sh(*args, check=True, quiet=False) -> subprocess.CompletedProcess:
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))}: exit {p.returncode}: {p.stderr.strip()}")
    return p


def _link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def _is_mount(path: Path) -> bool:
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return False
    return any(line.split()[4] == str(path) for line in text.splitlines())


def existing() -> list[Host]:
    """Test hosts that exist now (any part of them: namespace, UTS file or veth)."""
    idx = set()
    for d, pre in ((NETNS, PREFIX), (UTS, PREFIX), (Path("/sys/class/net"), VETH)):
        if d.is_dir():
            for p in d.iterdir():
                if p.name.startswith(pre) and p.name[len(pre):].isdigit():
                    idx.add(int(p.name[len(pre):]))
    return [Host(i) for i in sorted(idx)]


def hosts(n: int) -> list[Host]:
    return [Host(i) for i in range(1, n + 1)]


def _ns_inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def pids_on(h: Host) -> list[int]:
    """PIDs of the processes running in ``h``'s network or UTS namespace."""
    inodes = {i for i in (_ns_inode(h.netns), _ns_inode(h.uts)) if i}
    # the files are nsfs bind mounts: their inode is the namespace's
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        for kind in ("net", "uts"):
            try:
                if os.stat(d / "ns" / kind).st_ino in inodes:
                    found.append(int(d.name))
                    break
            except OSError:
                break
    return found


def kill_on(h: Host, sig=signal.SIGKILL) -> list[int]:
    """Send ``sig`` to every process running on ``h``; returns their PIDs."""
    pids = pids_on(h)
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    return pids


def remove_host(h: Host) -> None:
    """Remove ``h`` whole: its processes, UTS mount and file, namespace, veth."""
    if _ns_inode(h.netns) or _ns_inode(h.uts):
        for _ in range(50):
            if not kill_on(h):
                break
            time.sleep(0.1)
    if _is_mount(h.uts):
        _sh("umount", h.uts, check=False)
        if _is_mount(h.uts):
            _sh("umount", "-l", h.uts, check=False)
    try:
        h.uts.unlink()
    except FileNotFoundError:
        pass
    if h.netns.exists():
        _sh("ip", "netns", "delete", h.name, check=False)   # deletes eth0 and with it the veth peer
    if _link_exists(h.veth):
        _sh("ip", "link", "delete", h.veth, check=False)


def down() -> None:
    """Remove every test host, the bridge and the state directory."""
    for h in existing():
        remove_host(h)
    if _link_exists(BRIDGE):
        _sh("ip", "link", "delete", BRIDGE, check=False)
    if UTS.is_dir() and not any(UTS.iterdir()):
        UTS.rmdir()
    for f in [STATE / "hosts", *STATE.glob("delay-*")] if STATE.is_dir() else []:
        if f.exists():
            f.unlink()
    if STATE.is_dir() and not any(STATE.iterdir()):
        STATE.rmdir()


def _ensure_bridge() -> None:
    if not _link_exists(BRIDGE):
        _sh("ip", "link", "add", BRIDGE, "type", "bridge")
    addrs = _sh("ip", "-o", "-4", "addr", "show", "dev", BRIDGE).stdout
    if f" {BRIDGE_ADDR}/" not in addrs:
        _sh("ip", "addr", "add", f"{BRIDGE_ADDR}/{SUBNET.prefixlen}", "dev", BRIDGE)
    _sh("ip", "link", "set", BRIDGE, "up")


def _ensure_host(h: Host) -> None:
    if not h.netns.exists():
        _sh("ip", "netns", "add", h.name)
    UTS.mkdir(parents=True, exist_ok=True)
    if not _is_mount(h.uts):
        h.uts.touch()
        _sh("unshare", f"--uts={h.uts}", "hostname", h.name)
    elif _sh(*h.cmd("hostname")).stdout.strip() != h.name:
        _sh(*h.cmd("hostname", h.name))
    if not _link_exists(h.veth):
        _sh("ip", "link", "add", h.veth, "type", "veth", "peer", "name", "eth0", "netns", h.name)
    _sh("ip", "link", "set", h.veth, "master", BRIDGE)
    _sh("ip", "link", "set", h.veth, "up")
    ns = ["ip", "-n", h.name]
    _sh(*ns, "link", "set", "lo", "up")
    if f" {h.addr}/" not in _sh(*ns, "-o", "-4", "addr", "show", "dev", "eth0").stdout:
        _sh(*ns, "addr", "add", f"{h.addr}/{SUBNET.prefixlen}", "dev", "eth0")
    _sh(*ns, "link", "set", "eth0", "up")


def up(n: int) -> list[Host]:
    """Make test hosts 1..n (keeping those that exist), remove any beyond n; return them."""
    if not 1 <= n <= 250:
        raise ValueError(f"number of hosts must be in 1..250, got {n}")
    for h in existing():
        if h.index > n:
            remove_host(h)
    try:
        _ensure_bridge()
        for h in hosts(n):
            _ensure_host(h)
        STATE.mkdir(parents=True, exist_ok=True)
        (STATE / "hosts").write_text("".join(f"{h.name} {h.addr}\n" for h in hosts(n)))
        wait_reachable(hosts(n))
    except BaseException:
        down()
        raise
    return hosts(n)


def delay_missing() -> str:
    """Why packets cannot be delayed on this machine ('' when they can): :func:`delay` needs
    ``iptables`` and the ``NetfilterQueue`` package."""
    if not shutil.which("iptables"):
        return "no iptables (apt: iptables)"
    try:
        import netfilterqueue  # noqa: F401
    except ImportError:
        return ("no NetfilterQueue package (apt: libnetfilter-queue-dev, then pip install "
                "NetfilterQueue)")
    return ""


def delay(hs, ms: float, timeout: float = 10.0) -> str:
    """Delay every packet each host of ``hs`` receives on ``eth0`` by ``ms`` milliseconds, so
    that a round trip between two of them takes ``2 * ms`` longer: the latency of a link,
    which ``tc netem`` would give where the kernel has it (this machine's has not).

    On each host a :mod:`delay` process (its namespaces) holds the packets that the rule
    ``DELAY_RULE`` of the host's ``iptables`` queues for it. Replaces an earlier delay;
    ``ms`` <= 0 only removes it (:func:`undelay`); :func:`down` removes it with the hosts.
    Returns '' or why it could not (then nothing is delayed)."""
    undelay(hs)
    if ms <= 0:
        return ""
    why = delay_missing()
    if why:
        return why
    for h in hs:
        log = STATE / f"delay-{h.name}.log"
        with open(log, "w") as out:
            p = subprocess.Popen(h.cmd(sys.executable, DELAY, "--ms", f"{ms:g}", "--queue",
                                       DELAY_QUEUE), stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        (STATE / f"delay-{h.name}.pid").write_text(f"{p.pid}\n")
        deadline = time.time() + timeout
        while not log.read_text().startswith("bound") and p.poll() is None \
                and time.time() < deadline:
            time.sleep(0.05)
        text = log.read_text().strip()
        r = _sh(*h.cmd("iptables", "-I", *DELAY_RULE), check=False) \
            if text.startswith("bound") else None
        if r is None or r.returncode:
            undelay(hs)
            return (f"{h.name}: iptables -I {' '.join(DELAY_RULE)}: {r.stderr.strip()}" if r
                    else f"{h.name}: {DELAY.name} did not start: {text[-500:] or 'no output'}")
    return ""


def undelay(hs) -> None:
    """Remove :func:`delay`'s rules and processes from the hosts ``hs`` (the packets they hold
    are let through)."""
    for h in hs:
        if h.netns.exists() and shutil.which("iptables"):
            while _sh(*h.cmd("iptables", "-D", *DELAY_RULE), check=False).returncode == 0:
                pass
        pidfile = STATE / f"delay-{h.name}.pid"
        if pidfile.exists():
            pid = int(pidfile.read_text())
            try:
                os.kill(pid, signal.SIGTERM)
                for _ in range(100):          # until it is gone (reaped, if it is our child)
                    try:
                        os.waitpid(pid, os.WNOHANG)
                    except ChildProcessError:
                        pass
                    os.kill(pid, 0)
                    time.sleep(0.02)
            except ProcessLookupError:
                pass
            pidfile.unlink()
        (STATE / f"delay-{h.name}.log").unlink(missing_ok=True)


#: TCP round trips between two test hosts: the echo side answers ``DOWN`` bytes to every ``UP``
#: bytes; the calling side prints the median seconds of ``N`` round trips.
ECHO = """
import socket, statistics, sys
from time import perf_counter
role, addr, up, down, n = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
def recv(c, k):
    while k > 0:
        b = c.recv(min(k, 1 << 20))
        if not b:
            return False
        k -= len(b)
    return True
if role == "echo":
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, 5599)); s.listen(1); print("listening", flush=True)
    c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while recv(c, up):
        c.sendall(bytes(down))
else:
    c = socket.create_connection((addr, 5599)); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ts = []
    for _ in range(n):
        t = perf_counter(); c.sendall(bytes(up)); recv(c, down); ts.append(perf_counter() - t)
    print(statistics.median(ts))
"""


def tcp_round_trip(a: Host, b: Host, up: int, down: int, n: int = 30) -> float:
    """Median seconds of ``n`` TCP round trips from host ``a`` to host ``b`` (``up`` bytes
    there, ``down`` back; TCP_NODELAY, the kernel's congestion control)."""
    echo = subprocess.Popen(b.cmd(sys.executable, "-c", ECHO, "echo", b.addr, up, down, n),
                            stdout=subprocess.PIPE, text=True)
    try:
        if echo.stdout.readline().strip() != "listening":
            raise RuntimeError(f"tcp_round_trip: the echo on {b.name} did not start")
        p = subprocess.run(a.cmd(sys.executable, "-c", ECHO, "call", b.addr, up, down, n),
                           capture_output=True, text=True, timeout=120)
        if p.returncode:
            raise RuntimeError(f"tcp_round_trip from {a.name}: {p.stderr.strip()[-500:]}")
        return float(p.stdout.strip())
    finally:
        echo.kill()
        echo.wait()


PROBE = """
import socket, sys
for addr in sys.argv[1:]:
    s = socket.socket()
    s.settimeout(1.0)
    try:
        s.connect((addr, 9))            # the discard port: nobody listens, a reset answers
    except ConnectionRefusedError:
        continue                        # reachable
    except OSError as e:
        sys.exit(f"{addr}: {e}")
    finally:
        s.close()
"""


def wait_reachable(hs, timeout=10.0) -> None:
    """Wait until the first host reaches every other over TCP (no ping here: a connection
    refused by the peer's kernel proves the path; the bridge forwards once its ports are up)."""
    deadline = time.time() + timeout
    while True:
        p = _sh(*hs[0].cmd(sys.executable, "-c", PROBE, *[h.addr for h in hs[1:]]), check=False)
        if p.returncode == 0:
            return
        if time.time() > deadline:
            raise RuntimeError(f"{hs[0].name} cannot reach the other test hosts: {p.stderr.strip()}")
        time.sleep(0.2)


def lookup(name_or_addr: str) -> Host:
    """The host with that name, hostname or address (as a hostfile or Open MPI names it)."""
    for h in existing():
        if name_or_addr in (h.name, h.addr):
            return h
    raise KeyError(f"no test host {name_or_addr!r} (hosts: {[h.name for h in existing()]})")


def hostfile(path, hs, slots: int) -> Path:
    """Write an Open MPI hostfile with the hosts' addresses, ``slots`` each."""
    path = Path(path)
    path.write_text("".join(f"{h.addr} slots={slots}\n" for h in hs))
    return path


def mpirun_args(hostfile_path) -> list[str]:
    """mpirun options for a launch across the test hosts (TCP over the bridge's subnet).

    ``mpi_yield_when_idle``: the hosts share this machine's cores, which Open MPI cannot see
    (one slot per host looks like a core per rank), so its waits busy-poll without yielding,
    and the kernel's delivery of a veth packet, deferred behind them, came ~8 ms later: a
    64-byte MPI round trip between two hosts took 7,998 us (median of 300), 29 us with
    yielding (2026-12-04; a TCP socket's own round trip: 44 us). Open MPI yields by itself
    when it knows a node is oversubscribed."""
    return ["--hostfile", str(hostfile_path), "--mca", "plm_rsh_agent", str(AGENT),
            "--mca", "pml", "ob1", "--mca", "btl", "tcp,self,sm",
            "--mca", "btl_tcp_if_include", str(SUBNET), "--mca", "oob_tcp_if_include", str(SUBNET),
            "--mca", "mpi_yield_when_idle", "1"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="The test hosts (hpcps-h*, 10.213.7.0/24) are one per machine: one user at a "
               "time. Clean up when done: testhosts.py down")
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="make N test hosts (idempotent)")
    u.add_argument("n", type=int)
    sub.add_parser("down", help="remove every test host, the bridge and the state")
    sub.add_parser("status", help="list the test hosts")
    dl = sub.add_parser("delay", help="delay every packet the hosts receive by MS milliseconds "
                                      "(0: no delay)")
    dl.add_argument("ms", type=float)
    r = sub.add_parser("run", help="run a command on a host")
    r.add_argument("host")
    r.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("testhosts: needs root (network namespaces, bridge)", file=sys.stderr)
        return 2
    if args.cmd == "up":
        for h in up(args.n):
            print(f"{h.name} {h.addr}")
    elif args.cmd == "down":
        down()
    elif args.cmd == "status":
        for h in existing():
            print(f"{h.name} {h.addr} netns={'yes' if h.netns.exists() else 'no'} "
                  f"uts={'yes' if _is_mount(h.uts) else 'no'} procs={len(pids_on(h))}")
        print(f"bridge {BRIDGE}: {'yes' if _link_exists(BRIDGE) else 'no'}")
    elif args.cmd == "delay":
        why = delay(existing(), args.ms)
        if why:
            print(f"testhosts: delay: {why}", file=sys.stderr)
            return 1
    elif args.cmd == "run":
        h = lookup(args.host)
        os.execvp(h.prefix()[0], h.cmd(*args.command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
