"""Make an added worker (``python -m hpcps join``) wait before ``MPI_Init`` until a flag file
appears: with this directory first on ``PYTHONPATH`` and ``HPCPS_TEST_JOIN_PAUSE=FLAG`` in the
environment, each such process creates ``FLAG.<pid>`` and waits until ``FLAG`` exists. The job's
ranks are then inside ``MPI_Comm_spawn`` (Open MPI 5 returns from it once the new processes
have called ``MPI_Init``), so a test can kill a rank while a growth is in progress
(tests/e2e/test_elastic.py). Every other Python process of the launch is left alone.
"""

import os
import time
from pathlib import Path

_FLAG = os.environ.get("HPCPS_TEST_JOIN_PAUSE")
if _FLAG:
    try:
        _cmd = Path("/proc/self/cmdline").read_bytes().split(b"\0")
    except OSError:
        _cmd = []
    if b"hpcps" in _cmd and b"join" in _cmd:
        Path(f"{_FLAG}.{os.getpid()}").touch()
        while not os.path.exists(_FLAG):
            time.sleep(0.02)
