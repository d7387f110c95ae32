"""Capacity: the largest load a serving system sustains, and the fleet a load needs.

:func:`max_stable_load` fixes a scenario's policies and hardware and searches the
offered load (by default ``workload.aggregate_rate``, requests/s) for two limits:

* the **max stable load**: the largest load whose queue does not grow (the
  backlog over the measurement window grows by less than a set share of the
  arrivals) and that drops no more than a set share of requests;
* the **max SLO-goodput load**: the largest load that is stable *and* meets every
  SLO criterion given (a percentile or mean of a latency metric, optionally of one
  SLO class) and the goodput attainment asked for.

:func:`min_replicas` answers the converse question: the fewest replicas that meet
the same criteria at a given load.

How a load is judged (a *probe*)
--------------------------------
A probe runs the scenario at that load for ``warmup_requests + measure_requests``
requests (or ``warmup_s + measure_s`` seconds of arrivals). The first part is
warm-up: nothing in it is judged. The **measurement window** runs from the first
measured arrival to the last arrival (or from ``warmup_s`` to the end of the
horizon); after it the run drains its backlog so every measured request
finishes. In the window:

* *backlog growth* = (requests in the system at the window's end - at its start)
  / arrivals in the window, a request leaving the system when it completes or is
  dropped (a dropped request without a completion time leaves at its arrival);
* *drop fraction* = dropped / measured requests;
* each SLO criterion's statistic is taken over the measured requests that completed
  (of its SLO class, when it names one);
* *goodput fraction* = the share of measured completed requests meeting the
  scenario's own per-class SLO targets (``slo:`` in the scenario: TTFT and E2E as
  the client sees them, TPOT, and TVT with speculative decoding).

Three figures tell how much room a probe left; the first is not headroom:

* *busy fraction*: the share of the run (warm-up and drain included) the replicas'
  engines spent running steps, averaged over the replicas. A continuous-batching
  engine steps whenever it holds one request, so at any load that keeps one request
  in service it reads close to 1, at a third of capacity as at capacity: it says
  the engine never idles, not that it is full;
* *batch occupancy*: the time-weighted mean number of requests in service (from
  their first schedule to their completion) over the measurement window, divided by
  the fleet's batch slots (``max_num_seqs`` summed over the replicas). By Little's
  law it is load x time in service / slots; it reaches 1 only when every slot is
  taken all the time. It is NaN for fleets whose slots are not ``max_num_seqs`` of
  co-located replicas (request-level batch servers, disaggregated pools, speculative
  decoding's verify servers, a planner changing the fleet);
* *KV occupancy*: the KV cache's time-weighted use (used blocks over blocks, the
  summary's ``kv_utilization``), over the run, averaged over the replicas. Slots are
  not always what runs out first: long prompts fill the KV cache with slots to
  spare, and then preemptions, not a full batch, end the stable range. The tighter
  of the two occupancies is the headroom.

**Early pruning.** While a probe runs, the requests in the system are checked
every 1/200 of its expected duration; as soon as they exceed
:attr:`StabilityCriteria.prune_backlog` the probe stops and the load is judged
unstable (a stable queue essentially never holds that many). And no load is
probed twice: a load at or above one known unstable is unstable, a load at or
below one known to meet every criterion meets them (both limits are taken to be
monotone in the load).

The search
----------
From ``low`` (default: the scenario's own load) the search doubles the load
until a probe fails (or halves it until one succeeds), unless ``high`` closes
the bracket; then it bisects between the largest passing and the smallest failing
load until ``upper / lower - 1 <= tolerance``. It does so for the SLO criteria
first, then for stability alone, reusing every probe. With several seeds a load
passes only if it passes under every seed (a failing seed ends the load's
probes). The reported limit is the bracket's lower end: the largest load seen to
pass.

Modules
-------
The names above are defined in the submodules and imported here, each layer importing
only those before it: :mod:`~simpy_llm.explore.capacity.criteria` (the SLO and stability
criteria), :mod:`~simpy_llm.explore.capacity.probing` (one probe: its window, its run and
its verdict, and the prober that reuses them), :mod:`~simpy_llm.explore.capacity.cards`
(the capacity and replica cards) and :mod:`~simpy_llm.explore.capacity.searches`
(:func:`max_stable_load`, :func:`min_replicas`). A name is looked up in the module that
defines it: patch it there (``simpy_llm.explore.capacity.searches._run_probe``).

Examples
--------
A single FIFO server with constant 40 ms service (M/D/1, mu = 25 requests/s):

>>> scenario = {
...     "seed": 1,
...     "workload": {"aggregate_rate": 10.0, "num_requests": 100, "clients": [{
...         "id": "only", "rate_fraction": 1.0, "arrival": {"process": "poisson"},
...         "input_distribution": {"type": "constant", "params": {"value": 3500}},
...         "output_distribution": {"type": "constant", "params": {"value": 1}}}]},
...     "serving": {"replicas": 1,
...         "engine": {"max_num_seqs": 1, "max_num_batched_tokens": 8192, "chunked_prefill": False},
...         "latency_model": {"kind": "blis_linear", "params": {
...             "beta0_us": 5000.0, "beta1_us": 10.0, "beta2_us": 1.0}}}}
>>> card = max_stable_load(scenario, tolerance=0.05, warmup_requests=200, measure_requests=3000,
...                        criteria=StabilityCriteria(slo={"queue_delay_mean": 0.08}))
>>> 22 < card.max_stable_load <= 26, 18 < card.max_goodput_load < 22  # mu = 25; PK gives 20 for Wq = 0.08 s
(True, True)
>>> card.upper_stable_load / card.max_stable_load - 1 <= 0.05
True
"""

from __future__ import annotations

from simpy_llm.explore.capacity.cards import (
    CapacityCard,
    ReplicaCard,
)
from simpy_llm.explore.capacity.cards import _fmt as _fmt
from simpy_llm.explore.capacity.cards import _probe_frame as _probe_frame
from simpy_llm.explore.capacity.cards import _save as _save
from simpy_llm.explore.capacity.cards import _table as _table
from simpy_llm.explore.capacity.criteria import _SLO_RE as _SLO_RE
from simpy_llm.explore.capacity.criteria import SLO_METRICS as SLO_METRICS
from simpy_llm.explore.capacity.criteria import (
    SloCriterion,
    StabilityCriteria,
    check_slo_classes,
)
from simpy_llm.explore.capacity.criteria import _check_before_probes as _check_before_probes
from simpy_llm.explore.capacity.criteria import _fraction_or_none as _fraction_or_none
from simpy_llm.explore.capacity.criteria import _slo_criteria as _slo_criteria
from simpy_llm.explore.capacity.probing import DEFAULT_MEASURE_REQUESTS as DEFAULT_MEASURE_REQUESTS
from simpy_llm.explore.capacity.probing import DEFAULT_WARMUP_REQUESTS as DEFAULT_WARMUP_REQUESTS
from simpy_llm.explore.capacity.probing import LATENCY_COLUMNS as LATENCY_COLUMNS
from simpy_llm.explore.capacity.probing import (
    Probe,
)
from simpy_llm.explore.capacity.probing import _batch_occupancy as _batch_occupancy
from simpy_llm.explore.capacity.probing import _batch_slots as _batch_slots
from simpy_llm.explore.capacity.probing import _build as _build
from simpy_llm.explore.capacity.probing import _jsonable as _jsonable
from simpy_llm.explore.capacity.probing import _judge as _judge
from simpy_llm.explore.capacity.probing import _Prober as _Prober
from simpy_llm.explore.capacity.probing import _Pruned as _Pruned
from simpy_llm.explore.capacity.probing import _run_probe as _run_probe
from simpy_llm.explore.capacity.probing import _slo_met as _slo_met
from simpy_llm.explore.capacity.probing import _unjson as _unjson
from simpy_llm.explore.capacity.probing import _value_at as _value_at
from simpy_llm.explore.capacity.probing import _Window as _Window
from simpy_llm.explore.capacity.probing import _window as _window
from simpy_llm.explore.capacity.searches import MAX_BRACKET_STEPS as MAX_BRACKET_STEPS
from simpy_llm.explore.capacity.searches import _check_common as _check_common
from simpy_llm.explore.capacity.searches import _doctest_scenario as _doctest_scenario
from simpy_llm.explore.capacity.searches import _name as _name
from simpy_llm.explore.capacity.searches import _positive as _positive
from simpy_llm.explore.capacity.searches import _search_continuous as _search_continuous
from simpy_llm.explore.capacity.searches import (
    max_stable_load,
    min_replicas,
)

__all__ = [
    "CapacityCard",
    "Probe",
    "ReplicaCard",
    "SloCriterion",
    "StabilityCriteria",
    "check_slo_classes",
    "max_stable_load",
    "min_replicas",
]
