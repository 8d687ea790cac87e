"""hpcps — an MPI parameter server for distributed machine learning."""

__version__ = "0.1.0"
