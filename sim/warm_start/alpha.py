"""Per-alpha routes: the SFT warm start of one router for every cost weight (issue 31).

Each row draws a cost weight alpha from `alphas` (`each_alpha`: each question comes once at every alpha); its prompt
states it as the environment renders a prompt under env.alphas (prompts.alpha_text through build_router_prompt;
`alpha_text` false keeps the plain prompt, for the data of a run trained at one fixed alpha; `think_alpha`
restates it in each decision's <think>, which is what made a pretrained policy read it: docs/results/h200/gemma_alpha,
and the embedded default on 4,000 rows: docs/results/alpha_tradeoff/think_alpha_4k; `think_alpha_at` start puts
it first in the think), and its trajectory follows the plan of highest expected reward under the project's gate
(router_r1/reward/score.py) at that alpha:

    E[r] = P(right) * ((1 - alpha) + alpha * R_cost(cost))

R_cost is the cost normaliser's (router_r1/reward/cost.py: 1 for a free trajectory, else
1 - clip((sqrt(cost) - p_low) / (p_high - p_low), 0, 1)) read against one fixed window: the 5th/95th percentiles
of the sqrt costs of the alpha-0 trajectories of the same questions (what a warm start trained on them spends when
PPO starts; `cost_window` LOW HIGH gives it in USD instead). P(right) comes from the pool's sim profiles, never from
whether an expert happens to know the fact: the product of the hops' per-domain accuracies; a two-fact question
asked whole, that times the model's multi_hop; a guess, one over the answers of its type. A plan's cost is the sum
of the real simulated replies' costs (deterministic). The candidates: one model per remaining hop (every
combination), the whole question to one model, or a guess without a call. After a reply without an answer the rest
is planned again from there (the cost so far counts; no model is asked the same thing twice). Slips (the builder's
noise) are the hop oracle's.
"""
from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass, field
from typing import Optional

from data_process.schema import DataBuildError
from router_r1.pool.registry import ModelRegistry, ModelSpec
from router_r1.pool.messages import submodel_messages
from router_r1.reward.cost import CostNormalizer, cost_reward
from router_r1.reward.format import check_format
from sim.backend import SimBackend
from sim.warm_start.build import Context, Routed, Routes
from sim.warm_start.oracle import Oracle, Trajectory
from sim.world import RELATIONS, SimQuestion

THINK_ALPHA_AT = ("pick", "start")  # where think_alpha restates the weight: just before "Ask <model>", or first
GUESS, WHOLE, HOPS = "guess", "whole", "hops"
ALPHA_COLUMNS = ("data_source", "uid", "prompt", "response_text", "segments", "answers", "question", "domain", "alpha",
                 "mode", "plan", "routes", "renamed", "route_models", "cost_usd", "em")
# Every cost weight a prompt may state (0, 0.01, ..., 1 as alpha_text writes them) one token, so that a policy reads
# one symbol, not "0", ".", "3" (split, the from-scratch policy told only 0 from the rest; whole, it ignored the
# alpha altogether: docs/results/alpha_tradeoff, "One token per alpha")
ALPHA_WORDS = tuple(f"{k / 100:g}" for k in range(101))


@dataclass
class PerAlphaRoutes:
    """Each row's routes are the best plan at a cost weight its prompt states."""

    alphas: list[float] = field(default_factory=list)  # the cost weights each row's alpha is drawn from; given, every oracle-mode row follows the plan of highest expected reward at its alpha (empty: the hop oracle's routes, no alpha)
    each_alpha: bool = False  # every question once at each of --alphas (--n rows over n / len(alphas) questions): rows that differ only in the stated alpha
    think_alpha: bool = False  # each decision's <think> restates the cost weight before the pick ("Cost weight 0.6. Ask ..."): the pick then follows the number a few tokens back
    think_alpha_at: str = field(default="pick", metadata={"choices": THINK_ALPHA_AT})  # where --think-alpha restates it: before the pick, or first in the think ("Cost weight 0.6. A people fact. Ask ...")
    alpha_text: bool = True  # state the alpha in the prompt (--no-alpha-text keeps the plain prompt: the data of a run trained at one fixed alpha)
    cost_window: Optional[list[float]] = field(default=None, metadata={"metavar": "USD"})  # R_cost's window LOW HIGH in USD (default: the 5th/95th percentiles of the alpha-0 trajectories' costs)

    def __post_init__(self):
        self.alphas = [float(a) for a in self.alphas]
        if any(not 0.0 <= a <= 1.0 for a in self.alphas):
            raise ValueError(f"--alphas must be numbers in [0, 1], got {self.alphas}")
        if self.think_alpha_at not in THINK_ALPHA_AT:
            raise ValueError(f"--think-alpha-at must be one of {', '.join(THINK_ALPHA_AT)}, "
                             f"got {self.think_alpha_at!r}")
        if self.think_alpha_at != "pick" and not self.think_alpha:
            raise ValueError(f"--think-alpha-at {self.think_alpha_at} places the restated weight: "
                             "it needs --think-alpha")
        if self.cost_window is not None:
            if len(self.cost_window) != 2 or not 0 <= self.cost_window[0] < self.cost_window[1]:
                got = " ".join(map(str, self.cost_window))
                raise ValueError(f"--cost-window must be 0 <= LOW < HIGH (USD), got {got}")
        unset = self.each_alpha or self.think_alpha or not self.alpha_text or self.cost_window is not None
        if unset and not self.alphas:
            raise ValueError("--each-alpha, --think-alpha, --no-alpha-text and --cost-window shape per-alpha routes: "
                             "give --alphas")

    @property
    def on(self) -> bool:
        return bool(self.alphas)

    def check(self, recipe) -> None:
        if self.on and recipe.turn_budgets.on:
            raise ValueError("--alphas and --budgets are two route sources: a recipe takes one")
        n = recipe.build.n
        if self.each_alpha and n % len(self.alphas):
            raise ValueError(f"--each-alpha: --n ({n}) must be a multiple of the {len(self.alphas)} alphas")

    def routes(self, ctx: Context) -> "AlphaRoutes":
        return AlphaRoutes(self, ctx)


@dataclass(frozen=True)
class Plan:
    """One way to finish a question from where a trajectory stands, with its expected reward at one alpha."""

    kind: str  # HOPS (one model per remaining hop) | WHOLE (the question at once) | GUESS (no call)
    models: tuple[str, ...]
    p_right: float
    cost_usd: float  # the cost so far plus the plan's calls
    value: float  # expected reward

    @property
    def label(self) -> str:
        return {GUESS: GUESS, WHOLE: f"whole:{''.join(self.models)}"}.get(self.kind, ">".join(self.models))


class AlphaOracle(Oracle):
    """The hop oracle whose routes maximise the expected reward at a given alpha."""

    def __init__(self, backend: SimBackend, registry: ModelRegistry, max_routes: int = 3):
        super().__init__(backend, registry, max_routes)
        self.multi_hop = {s.name: backend.experts[s.api_id].profile.multi_hop for s in self.models}
        self.bounds: tuple[float, float] | None = None  # R_cost's window (sqrt USD); set_window sets it
        self._costs: dict[tuple[str, str], float] = {}

    def set_window(self, costs_usd: list[float] | None = None, usd: tuple[float, float] | None = None) -> None:
        """R_cost's window: `usd` (low, high) as given, else the 5th/95th percentiles of `costs_usd` (sqrt space)."""
        if usd is not None:
            lo, hi = usd
            if not 0 <= lo < hi:
                raise ValueError(f"--cost-window must be 0 <= LOW < HIGH (USD), got {lo} {hi}")
            self.bounds = (math.sqrt(lo), math.sqrt(hi))
            return
        norm = CostNormalizer(window=max(1, len(costs_usd or [])))
        norm.history.extend(math.sqrt(c) for c in costs_usd or [])
        self.bounds = norm.bounds()

    def call_cost(self, spec: ModelSpec, query: str) -> float:
        """USD of the simulated reply of `spec` to `query` (replies are deterministic)."""
        key = (spec.name, query)
        if key not in self._costs:
            _, pt, ct = self.backend.respond(spec.api_id, submodel_messages(query), spec.max_tokens)
            self._costs[key] = spec.output_cost(ct)  # what the default reward reads
        return self._costs[key]

    def p_guess(self, q: SimQuestion) -> float:
        return 1.0 / len(self.world.by_type[RELATIONS[q.hops[-1].relation].obj])

    def value(self, p_right: float, cost_usd: float, alpha: float) -> float:
        """Expected reward: right with probability p_right, then (1 - alpha) + alpha * R_cost."""
        return p_right * ((1.0 - alpha) + alpha * cost_reward(cost_usd, self.bounds))

    def plan(self, q: SimQuestion, start: int, entity: str | None, spent: float, asked: set, alpha: float,
             calls_left: int) -> Plan:
        """The best plan from hop `start` (asked about `entity`, the last reply's answer) with `spent` USD spent."""
        pg = self.p_guess(q)
        options = [Plan(GUESS, (), pg, spent, self.value(pg, spent, alpha))]
        hops = q.hops[start:]
        if calls_left >= len(hops):
            choices = []
            for k, hop in enumerate(hops):
                query = hop.sub_question.replace(hop.subject, entity) if k == 0 and entity else hop.sub_question
                choices.append([(s.name, self.acc[s.name][hop.domain], self.call_cost(s, query))
                                for s in self.models if (s.name, query) not in asked])
            for combo in itertools.product(*choices):
                p, cost = math.prod(a for _, a, _ in combo), spent + sum(c for _, _, c in combo)
                options.append(Plan(HOPS, tuple(m for m, _, _ in combo), p, cost, self.value(p, cost, alpha)))
        if start == 0 and len(q.hops) == 2 and calls_left >= 1:
            d1, d2 = q.hops[0].domain, q.hops[1].domain
            for s in self.models:
                if (s.name, q.question) in asked:
                    continue
                p = self.acc[s.name][d1] * self.acc[s.name][d2] * self.multi_hop[s.name]
                cost = spent + self.call_cost(s, q.question)
                options.append(Plan(WHOLE, (s.name,), p, cost, self.value(p, cost, alpha)))
        return max(options, key=lambda o: (o.value, -o.cost_usd))  # a tie goes to the cheaper

    def run_alpha(self, q: SimQuestion, alpha: float, rng: random.Random,
                  think_alpha: bool = False, at: str = "pick") -> tuple[Trajectory, Plan]:
        """The trajectory at `alpha` and its first plan; after a reply without an answer the rest is replanned.
        `think_alpha`: each decision's <think> restates the cost weight, `at` "pick" just before the pick it leads
        to, "start" first in the think."""
        if self.bounds is None and alpha > 0:
            raise ValueError("AlphaOracle: set_window before planning at alpha > 0")
        traj, start, entity, asked, first, retry = Trajectory(), 0, None, set(), None, False
        specs = {s.name: s for s in self.models}
        weight = f"Cost weight {float(alpha):g}. "  # the number as the prompt's alpha sentence writes it
        while True:
            plan = self.plan(q, start, entity, traj.cost_usd, asked, alpha, self.max_routes - len(traj.routes))
            first = first or plan
            if plan.kind == GUESS:
                traj.answer = rng.choice(self.world.by_type[RELATIONS[q.hops[-1].relation].obj])
                why = "No answer found. I will guess." if traj.routes else "A call is not worth its cost. I will guess."
                why = weight + why if think_alpha else why
                traj.say(f"<think>{why}</think><answer>{traj.answer}</answer>")
                return traj, first
            spec = specs[plan.models[0]]
            if plan.kind == WHOLE:
                query, think = q.question, f"Ask {spec.name} the whole question."
            else:
                hop = q.hops[start]
                query = hop.sub_question.replace(hop.subject, entity) if entity else hop.sub_question
                think = f"A {hop.domain} fact. Ask {spec.name}."
                if entity:
                    think = f"Got {entity}. " + think
            if retry:  # as the hop oracle's ask_hop words it
                think = f"No answer. Ask {spec.name}."
            if think_alpha:
                think = weight + think if at == "start" else think.replace("Ask ", f"{weight}Ask ", 1)
            asked.add((spec.name, query))
            got = self.ask(traj, think, spec, query)
            retry = got is None
            if retry:
                continue
            if plan.kind == WHOLE or start == len(q.hops) - 1:
                return self._finish(traj, got), first
            start, entity = start + 1, got


def alpha0_costs(oracle: AlphaOracle, questions: list[SimQuestion]) -> list[float]:
    """Cost of each question's alpha-0 trajectory (the accuracy-only plan, its retries included)."""
    return [oracle.run_alpha(q, 0.0, random.Random(0))[0].cost_usd for q in questions]


def plan_shift(oracle: AlphaOracle, questions: list[SimQuestion], alphas) -> dict[float, dict]:
    """Per alpha, over the questions' first plans: the share that differ from alpha 0's, the share that guess or
    ask the whole question, and the plans' mean cost (1e-6 USD) and P(right)."""
    plans = {a: [oracle.plan(q, 0, None, 0.0, set(), a, oracle.max_routes) for q in questions] for a in alphas}
    base = [oracle.plan(q, 0, None, 0.0, set(), 0.0, oracle.max_routes) for q in questions]
    n = max(1, len(questions))
    return {a: {"differ": sum(p.label != b.label for p, b in zip(ps, base)) / n,
                GUESS: sum(p.kind == GUESS for p in ps) / n, WHOLE: sum(p.kind == WHOLE for p in ps) / n,
                "cost_1e6": 1e6 * sum(p.cost_usd for p in ps) / n, "p_right": sum(p.p_right for p in ps) / n}
            for a, ps in plans.items()}


class AlphaRoutes(Routes):
    """Rows one alpha each, oracle-mode rows planned at it; the slips are the hop oracle's."""

    columns = ALPHA_COLUMNS
    words = ALPHA_WORDS
    metrics = {GUESS: lambda r: r["plan"] == GUESS}

    def __init__(self, spec: PerAlphaRoutes, ctx: Context):
        self.spec, self.ctx = spec, ctx
        self.oracle = AlphaOracle(ctx.backend, ctx.registry, ctx.cfg.max_routes)
        self.alpha_rng = random.Random(f"alpha-{ctx.cfg.seed}")  # alphas: a stream of their own

    def n_questions(self, n: int) -> int:
        return n // len(self.spec.alphas) if self.spec.each_alpha else n

    def prepare(self, questions: list[SimQuestion]) -> None:
        window = self.spec.cost_window
        self.oracle.set_window(None if window else alpha0_costs(self.oracle, questions), window)

    def items(self, questions: list[SimQuestion]):
        return ((q, a) for q in questions for a in (self.spec.alphas if self.spec.each_alpha else [None]))

    def draw(self, given, rng: random.Random) -> float:
        return self.alpha_rng.choice(self.spec.alphas) if given is None else given

    def prompt_args(self, alpha: float) -> dict:
        return {"alpha": alpha if self.spec.alpha_text else None}

    def route(self, q: SimQuestion, mode: str, rng: random.Random, alpha: float) -> Routed:
        if mode == "oracle":
            traj, plan = self.oracle.run_alpha(q, alpha, rng, self.spec.think_alpha, self.spec.think_alpha_at)
        else:
            traj, plan = self.oracle.run(q, mode, rng), None
        ok, why = check_format(traj.text, self.ctx.registry)
        if not ok:  # a bug in the oracle, never in the data
            raise DataBuildError(f"alpha oracle trajectory for {q.uid} breaks the format ({why}): {traj.text!r}")
        return Routed(traj, self.ctx.registry, {"alpha": float(alpha), "mode": mode,
                                                "plan": plan.label if plan else mode})

    def report(self, rows: list[dict], line) -> tuple[list[str], list[str]]:
        """Per alpha; at the end, how the first plans of a sample of questions shift with alpha."""
        alphas = sorted({r["alpha"] for r in rows})
        groups = [line(f"alpha {a:g}", [r for r in rows if r["alpha"] == a]) for a in alphas]
        cfg = self.ctx.cfg
        sample = self.oracle.world.questions(min(cfg.n, 500), cfg.seed, "train", cfg.two_hop_frac)
        grid = sorted({0.0, *self.spec.alphas, *[k / 10 for k in range(11)]})
        lo, hi = self.oracle.bounds or (math.nan, math.nan)
        tail = [f"first plans of {len(sample)} questions, R_cost window {1e6 * lo**2:.2f}-{1e6 * hi**2:.2f}e-6 USD:"]
        for a, s in plan_shift(self.oracle, sample, grid).items():
            tail.append(f"  alpha {a:<4g} differ from alpha 0: {s['differ']:.3f}  guess {s[GUESS]:.3f}  whole "
                        f"{s[WHOLE]:.3f}  planned cost {s['cost_1e6']:.2f}e-6 USD  P(right) {s['p_right']:.3f}")
        return groups, tail
