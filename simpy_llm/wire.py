"""Wire: the unbounded FIFO Store the components are connected with (re-exported).

:class:`~simpy_llm.kernel.Wire` and its events live in :mod:`simpy_llm.kernel`, the one
module that touches SimPy's internals (a put's event is born processed, a waiting getter
is served at once; see :class:`~simpy_llm.kernel.Channel`). This module re-exports them,
so ``from simpy_llm.wire import Wire`` keeps working.

Examples
--------
>>> import simpy
>>> env = simpy.Environment()
>>> wire = Wire(env)
>>> put = wire.put("a")
>>> put.processed, wire.get().value, wire.statistics()
(True, 'a', WireStats(puts=1, gets=1, level=0))
"""

from simpy_llm.kernel import Wire, WireGet, WirePut, WireStats

__all__ = ["Wire", "WireGet", "WirePut", "WireStats"]
