"""Build the Cython kernels and the compiled request path; all metadata lives in setup.cfg."""
import os
import shlex
import shutil
import subprocess
import sys

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

DIRECTIVES = {"boundscheck": False, "wraparound": False, "cdivision": True,
              "initializedcheck": False}


def mpi_flags():
    """Compile and link flags of the MPI that mpi4py runs on, from its compiler wrapper
    (``$MPICC``, else ``mpicc`` on PATH): Open MPI's ``-showme:compile``/``-showme:link``,
    else MPICH's ``-compile_info``/``-link_info``. None when there is no wrapper."""
    mpicc = os.environ.get("MPICC") or shutil.which("mpicc")
    if not mpicc:
        return None
    for comp, link in (("-showme:compile", "-showme:link"), ("-compile_info", "-link_info")):
        try:
            c = subprocess.run([mpicc, comp], capture_output=True, text=True, check=True).stdout
            ln = subprocess.run([mpicc, link], capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            continue
        c, ln = shlex.split(c), shlex.split(ln)
        if comp == "-compile_info":          # MPICH prints the whole command: drop the compiler
            c, ln = c[1:], ln[1:]
        return c, ln
    return None


extensions = [
    Extension(
        "hpcps.kernels.*",
        ["hpcps/kernels/*.pyx"],
        include_dirs=[numpy.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=["-O3"],
    )
]

flags = mpi_flags()
try:
    import mpi4py                  # its .pxd files (a build requirement, pyproject.toml)
except ImportError:
    mpi4py = None
if flags is None or mpi4py is None:
    # hpcps.comm.transport then keeps its Python request path (mpi4py calls)
    print("setup.py: " + ("no MPI compiler wrapper (mpicc or $MPICC) found" if flags is None
                          else "mpi4py not importable") + ": hpcps.comm.fastpath not built",
          file=sys.stderr)
else:
    extensions.append(Extension(
        "hpcps.comm.fastpath",
        ["hpcps/comm/fastpath.pyx"],
        include_dirs=[numpy.get_include(), mpi4py.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=["-O3"] + flags[0],
        extra_link_args=flags[1],
    ))

setup(
    ext_modules=cythonize(
        extensions,
        language_level=3,
        compiler_directives=DIRECTIVES,
    )
)
