"""The simulated world: its entities and facts, the experts' accuracy model, the simulated pool backend,
the answer key, the embedded default's sizes and names. `router_r1` never imports this package."""
