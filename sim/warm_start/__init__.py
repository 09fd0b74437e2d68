"""Warm-start data: oracle trajectories on the simulated world, the supervised start of the router.

One oracle core (oracle.py: the annotator; build.py: rows, tokenizer, model config, report) and augmentations,
each a dataclass owning its parameters, checks and effect on the rows: names.py (renaming, whole-name tokens),
listings.py (varied listings, rival lines, thinking candidates, the listed fallback and its drill), misname.py
(the misname drill), alpha.py (per-alpha routes), budget.py (turn budgets). A recipe (recipe.py, a yaml under
configs/recipes/) sets them; `python -m sim.warm_start --recipe configs/recipes/default.yaml --out-dir DIR` builds it.
"""
