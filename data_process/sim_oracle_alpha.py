"""Alpha-conditioned oracle trajectories: the SFT warm start of one router for every cost weight (issue 31).

    python -m data_process.sim_oracle_alpha --out-dir outputs/alpha/oracle --n 2000 --alphas 0 0.3 0.6 0.9 --report

Each row draws a cost weight alpha from --alphas (--each-alpha: each question comes once at every alpha); its
prompt states it as the environment renders a prompt under env.alphas (prompts.alpha_text through
build_router_prompt; --no-alpha-text keeps the plain prompt, for the data of a run trained at one fixed alpha;
--think-alpha restates it in each decision's <think>, which is what made a pretrained policy read it:
docs/results/h200/gemma_alpha, and the embedded default on 4,000 rows: docs/results/alpha_tradeoff/think_alpha_4k;
--think-alpha-at start puts it first in the think), and its trajectory follows the plan of highest expected reward
under the project's gate (router_r1/reward/score.py) at that alpha:

    E[r] = P(right) * ((1 - alpha) + alpha * R_cost(cost))

R_cost is the cost normaliser's (router_r1/reward/cost.py: 1 for a free trajectory, else
1 - clip((sqrt(cost) - p_low) / (p_high - p_low), 0, 1)) read against one fixed window: the 5th/95th
percentiles of the sqrt costs of the alpha-0 trajectories of the same questions (what a warm start
trained on them spends when PPO starts; --cost-window LOW HIGH gives it in USD instead). P(right)
comes from the pool's sim profiles, never from whether an expert happens to know the fact: the
product of the hops' per-domain accuracies; a two-fact question asked whole, that times the model's
multi_hop; a guess, one over the answers of its type. A plan's cost is the sum of the real simulated
replies' costs (deterministic). The candidates: one model per remaining hop (every combination), the
whole question to one model, or a guess without a call. After a reply without an answer the rest is
planned again from there (the cost so far counts; no model is asked the same thing twice). With
probability --noise a row is one of sim_oracle's slips instead. --rename and --whole-names mean what they mean
for sim_oracle (the SFT data of issue 32): a share of rows get their entities renamed to other names of the world,
consistently across prompt question, segments and answers (routes, alpha, plan and cost unchanged), and each
multi-word entity name is one token of the tokenizer.

Writes OUT/oracle.parquet (sim_oracle's columns plus alpha and plan), OUT/prompt_template.txt, and
unless --no-tokenizer the BPE tokenizer and model config of the embedded default (OUT/tokenizer,
OUT/model.json), trained on these prompts, so the alpha sentence is known text.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from data_process.build_qa import size_arg
from data_process.schema import DataBuildError
from data_process import sim_oracle
from data_process.sim_oracle import (DEFAULT_POOL, NOISE_MODES, Oracle, Renamer, Trajectory, chat_text, pick_mode,
                                     token_names)
from router_r1.pool.registry import ModelRegistry, ModelSpec
from sim.backend import SimBackend
from sim.world import DEFAULT_ENTITIES, RELATIONS, SimQuestion, SimWorld
from router_r1.prompts import build_router_prompt, load_template, submodel_messages
from router_r1.reward.cost import CostNormalizer, cost_reward
from router_r1.reward.format import check_format
from router_r1.reward.qa_em import em_score

DEFAULT_ALPHAS = (0.0, 0.3, 0.6, 0.9)
THINK_ALPHA_AT = ("pick", "start")  # where --think-alpha restates the weight: just before "Ask <model>", or first
GUESS, WHOLE, HOPS = "guess", "whole", "hops"


# Every cost weight a prompt may state (0, 0.01, ..., 1 as alpha_text writes them) one token, so that a policy reads
# one symbol, not "0", ".", "3" (split, the from-scratch policy told only 0 from the rest; whole, it ignored the
# alpha altogether: docs/results/alpha_tradeoff, "One token per alpha")
ALPHA_WORDS = tuple(f"{k / 100:g}" for k in range(101))


@dataclass
class AlphaOracleConfig:
    out_dir: str | Path
    n: int = 2000
    alphas: tuple[float, ...] = DEFAULT_ALPHAS  # each row's alpha is drawn from these
    # Every question once at each alpha (n / len(alphas) questions): rows that differ only in the stated alpha,
    # so the alpha is the one thing that tells their routes apart
    each_alpha: bool = False
    # Each decision's <think> restates the cost weight ("Cost weight 0.6. Ask ..."): the pick then follows the
    # number a few tokens back, not a sentence of the prompt
    think_alpha: bool = False
    # "start": the restatement opens the think ("Cost weight 0.6. A people fact. Ask ..."). On 2,000 rows the 2-layer
    # embedded policy began to copy the prompt's alpha there first; on 4,000 rows "pick" matched the fixed runs
    # better (docs/results/alpha_tradeoff/think_alpha_4k)
    think_alpha_at: str = "pick"
    alpha_text: bool = True  # state the alpha in the prompt (False: a fixed-alpha run's data)
    cost_window: tuple[float, float] | None = None  # (low, high) USD of R_cost's window; None: the alpha-0 trajectories'
    noise: float = 0.05  # P(one of sim_oracle's slips instead of the plan)
    seed: int = 0
    world_seed: int = 0  # must equal the simulated pool's seed
    world_entities: int = DEFAULT_ENTITIES
    pool: str | Path = DEFAULT_POOL
    prompt_template: str | Path | None = None  # None: the compact template with the compact pool text
    two_hop_frac: float = 0.4
    max_routes: int = 3
    report: bool = False
    tokenizer: bool = True
    vocab_size: int = 1024
    model: str | None = None  # JSON of EMBEDDED_MODEL keys to override in OUT/model.json
    whole_names: bool = False  # each multi-word entity name one token (sim_oracle --whole-names)
    rename: float = 0.0  # share of rows whose entities are renamed (sim_oracle --rename)


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
    """sim_oracle's Oracle whose routes maximise the expected reward at a given alpha."""

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
            self._costs[key] = spec.cost(pt, ct)
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
            if retry:  # as sim_oracle's ask_hop words it
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


def build_rows(cfg: AlphaOracleConfig, template_path: str | Path) -> tuple[list[dict], list[str], AlphaOracle]:
    """Oracle rows (one alpha each), extra tokenizer text (every model's replies), and the oracle (its window set)."""
    if not cfg.alphas or any(not 0.0 <= a <= 1.0 for a in cfg.alphas):
        raise ValueError(f"--alphas must be numbers in [0, 1], got {list(cfg.alphas)}")
    if not 0.0 <= cfg.noise <= 1.0:
        raise ValueError(f"--noise must be in [0, 1], got {cfg.noise}")
    if cfg.max_routes < 2:
        raise ValueError(f"--max-routes must be >= 2 (two hops), got {cfg.max_routes}")
    if cfg.think_alpha_at not in THINK_ALPHA_AT:
        raise ValueError(f"--think-alpha-at must be one of {', '.join(THINK_ALPHA_AT)}, got {cfg.think_alpha_at!r}")
    if cfg.think_alpha_at != "pick" and not cfg.think_alpha:
        raise ValueError(f"--think-alpha-at {cfg.think_alpha_at} places the restated weight: it needs --think-alpha")
    if cfg.each_alpha and cfg.n % len(cfg.alphas):
        raise ValueError(f"--each-alpha: --n ({cfg.n}) must be a multiple of the {len(cfg.alphas)} alphas")
    registry = ModelRegistry.from_yaml(cfg.pool).seen()
    world = SimWorld(seed=cfg.world_seed, n_entities_per_type=cfg.world_entities)
    backend = SimBackend.from_pool_yaml(cfg.pool, seed=cfg.world_seed, latency_scale=0.0, world=world)
    oracle = AlphaOracle(backend, registry, cfg.max_routes)
    template = load_template(template_path)
    renamer = Renamer(world, template_path, cfg.rename, cfg.seed)
    questions = world.questions(cfg.n // len(cfg.alphas) if cfg.each_alpha else cfg.n, cfg.seed, "train",
                                cfg.two_hop_frac)
    oracle.set_window(None if cfg.cost_window else alpha0_costs(oracle, questions), cfg.cost_window)
    rng, alpha_rng = random.Random(cfg.seed), random.Random(f"alpha-{cfg.seed}")  # alphas: a stream of their own
    rows, counts = [], {}
    for q, alpha in ((q, a) for q in questions for a in (cfg.alphas if cfg.each_alpha else [None])):
        source = "sim_1hop" if len(q.hops) == 1 else "sim_2hop"
        index = counts[source] = counts.get(source, -1) + 1
        alpha = alpha_rng.choice(cfg.alphas) if alpha is None else alpha
        mode = pick_mode(q, cfg.noise, rng)
        if mode == "oracle":
            traj, plan = oracle.run_alpha(q, alpha, rng, cfg.think_alpha, cfg.think_alpha_at)
        else:
            traj, plan = oracle.run(q, mode, rng), None
        ok, why = check_format(traj.text, registry)
        if not ok:  # a bug in the oracle, never in the data
            raise DataBuildError(f"alpha oracle trajectory for {q.uid} breaks the format ({why}): {traj.text!r}")
        renamed, question, segments, answers, answer = renamer(q.question, traj.segments, list(q.answers), traj.answer)
        prompt = build_router_prompt(question, registry, template, alpha=alpha if cfg.alpha_text else None)
        rows.append({
            "data_source": source, "uid": f"{source}-oracle-{index}", "prompt": prompt,
            "response_text": "".join(seg["text"] for seg in segments), "segments": segments, "answers": answers,
            "question": question, "domain": q.domain, "alpha": float(alpha), "mode": mode,
            "plan": plan.label if plan else mode, "routes": len(traj.routes), "renamed": renamed,
            "route_models": [m for m, _ in traj.routes], "cost_usd": traj.cost_usd,
            "em": em_score(answer, answers),
        })
    extra = []  # replies of every pool model (unseen too) so the BPE also knows their wording
    everyone = ModelRegistry.from_yaml(cfg.pool)
    for q in questions[:200]:
        for spec in everyone.models.values():
            extra.append(backend.respond(spec.api_id, submodel_messages(q.hops[0].sub_question), spec.max_tokens)[0])
    return rows, extra, oracle


def report(rows: list[dict], oracle: AlphaOracle | None = None, questions: list[SimQuestion] | None = None,
           alphas=()) -> str:
    """EM, calls and cost per alpha and per plan kind; with an oracle, how its first plans shift with alpha."""
    def line(name, rs):
        n = len(rs)
        return (f"{name:<14} n={n:<5} em={sum(r['em'] for r in rs) / n:.3f} "
                f"routes={sum(r['routes'] for r in rs) / n:.2f} guess={sum(r['plan'] == GUESS for r in rs) / n:.2f} "
                f"cost={1e6 * sum(r['cost_usd'] for r in rs) / n:.2f}e-6 USD")
    out = [line("all", rows)]
    for a in sorted({r["alpha"] for r in rows}):
        out.append(line(f"alpha {a:g}", [r for r in rows if r["alpha"] == a]))
    for mode in NOISE_MODES:
        if rs := [r for r in rows if r["mode"] == mode]:
            out.append(line(mode, rs))
    if oracle is not None and questions:
        lo, hi = oracle.bounds or (math.nan, math.nan)
        out.append(f"first plans of {len(questions)} questions, R_cost window {1e6 * lo**2:.2f}-{1e6 * hi**2:.2f}e-6 USD:")
        for a, s in plan_shift(oracle, questions, alphas).items():
            out.append(f"  alpha {a:<4g} differ from alpha 0: {s['differ']:.3f}  guess {s[GUESS]:.3f}  whole "
                       f"{s[WHOLE]:.3f}  planned cost {s['cost_1e6']:.2f}e-6 USD  P(right) {s['p_right']:.3f}")
    return "\n".join(out)


def run(cfg: AlphaOracleConfig) -> dict:
    """Write the oracle parquet, the template (and tokenizer, model config); return what was written."""
    import pandas as pd

    from sim.embedded import build_tokenizer, write_model_config

    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    template = sim_oracle.own_template(out, cfg.prompt_template, cfg.pool)
    t0 = time.perf_counter()
    rows, extra, oracle = build_rows(cfg, template)
    pd.DataFrame(rows).to_parquet(out / "oracle.parquet", index=False)
    written = {"oracle": str(out / "oracle.parquet"), "template": str(template), "rows": len(rows),
               "data_s": time.perf_counter() - t0}
    if cfg.tokenizer:
        t1 = time.perf_counter()
        corpus = [chat_text(r["prompt"]) for r in rows] + [r["response_text"] for r in rows] + extra
        world = SimWorld(seed=cfg.world_seed, n_entities_per_type=cfg.world_entities)
        names = token_names(cfg.pool, world, whole_names=cfg.whole_names)  # one token each, as sim_oracle
        tok = build_tokenizer(out / "tokenizer", corpus, cfg.vocab_size, extra_words=[*names, *ALPHA_WORDS])
        write_model_config(out / "model.json", tok, json.loads(cfg.model) if cfg.model else None)
        written.update(tokenizer=str(out / "tokenizer"), model=str(out / "model.json"),
                       tokenizer_s=time.perf_counter() - t1)
    if cfg.report:
        sample = oracle.world.questions(min(cfg.n, 500), cfg.seed, "train", cfg.two_hop_frac)
        grid = sorted({0.0, *cfg.alphas, *[k / 10 for k in range(11)]})
        written["report"] = report(rows, oracle, sample, grid)
    return written


def parse_args(argv: list[str] | None = None) -> AlphaOracleConfig:
    p = argparse.ArgumentParser(prog="python -m data_process.sim_oracle_alpha", description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", default="data/alpha", help="where oracle.parquet, prompt_template.txt (and the tokenizer) go")
    p.add_argument("--n", type=size_arg, default=2000, help="trajectories (simulated train questions)")
    p.add_argument("--alphas", type=float, nargs="+", default=list(DEFAULT_ALPHAS),
                   help="the cost weights each row's alpha is drawn from")
    p.add_argument("--think-alpha", action="store_true",
                   help="each decision's <think> restates the cost weight before the pick (\"Cost weight 0.6. Ask ...\")")
    p.add_argument("--think-alpha-at", choices=THINK_ALPHA_AT, default="pick",
                   help="where --think-alpha restates it: before the pick, or first in the think (\"Cost weight 0.6. A "
                        "people fact. Ask ...\")")
    p.add_argument("--each-alpha", action="store_true",
                   help="every question once at each of --alphas (--n rows over n / len(alphas) questions)")
    p.add_argument("--no-alpha-text", dest="alpha_text", action="store_false",
                   help="keep the plain prompt (the data of a run trained at one fixed alpha: --alphas A)")
    p.add_argument("--cost-window", type=float, nargs=2, default=None, metavar=("LOW", "HIGH"),
                   help="R_cost's window in USD (default: 5th/95th percentile of the alpha-0 trajectories' costs)")
    p.add_argument("--noise", type=float, default=0.05, help="probability of one of sim_oracle's slips")
    p.add_argument("--seed", type=int, default=0, help="question draw, alpha draw and noise seed")
    sim_oracle.add_world_args(p)
    p.add_argument("--report", action="store_true", help="print EM, calls and cost per alpha, and how plans shift")
    sim_oracle.add_vocab_args(p)
    a = p.parse_args(argv)
    return AlphaOracleConfig(**{**vars(a), "alphas": tuple(a.alphas),
                                "cost_window": tuple(a.cost_window) if a.cost_window else None})


def main(argv: list[str] | None = None) -> int:
    return sim_oracle.main(argv, parse=parse_args, build=run)


if __name__ == "__main__":
    sys.exit(main())
