"""Speculative decoding (``docs/speculative.md``).

* :mod:`~simpy_llm.speculative.acceptance`: acceptance curves and their lookups;
* :mod:`~simpy_llm.speculative.curve_files`: reading curve files (the project's format and the seed's);
* :mod:`~simpy_llm.speculative.regressor`: a scikit-learn acceptance regressor trained
  from a profiling log, behind the same interface;
* :mod:`~simpy_llm.speculative.draft`: draft devices and their fleet (SimPy processes);
* :mod:`~simpy_llm.speculative.drafter` and :mod:`~simpy_llm.speculative.draft_batching`: a
  draft model's speed, and the draft steps a batching device shares between its requests;
* :mod:`~simpy_llm.speculative.verify`: the targets' verify servers;
* :mod:`~simpy_llm.speculative.curves`: an acceptance curve by name or file, whichever kind;
* :mod:`~simpy_llm.speculative.profiling_log`: the per-token profiling log regressors train on;
* :mod:`~simpy_llm.speculative.evaluation`: held-out MAE, Brier score and calibration error;
* :mod:`~simpy_llm.speculative.train_acceptance`: ``python -m`` training of a regressor bundle.

Fitting the latency-aware γ head on oracle labels from simulator runs is a tool above the
simulation: :mod:`simpy_llm.explore.gamma_head`.
"""
