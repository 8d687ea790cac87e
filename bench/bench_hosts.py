"""bench_pushpull.py across two test hosts over TCP: hpcps push/pull vs raw mpi4py over the
same link, in the same run.

Needs root (it makes two test hosts with tests/hosts/testhosts.py, network and UTS namespaces
joined by a bridge, and removes them afterwards, also on failure)::

    python bench/bench_hosts.py [--quick] [--json PATH]

The worker runs on host 1 and the server on host 2; Open MPI uses its TCP BTL over the
hosts' veth link (``--mca pml ob1 --mca btl tcp,self``). The ratios are bench_pushpull.py's:
raw time / hpcps time for the same messages (goal >= 0.8 for large messages). On one machine
the "link" is a veth pair through a bridge: kernel TCP, no wire, so the figures say what
hpcps adds to a TCP transport, not what a real network gives.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.hosts import testhosts as th  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    ap.add_argument("--json", metavar="PATH", help="bench_pushpull.py's results as JSON")
    ap.add_argument("--reps", type=int, default=None)
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_hosts.py needs root (network namespaces)", file=sys.stderr)
        return 2
    mpirun = Path(sys.executable).parent / "mpirun"
    mpirun = str(mpirun) if mpirun.exists() else "mpirun"
    th.down()
    hs = th.up(2)
    try:
        with tempfile.TemporaryDirectory(prefix="hpcps-bench-hosts-") as d:
            hf = th.hostfile(Path(d) / "hostfile", hs, 1)
            mca = th.mpirun_args(hf)
            mca[mca.index("tcp,self,sm")] = "tcp,self"
            cmd = hs[0].cmd(mpirun, "-n", "2", "--map-by", "node", *mca, sys.executable,
                            str(ROOT / "bench" / "bench_pushpull.py"))
            if args.quick:
                cmd.append("--quick")
            if args.reps:
                cmd += ["--reps", str(args.reps)]
            if args.json:
                cmd += ["--json", str(Path(args.json).resolve())]
            env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                       OMPI_MCA_osc="^ucx", PYTHONPATH=f"{ROOT / 'bench'}:{ROOT}",
                       PRTE_MCA_prte_tmpdir_base=d)
            print(f"bench_hosts: worker on {hs[0].name} ({hs[0].addr}), server on {hs[1].name} "
                  f"({hs[1].addr}), TCP over a veth link", flush=True)
            return subprocess.run(cmd, env=env, cwd=ROOT).returncode
    finally:
        th.down()


if __name__ == "__main__":
    sys.exit(main())
