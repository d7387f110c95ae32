"""Named, reproducible random streams.

Every component that draws random numbers asks :class:`RandomStreams` for a
stream by name. Each stream is an independent :class:`numpy.random.Generator`
spawned from one root seed, so adding a component (or drawing more from one
stream) never shifts the numbers another component sees.
"""

from __future__ import annotations

import zlib

import numpy as np

__all__ = ["RandomStreams"]


class RandomStreams:
    """Independent numpy Generators keyed by name, all derived from one seed.

    Parameters
    ----------
    seed
        Root seed (a non-negative integer).

    Examples
    --------
    >>> streams = RandomStreams(42)
    >>> a = streams.stream("workload/chat").random()
    >>> b = RandomStreams(42).stream("workload/chat").random()
    >>> a == b
    True
    >>> streams.stream("workload/chat") is streams.stream("workload/chat")
    True
    """

    def __init__(self, seed: int) -> None:
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.seed = int(seed)
        self._streams: dict[str, np.random.Generator] = {}

    def stream(self, name: str) -> np.random.Generator:
        """Return the Generator for *name*, creating it on first use.

        The stream depends only on the root seed and *name* (through a CRC32
        spawn key), never on the order in which streams are requested.
        """
        gen = self._streams.get(name)
        if gen is None:
            seq = np.random.SeedSequence(self.seed, spawn_key=(zlib.crc32(name.encode()),))
            gen = np.random.Generator(np.random.PCG64(seq))
            self._streams[name] = gen
        return gen
