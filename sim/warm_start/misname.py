"""The misname drill: a row first routes under a misspelt name, reads the environment's hint, routes again.

"SiliGLM-6B" for SciGLM-6B is the slip the 270M router makes on a new name; the drill's rows show the hint the
environment gives with env.invalid_hint and the route again under the listed name. The slip stays as context
but is not learnt (its segment's loss is false).
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Callable

from router_r1.actions import Action, invalid_observation, render_route
from router_r1.pool.registry import ModelRegistry
from sim.warm_start.oracle import Trajectory


@dataclass
class MisnameDrill:
    """A share of oracle-mode rows misspell their first route's name, then recover."""

    misname_drill: float = 0.0  # share of oracle-mode rows whose first route misspells its pick's name, then reads the invalid-action hint and routes again under the listed name; the slip is not learnt (needs --think-candidates; evaluate with --invalid-hint)

    def __post_init__(self):
        if not 0.0 <= self.misname_drill <= 1.0:
            raise ValueError(self._error())

    def _error(self) -> str:
        return (f"--misname-drill must be in [0, 1], and > 0 only with --think-candidates (the think names the pick "
                f"the slip misspells), got {self.misname_drill}")

    def check(self, recipe) -> None:
        if self.misname_drill > 0 and not recipe.thinking.think_candidates:
            raise ValueError(self._error())

    def start(self, seed: int, max_routes: int) -> Callable[[Trajectory, str, ModelRegistry], str | None]:
        """The drill over one build's rows: (trajectory, mode, registry) -> the misspelt name, or None."""
        rng = random.Random(f"misname-drill-{seed}")

        def drill(traj: Trajectory, mode: str, registry: ModelRegistry) -> str | None:
            if self.misname_drill > 0 and rng.random() < self.misname_drill and mode == "oracle" \
                    and len(traj.routes) < max_routes:  # the slip takes a turn: room for it under max_routes
                return misname_first_route(traj, registry, rng)
            return None
        return drill


def misspell(name: str, registry: ModelRegistry, rng: random.Random) -> str:
    """`name` with one letter of its first word changed, dropped, doubled or swapped with the next, so that it
    resolves to no model of `registry` (its names compare without case, spaces and hyphens)."""
    stem = re.match(r"[A-Za-z]+", name)
    letters = stem.end() if stem else 0
    if letters < 2:
        raise ValueError(f"misspell: {name!r} does not start with two letters")
    for _ in range(100):
        i, edit = rng.randrange(letters), rng.choice(("change", "drop", "double", "swap"))
        c = name[i]
        if edit == "change":
            other = rng.choice([x for x in "aeioulnrstmk" if x != c.lower()])
            wrong = name[:i] + (other.upper() if c.isupper() else other) + name[i + 1:]
        elif edit == "drop":
            wrong = name[:i] + name[i + 1:]
        elif edit == "double":
            wrong = name[:i + 1] + name[i:]
        else:
            a = min(i, letters - 2)  # the letter and the next; the last letter swaps with the one before
            b = a + 1
            wrong = name[:a] + name[b] + name[a] + name[b + 1:]
        if registry.resolve(wrong) is None:
            return wrong
    raise ValueError(f"misspell: every edit of {name!r} names a model of {registry.source}")


def misname_first_route(traj: Trajectory, registry: ModelRegistry, rng: random.Random) -> str | None:
    """The first route turn becomes a misspelt route (kept as context, loss false), the environment's
    invalid-action hint, and the route again under the listed name. Returns the misspelt name, or None if the
    trajectory does not open with a route."""
    first = traj.segments[0]["text"] if traj.segments else ""
    if not traj.routes or "</think><search>" not in first:
        return None
    name, query = traj.routes[0]
    wrong = misspell(name, registry, rng)
    think = first[: first.index("</think>") + len("</think>")]
    hint = invalid_observation(Action("invalid", model=wrong, query=query, reason="unknown_model"), hint=True,
                               names=registry.names)
    traj.segments[:1] = [
        {"text": think + render_route(wrong, query), "by_policy": True, "loss": False},
        {"text": hint, "by_policy": False},
        {"text": f"<think>{wrong} is not listed. Ask {name}.</think>{render_route(name, query)}", "by_policy": True},
    ]
    return wrong
