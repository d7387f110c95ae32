"""Output-length predictors for policies (the class lives with the config that names it).

:class:`OutputPredictor` is a frozen value a scenario gives (``predictor: {kind: noisy,
noise_sigma: 0.5}``) with a pure prediction function, so it is defined in
:mod:`simpy_llm.config.predictor`, below the policies that use it; this module is where
policies import it from.
"""

from simpy_llm.config.predictor import OutputPredictor, mix64, unit_uniform

__all__ = ["OutputPredictor", "mix64", "unit_uniform"]
