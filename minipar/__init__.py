"""minipar: large-model training parallelism, built from scratch to be read.

NumPy does the math, real MPI (mpi4py over the ``mpich`` wheel) does the
communication, and every parallel strategy is checked against the serial
model.  Start with ``minipar --help`` or ``notebooks/00_overview.ipynb``.

This package's ``__init__`` imports nothing heavy on purpose: the glossary
verbs of the ``minipar`` command must start without NumPy or mpi4py.
"""

__version__ = "0.1.0"
