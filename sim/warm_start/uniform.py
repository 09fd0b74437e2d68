"""Uniform routes: each hop goes to a model drawn uniformly among the listed ones.

A warm start that teaches the format and the habit of asking hop by hop (every row routes, the oracle's thinks and
turns) but nothing of who knows what: which model to ask must then come from the reward (issues 43 and 44). The
replies are the world's real ones, so a row is right only where the drawn model knew.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from data_process.schema import DataBuildError
from router_r1.reward.format import check_format
from sim.warm_start.build import Context, Routed, Routes
from sim.warm_start.oracle import Trajectory, ask, finish
from sim.world import SimQuestion

ROUTE_SOURCES = ("oracle", "uniform")
UNIFORM = "uniform"  # the rows' mode


@dataclass
class Annotator:
    """Who picks each hop's model: the oracle, or a uniform draw among the listed models."""

    routes: str = field(default="oracle", metadata={"choices": ROUTE_SOURCES})  # oracle: each hop to its domain's cheapest reliable model (oracle.py); uniform: to a model drawn uniformly among the listed ones, and after a reply without an answer once to another drawn so (always routes, the oracle's format, no knowledge of who knows what)
    think_names_model: bool = True  # uniform routes only: each <think> ends "Ask <model>." before the route names it again, as the oracle's does; off: the think states the hop's domain only ("A science fact."), so the route is the one place a model is chosen (a uniform draw is two draws to a small policy, which does not learn to copy one into the other)

    def __post_init__(self):
        if self.routes not in ROUTE_SOURCES:
            raise ValueError(f"--routes must be one of {', '.join(ROUTE_SOURCES)}, got {self.routes!r}")

    @property
    def on(self) -> bool:
        return self.routes == UNIFORM

    def check(self, recipe) -> None:
        if not self.on:
            if not self.think_names_model:
                raise ValueError("--no-think-names-model shapes the uniform annotator's thinks: add --routes uniform")
            return
        if recipe.per_alpha.on or recipe.turn_budgets.on:
            raise ValueError("--routes uniform, --alphas and --budgets are route sources: a recipe takes one")
        if recipe.build.noise:
            raise ValueError(f"--routes uniform draws every route at random already: set --noise 0 (got "
                             f"{recipe.build.noise}; its slips include guesses, which never route)")

    def routes_of(self, ctx: Context) -> "UniformRoutes":
        return UniformRoutes(ctx, self.think_names_model)


class UniformRoutes(Routes):
    """Each hop to a uniformly drawn listed model; a reply without an answer, once to another drawn so."""

    def __init__(self, ctx: Context, names_model: bool = True):
        self.ctx, self.names_model = ctx, names_model
        self.models = list(ctx.registry.models.values())
        for spec in self.models:
            if spec.api_id not in ctx.backend.experts:
                raise DataBuildError(f"{ctx.registry.source}: model {spec.name!r} (api_id {spec.api_id!r}) "
                                     "has no simulated expert")

    def route(self, q: SimQuestion, mode: str, rng: random.Random, state) -> Routed:
        ctx, traj, got = self.ctx, Trajectory(), None
        for i, hop in enumerate(q.hops):
            spec = rng.choice(self.models)
            query, think = hop.sub_question, f"A {hop.domain} fact." + (f" Ask {spec.name}." if self.names_model else "")
            if i > 0:  # follow the first reply, right or wrong, as the oracle does
                query, think = hop.sub_question.replace(hop.subject, got), f"Got {got}. {think}"
            got = ask(ctx.backend, traj, think, spec, query)
            others = [s for s in self.models if s.api_id != spec.api_id]  # the same expert would answer the same
            if got is None and others and len(traj.routes) < ctx.cfg.max_routes:
                other = rng.choice(others)
                got = ask(ctx.backend, traj, "No answer." + (f" Ask {other.name}." if self.names_model else ""),
                          other, query)
            if got is None:  # no entity to continue with
                break
        finish(traj, got)
        ok, why = check_format(traj.text, ctx.registry)
        if not ok:  # a bug here, never in the data
            raise DataBuildError(f"uniform-route trajectory for {q.uid} breaks the format ({why}): {traj.text!r}")
        return Routed(traj, ctx.registry, {"mode": UNIFORM, "misnamed": "", "listing": "", "route_profiles": []})
