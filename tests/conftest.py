"""Every test process uses a private cache directory (``HPCPS_CACHE_DIR``): tests never write
into the user's ``~/.cache/hpcps``. ``tests/run.py`` sets one directory for its whole run
(shared by all its launches, so featurized data is made once per run); a plain ``pytest`` gets
a temporary one per process here, removed at exit. The ``hpcps``/``mpirun`` subprocesses of the
tests inherit it."""

import atexit
import os
import shutil
import tempfile

if "HPCPS_CACHE_DIR" not in os.environ:
    os.environ["HPCPS_CACHE_DIR"] = tempfile.mkdtemp(prefix="hpcps-test-cache-")
    atexit.register(shutil.rmtree, os.environ["HPCPS_CACHE_DIR"], ignore_errors=True)
