"""One BLAS thread for the ``simpy-llm`` command, unless its user says otherwise.

Imported by :mod:`simpy_llm.cli` before anything that imports numpy, because OpenBLAS reads
``OPENBLAS_NUM_THREADS`` once, when numpy loads it. A simulation, a fit or a sweep computes no
linear algebra that a thread per core would speed up, while those threads, started at import,
spin before they sleep: about 0.1 s of CPU by a run's first event on two cores, a quarter of the
command's start-up. A value already in the environment is kept; importing the library itself
(``import simpy_llm``, ``Simulation``) sets nothing.

Examples
--------
>>> import os, simpy_llm.cli_threads
>>> "OPENBLAS_NUM_THREADS" in os.environ
True
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
