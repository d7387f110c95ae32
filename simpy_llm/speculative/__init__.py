"""Speculative decoding: acceptance models (:mod:`simpy_llm.speculative.acceptance`).

``docs/speculative.md`` states the model and the provenance of its data.
"""
