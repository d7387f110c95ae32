"""The cyclic garbage collector during a load-generation run: young collections on a clock.

A sending process keeps a record of every request it has sent until the run ends, and a few
objects of each (the record and its lists of chunk times) survive the young collections. Two
things made the collector stop the event loop for tens of milliseconds while a run sent, and
the sends due meanwhile waited (they were the schedule delay's p99 and max):

- a full collection walks every object of the oldest generation, and CPython runs one whenever
  the objects that reached it since the last one number a quarter of those it held then. Measured
  on a 2-core machine in a 25 s run at 2,000 requests/s, they grew from 24 to 208 ms each, 13 of them;
- a young collection is due when the objects the collector tracks that were made since the last
  one outnumber those freed by more than the threshold (700). A sending process frees objects as
  fast as it makes records: each request's body built before the run (its spec, frozen with
  everything made before the run) is dropped when it is sent. So for seconds no young collection
  was due while the records piled up in the youngest generation, and then one walked all of them
  (50,000-70,000 objects: 15-40 ms of CPU in a worker at 5,000 requests/s), and the next walked
  them again. Two workers sending halves of one schedule did it at the same instant.

:func:`young_collections_only` holds both off while a run sends. What exists when the run starts
is frozen (:func:`gc.freeze`: it is never walked), the collector does not start collections by
its own count, and on the running event loop a clock runs a young collection every
:data:`YOUNG_EVERY_S` (it finds the cycles the run makes and drops) and then freezes what survived
it (moved aside at no cost, never walked again). A collection so walks what the last 50 ms made
(at 10,000 requests/s, a few thousand objects: well under a millisecond), whatever the run freed
meanwhile. Without a running loop (a program's own synchronous code) the block only holds off
full collections. A cycle that became garbage after its first young collection (a request in
flight at the time) is freed when the run ends, by the first full collection after it, as one
that survived two young collections was before; objects freed by their reference count, most of
them, are freed at once as always.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["NO_FULL_COLLECTIONS", "YOUNG_EVERY_S", "young_collections_only"]

NO_FULL_COLLECTIONS = 2**30
"""The oldest generation's threshold while a run sends: the number of young (generation 1)
collections after which a full one may run, more than any run makes (it holds full collections
off should the program switch the collector back on inside the block)."""

YOUNG_EVERY_S = 0.05
"""Seconds between the young collections a run makes on its event loop."""


class _Clock:
    """Young collections on *loop* every *every_s* seconds, each followed by a freeze."""

    def __init__(self, loop: asyncio.AbstractEventLoop, every_s: float) -> None:
        self.loop = loop
        self.every_s = every_s
        self.collections = 0
        self._timer: asyncio.TimerHandle | None = loop.call_later(every_s, self._tick)

    def _tick(self) -> None:
        gc.collect(0)
        gc.freeze()  # what survived one young collection is kept by the run: never walked again
        self.collections += 1
        self._timer = self.loop.call_later(self.every_s, self._tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


@contextmanager
def young_collections_only(every_s: float = YOUNG_EVERY_S) -> Iterator[bool]:
    """Freeze the objects that exist now and, until the block ends, run no full collection and,
    on the running event loop, young collections every *every_s* seconds only (see the module
    docstring); yields whether it did.

    It does nothing (and yields ``False``) when the collector is disabled or the program froze
    objects itself: the program then manages the collector. At the end the objects are
    unfrozen, the collector is switched on again if the block switched it off, and the oldest
    generation's threshold is set back unless the block changed it.

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
    if every_s <= 0:
        raise ValueError(f"every_s must be > 0, got {every_s}")
    try:
        loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:  # no event loop: full collections held off, young ones as the collector counts
        loop = None
    young, middle, oldest = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(young, middle, NO_FULL_COLLECTIONS)
    clock = None
    if loop is not None:
        gc.disable()
        clock = _Clock(loop, every_s)
    try:
        yield True
    finally:
        if clock is not None:
            clock.stop()
            gc.enable()
        now = gc.get_threshold()
        if now[2] == NO_FULL_COLLECTIONS:
            gc.set_threshold(now[0], now[1], oldest)
        gc.unfreeze()
