"""Calibration: observed latencies against the simulator's predictions.

Beside the simulation core (pandas and scipy; nothing in the core imports it):

* :func:`compare` replays an observed trace (``simpy-llm observe``) through a scenario
  and compares TTFT, ITL, TPOT and E2E request by request (:mod:`~simpy_llm.calibrate.stats`),
  with a quality rating and the known limitations (:mod:`~simpy_llm.calibrate.report`);
* :func:`fit` estimates a ``batch_table`` latency model from a trace
  (:mod:`~simpy_llm.calibrate.fit`), says which coefficients the trace determines and takes
  the others from priors (:mod:`~simpy_llm.calibrate.identify`), records the ranges it was
  fitted on (:mod:`~simpy_llm.calibrate.ranges`), and :func:`write_profile` saves it for any
  scenario;
* :mod:`~simpy_llm.calibrate.probe` measures a server with a short designed set of requests
  and writes a profile with intervals (:mod:`~simpy_llm.calibrate.probe_estimate`): the
  priors of a fit;
* :mod:`~simpy_llm.calibrate.caveats` and :mod:`~simpy_llm.calibrate.timeseries` add the
  report's warnings about the observed run and its time series against the scraped metrics;
* :func:`scenario_from_trace` builds the serving system a trace header describes;
* :func:`simulated_observation` writes a simulated run as an observed trace (ground truth).

``docs/calibration.md`` walks through observing a real server, fitting and predicting.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING

from simpy_llm.lazy import lazy_exports

if TYPE_CHECKING:
    from simpy_llm.calibrate.compare import Calibration, compare
    from simpy_llm.calibrate.fit import FitResult, fit, write_profile
    from simpy_llm.calibrate.report import CalibrationReport, report_table, write_report
    from simpy_llm.calibrate.scenario import apply_profile, scenario_from_trace
    from simpy_llm.calibrate.stats import MetricComparison, compare_metric, rate
    from simpy_llm.calibrate.synthetic import simulated_observation

_HOME = {
    "Calibration": "compare", "compare": "compare", "FitResult": "fit", "fit": "fit", "write_profile": "fit",
    "CalibrationReport": "report", "report_table": "report", "write_report": "report",
    "apply_profile": "scenario", "scenario_from_trace": "scenario",
    "MetricComparison": "stats", "compare_metric": "stats", "rate": "stats",
    "simulated_observation": "synthetic",
}
"""Each public name's module. They are imported on first use (PEP 562): the command line
builds the ``calibrate`` verbs' parsers (:mod:`simpy_llm.calibrate.cli`) for every command, and
a ``simpy-llm run`` should not pay for SciPy and pandas."""


__getattr__, __dir__ = lazy_exports(globals(), _HOME)


class _Package(types.ModuleType):
    """This package, whose ``compare`` and ``fit`` stay the functions when their modules load.

    The import system binds a newly loaded submodule to its name in the package; the
    package's ``compare`` and ``fit`` are the functions of the same names (as they were
    when the package imported them eagerly), whichever module loaded first.
    """

    def __setattr__(self, name: str, value: object) -> None:
        if name in ("compare", "fit") and isinstance(value, types.ModuleType):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

__all__ = [
    "Calibration",
    "CalibrationReport",
    "FitResult",
    "MetricComparison",
    "apply_profile",
    "compare",
    "compare_metric",
    "fit",
    "rate",
    "report_table",
    "scenario_from_trace",
    "simulated_observation",
    "write_profile",
    "write_report",
]
