"""File names inside a run directory (the layout is :mod:`hpcps.runtime.rundir`'s; the names
live here, below every layer that reads or writes one of them). No MPI."""

__all__ = ["CKPT", "MODEL", "METRICS", "RUNNING", "REQUEST", "ANSWER"]

CKPT = "ckpt"
MODEL = "model.h5"
METRICS = "metrics.json"
RUNNING = "running.json"
REQUEST = "grow-request.json"
ANSWER = "grow-answer.json"
