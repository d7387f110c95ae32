"""The cyclic garbage collector during a load-generation run: young collections only.

A sending process keeps a record of every request it has sent until the run ends, and a few
objects of each (the record and its lists of chunk times) survive the young collections into
the oldest generation. CPython runs a full collection whenever the objects that reached the
oldest generation since the last one number a quarter of those it held then, and a full
collection walks every object of that generation while the event loop waits: the longer a run,
the longer each walk. Measured on a 2-core machine in a 25 s run at 2,000 requests/s (50,000
records, as a worker holds in a 10 s run at 10,000/s over two workers), the full collections
grew from 24 to 208 ms of CPU each, 13 of them; the sends due meanwhile waited, and those
pauses were the run's p99 schedule delay.

:func:`young_collections_only` holds them off while a run sends: what exists when the run
starts is frozen (:func:`gc.freeze`: it is never walked), and no full collection runs until
the run ends, while the young collections, which find the cycles the run makes and drops, go on
as before. Garbage that survives two young collections inside a cycle is freed when the run
ends, by the first full collection after it (objects freed by their reference count, most
of them, are freed at once as always).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["NO_FULL_COLLECTIONS", "young_collections_only"]

NO_FULL_COLLECTIONS = 2**30
"""The oldest generation's threshold while a run sends: the number of young (generation 1)
collections after which a full one may run, more than any run makes (one per ~7,000 objects
that survive a collection)."""


@contextmanager
def young_collections_only() -> Iterator[bool]:
    """Freeze the objects that exist now and run no full collection until the block ends;
    yields whether it did.

    It does nothing (and yields ``False``) when the collector is disabled or the program froze
    objects itself: the program then manages the collector. At the end the objects are
    unfrozen, and the oldest generation's threshold is set back unless the block changed it.

    Examples
    --------
    >>> before = gc.get_threshold()
    >>> with young_collections_only() as held:
    ...     during = gc.get_threshold()[2]
    >>> held == (during == NO_FULL_COLLECTIONS), gc.get_threshold() == before
    (True, True)
    """
    if not gc.isenabled() or gc.get_freeze_count() != 0:
        yield False
        return
    young, middle, oldest = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(young, middle, NO_FULL_COLLECTIONS)
    try:
        yield True
    finally:
        now = gc.get_threshold()
        if now[2] == NO_FULL_COLLECTIONS:
            gc.set_threshold(now[0], now[1], oldest)
        gc.unfreeze()
