"""The simulated world: its entities and facts, the experts' accuracy model, the simulated pool backend,
the answer key, the stage diagnostics and oracle baselines, the embedded default's sizes and names.
`router_r1` never imports this package: a pool yaml's `world: sim` has it loaded by name
(router_r1/pool/world.py), through the entry points below."""
from sim.plugin import listing_topics, make_backend, make_truth  # noqa: F401
