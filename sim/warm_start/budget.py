"""Turn budgets (AdaTurn): the SFT warm start of a router that reads its turn budget.

Each row draws a budget B from `budgets`; its prompt states B (the template's {budget}) and its trajectory makes at
most B pool calls. The plan depends on B, as the hop oracle's does on the hops: hop by hop to the cheapest reliable
model when B covers the hops (a retry after a reply without an answer only when B leaves room for it); with B = 1
and two hops, the whole question to the model most likely to compose both facts; with B = 0, a guess. With
probability `forced_frac` a row whose unbudgeted plan needs more than B calls shows the forced answer instead: that
plan runs until it asks for call B + 1, that turn is dropped, the environment's budget-exhausted message follows
(environment text) and the policy answers (a guess: what it still lacked was the final fact). The builder's noise
mixes in the hop oracle's slips, capped at B.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from data_process.schema import DataBuildError
from router_r1.pool.registry import ModelRegistry, ModelSpec
from router_r1.prompts import budget_exhausted_message, build_router_prompt, load_template
from router_r1.reward.format import check_format
from sim.backend import SimBackend
from sim.warm_start.build import Context, Routed, Routes
from sim.warm_start.oracle import Oracle, Trajectory
from sim.world import RELATIONS, SimQuestion

CONTROL = budget_exhausted_message()  # the text the rollout appends after a refused route
BUDGET_COLUMNS = ("data_source", "uid", "prompt", "response_text", "segments", "answers", "question", "domain",
                  "budget", "mode", "forced", "routes", "route_models", "cost_usd", "em")


@dataclass
class TurnBudgets:
    """Each row states a turn budget and keeps to it."""

    budgets: list[int] = field(default_factory=list)  # the turn budgets each row's budget B is drawn from; given, each row states B (the template's {budget}) and makes at most B calls (empty: no budget)
    forced_frac: float = 0.3  # share of the rows whose unbudgeted plan exceeds B shown as a forced answer (the budget-exhausted message, then a guess)

    def __post_init__(self):
        if any(b < 0 for b in self.budgets):
            raise ValueError(f"--budgets must be integers >= 0, got {self.budgets}")
        if not 0.0 <= self.forced_frac <= 1.0:
            raise ValueError(f"--forced-frac must be in [0, 1], got {self.forced_frac}")

    @property
    def on(self) -> bool:
        return bool(self.budgets)

    def routes(self, ctx: Context) -> "BudgetRoutes":
        return BudgetRoutes(self, ctx)


class _Spent(Exception):
    """A route was asked for after the budget was spent."""


class BudgetOracle(Oracle):
    """The hop oracle with a plan that fits a turn budget, or runs into it (the forced answer)."""

    def __init__(self, backend: SimBackend, registry: ModelRegistry, max_routes: int = 3):
        super().__init__(backend, registry, max_routes)
        self.multi_hop = {s.name: backend.experts[s.api_id].profile.multi_hop for s in self.models}

    def best_whole(self, q: SimQuestion) -> ModelSpec:
        """The model most likely to answer the whole two-hop question (knows both facts and composes them)."""
        def p(s: ModelSpec) -> float:
            return self.acc[s.name][q.hops[0].domain] * self.acc[s.name][q.hops[1].domain] * self.multi_hop[s.name]
        return max(self.models, key=lambda s: (p(s), -s.price_out_per_m))

    def guess(self, q: SimQuestion, rng: random.Random) -> str:
        return rng.choice(self.world.by_type[RELATIONS[q.hops[-1].relation].obj])

    def _ask(self, traj: Trajectory, limit: int, think: str, spec: ModelSpec, query: str) -> str | None:
        if len(traj.routes) >= limit:
            raise _Spent
        return self.ask(traj, think, spec, query)

    def plan(self, traj: Trajectory, q: SimQuestion, mode: str, room: int, limit: int,
             rng: random.Random) -> str | None:
        """Run the plan for `room` calls; a call past `limit` raises _Spent. Returns the answer found, if any."""
        if mode == "whole" or (len(q.hops) > 1 and room < len(q.hops)):
            spec = rng.choice(self.models) if mode == "whole" else self.best_whole(q)
            think = f"Ask {spec.name} the whole question." if mode == "whole" else \
                f"One call left for two facts. Ask {spec.name} the whole question."
            got = self._ask(traj, limit, think, spec, q.question)
            if got is None and room > 1:
                other = self.best_whole(q) if spec is not self.best_whole(q) else self.best(q.hops[-1].domain, {spec.name})
                got = self._ask(traj, limit, f"No answer. Ask {other.name}.", other, q.question)
            return got
        generalist = rng.choice(self.generalists)
        odd_hop = rng.randrange(len(q.hops))
        got = None
        for i, hop in enumerate(q.hops):
            spec = self.specialist[hop.domain]
            if mode == "generalist":
                spec = generalist
            elif mode == "cheap_other" and i == odd_hop:
                cheap = [s for s in self.models if s not in self.generalists and s is not spec]
                spec = rng.choice(cheap) if cheap else spec
            query, think = hop.sub_question, f"A {hop.domain} fact. Ask {spec.name}."
            if i > 0:
                query = hop.sub_question.replace(hop.subject, got)
                think = f"Got {got}. " + think
            got = self._ask(traj, limit, think, spec, query)
            hops_left = len(q.hops) - i - 1
            if got is None and room - len(traj.routes) > hops_left:  # a retry fits the budget
                other = self.best(hop.domain, {spec.name})
                got = self._ask(traj, limit, f"No answer. Ask {other.name}.", other, query)
            if got is None:
                break
        return got

    def exceeds(self, q: SimQuestion, budget: int, rng: random.Random) -> bool:
        """Would the unbudgeted plan ask for more than `budget` calls? (The sim replies are deterministic.)"""
        try:
            self.plan(Trajectory(), q, "oracle", self.max_routes, budget, rng)
        except _Spent:
            return True
        return False

    def run_budget(self, q: SimQuestion, budget: int, mode: str, forced: bool, rng: random.Random) -> Trajectory:
        """One trajectory for `q` under `budget`; `forced`: plan without the budget and be refused at it."""
        traj = Trajectory()
        if mode == "guess" or (budget == 0 and not forced):
            traj.answer = self.guess(q, rng)
            why = "No calls allowed. I will guess." if budget == 0 else "I will guess."
            traj.say(f"<think>{why}</think><answer>{traj.answer}</answer>")
            return traj
        room = self.max_routes if forced else min(budget, self.max_routes)
        try:
            got = self.plan(traj, q, mode, room, budget, rng)
        except _Spent:  # the refused turn leaves no text; the environment's message follows
            # Whatever the plan still wanted was about the final fact, so nothing in hand answers it: guess.
            traj.segments.append({"text": CONTROL, "by_policy": False})
            traj.answer = self.guess(q, rng)
            traj.say(f"<think>No calls left. I will guess.</think><answer>{traj.answer}</answer>")
            return traj
        return self._finish(traj, got)


def reward_text(segments: list[dict]) -> str:
    """The trajectory as the reward reads it: without the control message (as the rollout's Episode.text)."""
    return "".join(s["text"] for s in segments if s["text"] != CONTROL)


class BudgetRoutes(Routes):
    """Rows one budget each, planned to fit it or (forced) refused at it."""

    columns = BUDGET_COLUMNS
    metrics = {"forced": lambda r: r["forced"]}

    def __init__(self, spec: TurnBudgets, ctx: Context):
        self.spec, self.ctx = spec, ctx
        self.oracle = BudgetOracle(ctx.backend, ctx.registry, ctx.cfg.max_routes)
        template = load_template(ctx.template_path)
        for b in sorted(set(spec.budgets)):  # a template without {budget} fails here, before any row is drawn
            build_router_prompt("probe", ctx.registry, template, b)

    def draw(self, given, rng: random.Random) -> int:
        return rng.choice(self.spec.budgets)

    def prompt_args(self, budget: int) -> dict:
        return {"turn_budget": budget}

    def route(self, q: SimQuestion, mode: str, rng: random.Random, budget: int) -> Routed:
        traj = None
        if mode == "oracle":  # a forced example only where the unbudgeted plan runs into the budget
            probe = random.Random()
            probe.setstate(rng.getstate())
            if self.oracle.exceeds(q, budget, probe) and rng.random() < self.spec.forced_frac:
                traj = self.oracle.run_budget(q, budget, mode, True, rng)
        traj = traj or self.oracle.run_budget(q, budget, mode, False, rng)
        forced = any(s["text"] == CONTROL for s in traj.segments)
        if len(traj.routes) > budget:  # a bug in the oracle, never in the data
            raise DataBuildError(f"budget oracle for {q.uid}: {len(traj.routes)} calls > budget {budget}")
        ok, why = check_format(reward_text(traj.segments), self.ctx.registry)
        if not ok:
            raise DataBuildError(f"budget oracle trajectory for {q.uid} breaks the format ({why}): {traj.text!r}")
        return Routed(traj, self.ctx.registry, {"budget": budget, "mode": "forced" if forced else mode,
                                                "forced": forced})

    def report(self, rows: list[dict], line) -> tuple[list[str], list[str]]:
        budgets = sorted({r["budget"] for r in rows})
        return [line(f"budget {b}", [r for r in rows if r["budget"] == b]) for b in budgets], []
