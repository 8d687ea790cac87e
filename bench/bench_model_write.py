"""The chief's memory while it writes ``model.h5`` of a dynamic table with millions of keys:
streamed from the servers in chunks (now) or pulled whole and built in memory (before).

Run under mpirun, 1 worker (world rank 0, the chief) and the other ranks servers::

    mpirun -n 3 python bench/bench_model_write.py --keys 3000000 --mode stream --dir /tmp/mw
    mpirun -n 3 python bench/bench_model_write.py --keys 3000000 --mode whole --dir /tmp/mw

The worker pushes ``--keys`` distinct random 62-bit ids (float64 AdaGrad rows of ``--dim``)
in pushes of 200,000 keys, one clock each, so the chief's memory before the model is small;
then it writes the model file and prints its peak RSS (``getrusage``) before and after the
write, the write's seconds and the file's size; every server prints its peak RSS at the end.
``--mode whole`` is the code before the streamed writer: ``PSClient.pull_keys_rows`` (every
key and row of every server, concatenated, argsorted) and the HDF5 file built in an
``io.BytesIO``, then written whole (:func:`whole_write`, as in commit 24fbf35). ``ru_maxrss``
only grows, so each mode runs in its own launch.
"""

from __future__ import annotations

import argparse
import io
import resource
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import h5py
import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpcps import __version__  # noqa: E402
from hpcps.comm import core  # noqa: E402
from hpcps.comm.membership import Membership  # noqa: E402
from hpcps.comm.transport import ServerEndpoint  # noqa: E402
from hpcps.core.atomic import write_atomic  # noqa: E402
from hpcps.core.consistency import BSP  # noqa: E402
from hpcps.core.optim import Optimizer  # noqa: E402
from hpcps.core.tables import TableSpec  # noqa: E402
from hpcps.runtime.output import MODEL_CHUNK_BYTES, write_model  # noqa: E402
from hpcps.server.server import ParameterServer  # noqa: E402
from hpcps.worker.client import PSClient  # noqa: E402
from hpcps.worker.export import model_tables  # noqa: E402


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def whole_write(path: Path, tables: dict, cfg, step: int, epoch: int) -> Path:
    """The model file as write_model built it before (commit 24fbf35): in an io.BytesIO,
    then written whole."""
    buf = io.BytesIO()
    with h5py.File(buf, "w") as f:
        f.attrs["hpcps_version"] = __version__
        f.attrs["job_name"] = cfg.name
        f.attrs["step"] = int(step)
        f.attrs["epoch"] = int(epoch)
        f.attrs["config"] = cfg.text
        f.attrs["num_features"] = int(cfg.data.num_features)
        f.attrs["index_base"] = -1
        for name, arr in tables.items():
            if not isinstance(arr, tuple):
                d = f.create_dataset(name, data=arr, chunks=True if arr.size > 1 else None,
                                     compression="gzip" if arr.size > 4096 else None)
                d.attrs["dim"] = arr.shape[1]
                d.attrs["meaning"] = f"rows of table {name!r} in original key order"
                continue
            keys, arr = arr
            k = f.create_dataset(f"{name}_keys", data=keys, chunks=True if keys.size > 1
                                 else None, compression="gzip" if keys.size > 4096 else None)
            k.attrs["meaning"] = f"key of each row of {name!r}, ascending"
            d = f.create_dataset(name, data=arr, chunks=True if arr.size > 1 else None,
                                 compression="gzip" if arr.size > 4096 else None)
            d.attrs["dim"] = arr.shape[1]
            d.attrs["storage"] = "hash"
            d.attrs["meaning"] = (f"rows of dynamic table {name!r}: the keys stored, "
                                  f"row i is key {name}_keys[i]")
    return write_atomic(path, buf.getbuffer())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", type=int, default=3_000_000)
    ap.add_argument("--dim", type=int, default=1)
    ap.add_argument("--fixed", action="store_true",
                    help="a fixed table of --keys rows (pull_table before) instead")
    ap.add_argument("--mode", choices=["stream", "whole"], required=True)
    ap.add_argument("--chunk-mib", type=float, default=MODEL_CHUNK_BYTES / 2**20)
    ap.add_argument("--dir", type=Path, required=True)
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    spec = (TableSpec("weights", a.keys, a.dim, "float64") if a.fixed else
            TableSpec("weights", (1 << 63) - 1, a.dim, "float64", storage="hash"))
    tables = [(spec, Optimizer("adagrad", 0.1))]
    roles = core.split_roles(comm, comm.size - 1)
    cfg = SimpleNamespace(name="bench_model_write", text="", data=SimpleNamespace(
        num_features=0, index_base=None))
    if roles.role == core.SERVER:
        server = ParameterServer.initial(ServerEndpoint(roles.ps, 1 << 30), roles.index,
                                         roles.n_servers, roles.worker_ranks, tables, BSP())
        server.serve()
        print(f"server {roles.index}: {server.shards[0].n_rows:,} rows, peak RSS "
              f"{rss_mib():,.0f} MiB", flush=True)
    else:
        client = PSClient(Membership(roles, specs=[spec]), BSP(), 1 << 30)
        rng = np.random.default_rng(0)
        step = 200_000
        for lo in range(0, a.keys, step):
            n = min(step, a.keys - lo)
            keys = (rng.integers(0, a.keys, n, dtype=np.int64) if a.fixed else
                    rng.integers(0, 1 << 62, n, dtype=np.int64))   # ~all distinct
            client.push("weights", keys, rng.standard_normal((n, a.dim)), n_examples=1)
            client.clock(1)
        a.dir.mkdir(parents=True, exist_ok=True)
        path = a.dir / f"model-{a.mode}.h5"
        before = rss_mib()
        t0 = time.perf_counter()
        if a.mode == "whole":
            whole_write(path, {"weights": client.pull_table("weights") if a.fixed else
                               client.pull_keys_rows("weights")}, cfg, 1, 0)
            held = ""
        else:
            streams = model_tables(client)
            write_model(path, streams, cfg, 1, 0, chunk_bytes=int(a.chunk_mib * 2**20))
            s = streams["weights"]
            held = (f"; held at most {s.held_max / 2**20:,.1f} MiB of received rows and keys "
                    f"(chunk {a.chunk_mib:g} MiB), received {s.received / 2**20:,.1f} MiB")
        secs = time.perf_counter() - t0
        after = rss_mib()
        with h5py.File(path, "r") as f:
            n = f["weights"].shape[0]
        print(f"chief ({a.mode}, {'fixed' if a.fixed else 'dynamic'}): {n:,} keys (dim {a.dim}); peak RSS {before:,.0f} MiB before "
              f"the model, {after:,.0f} MiB after (+{after - before:,.0f} MiB); write "
              f"{secs:.1f} s; file {path.stat().st_size / 2**20:,.1f} MiB{held}", flush=True)
        client.stop()
    roles.free()


if __name__ == "__main__":
    main()
