"""The network: links between endpoints (:mod:`simpy_llm.network.link`) and the topologies
that give their latency and bandwidth (:mod:`simpy_llm.network.topology`).

``docs/network.md`` states the model and its sources.
"""
