"""Budget-aware oracle trajectories (AdaTurn): the SFT warm start of a router that reads its turn budget.

    python -m data_process.sim_oracle_budget --out-dir outputs/adaturn/oracle --n 2000 --budgets 1 2 3 4 5 6 \
        --prompt-template outputs/embedded/oracle/prompt_template.txt --report

Each row draws a budget B from --budgets; its prompt states B (the template's {budget}) and
its trajectory makes at most B pool calls. The plan depends on B, as sim_oracle's does on
the hops: hop by hop to the cheapest reliable model when B covers the hops (a retry after
a reply without an answer only when B leaves room for it); with B = 1 and two hops, the
whole question to the model most likely to compose both facts; with B = 0, a guess. With
probability --forced-frac a row whose unbudgeted plan needs more than B calls shows the
forced answer instead: that plan runs until it asks for call B + 1, that turn is dropped,
the environment's budget-exhausted message follows (environment text) and the policy
answers (a guess: what it still lacked was the final fact). --noise mixes in sim_oracle's suboptimal modes, capped
at B. Replies are the simulated pool's real ones (same world seed).

Writes OUT/oracle.parquet (prompt, response_text, segments, answers, budget, mode, forced,
routes, cost_usd, em) for verl.trainer.sft, and OUT/prompt_template.txt (the template used).
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from data_process.build_qa import make_prompter, size_arg
from data_process.schema import DataBuildError
from data_process import sim_oracle
from data_process.sim_oracle import DEFAULT_POOL, NOISE_MODES, Oracle, Trajectory, pick_mode
from router_r1.pool.registry import ModelRegistry, ModelSpec
from sim.backend import SimBackend
from sim.world import RELATIONS, SimQuestion
from router_r1.prompts import budget_exhausted_message
from router_r1.reward.format import check_format
from router_r1.reward.qa_em import em_score

CONTROL = budget_exhausted_message()  # the text the rollout appends after a refused route


class _Spent(Exception):
    """A route was asked for after the budget was spent."""


@dataclass
class BudgetOracleConfig:
    out_dir: str | Path
    n: int = 2000
    budgets: tuple[int, ...] = (1, 2, 3, 4, 5, 6)
    forced_frac: float = 0.3  # of the rows whose unbudgeted plan exceeds their budget
    noise: float = 0.2
    seed: int = 0
    world_seed: int = 0
    pool: str | Path = DEFAULT_POOL
    prompt_template: str | Path | None = None  # None: the compact template with the compact pool text
    two_hop_frac: float = 0.4
    max_routes: int = 3  # the unbudgeted plan's cap (sim_oracle's)
    report: bool = False


class BudgetOracle(Oracle):
    """sim_oracle's Oracle with a plan that fits a turn budget, or runs into it (the forced answer)."""

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


def build_rows(cfg: BudgetOracleConfig, template_path: str | Path) -> list[dict]:
    if not cfg.budgets or min(cfg.budgets) < 0:
        raise ValueError(f"--budgets must be integers >= 0, got {list(cfg.budgets)}")
    for name in ("forced_frac", "noise"):
        if not 0.0 <= getattr(cfg, name) <= 1.0:
            raise ValueError(f"--{name.replace('_', '-')} must be in [0, 1], got {getattr(cfg, name)}")
    registry = ModelRegistry.from_yaml(cfg.pool).seen()
    backend = SimBackend.from_pool_yaml(cfg.pool, seed=cfg.world_seed, latency_scale=0.0)
    oracle = BudgetOracle(backend, registry, cfg.max_routes)
    prompters = {b: make_prompter(cfg.pool, False, template_path, b) for b in sorted(set(cfg.budgets))}
    questions = backend.world.questions(cfg.n, cfg.seed, "train", cfg.two_hop_frac)
    rng = random.Random(cfg.seed)
    rows, counts = [], {}
    for q in questions:
        source = "sim_1hop" if len(q.hops) == 1 else "sim_2hop"
        index = counts[source] = counts.get(source, -1) + 1
        budget = rng.choice(cfg.budgets)
        mode = pick_mode(q, cfg.noise, rng)
        traj = None
        if mode == "oracle":  # a forced example only where the unbudgeted plan runs into the budget
            probe = random.Random()
            probe.setstate(rng.getstate())
            if oracle.exceeds(q, budget, probe) and rng.random() < cfg.forced_frac:
                traj = oracle.run_budget(q, budget, mode, True, rng)
        traj = traj or oracle.run_budget(q, budget, mode, False, rng)
        forced = any(s["text"] == CONTROL for s in traj.segments)
        if len(traj.routes) > budget:  # a bug in the oracle, never in the data
            raise DataBuildError(f"budget oracle for {q.uid}: {len(traj.routes)} calls > budget {budget}")
        ok, why = check_format(reward_text(traj.segments), registry)
        if not ok:
            raise DataBuildError(f"budget oracle trajectory for {q.uid} breaks the format ({why}): {traj.text!r}")
        rows.append({
            "data_source": source, "uid": f"{source}-oracle-{index}", "prompt": prompters[budget](q.question),
            "response_text": traj.text, "segments": traj.segments, "answers": list(q.answers),
            "question": q.question, "domain": q.domain, "budget": budget,
            "mode": "forced" if forced else mode, "forced": forced, "routes": len(traj.routes),
            "route_models": [m for m, _ in traj.routes], "cost_usd": traj.cost_usd,
            "em": em_score(traj.answer, q.answers),
        })
    return rows


def report(rows: list[dict]) -> str:
    """EM, calls and cost per budget, and per mode."""
    def line(name, rs):
        n = len(rs)
        return (f"{name:<12} n={n:<5} em={sum(r['em'] for r in rs) / n:.3f} "
                f"routes={sum(r['routes'] for r in rs) / n:.2f} forced={sum(r['forced'] for r in rs) / n:.2f} "
                f"cost={1e6 * sum(r['cost_usd'] for r in rs) / n:.2f}e-6 USD")
    out = [line("all", rows)]
    for b in sorted({r["budget"] for r in rows}):
        out.append(line(f"budget {b}", [r for r in rows if r["budget"] == b]))
    for mode in ("oracle", "forced", *NOISE_MODES):
        rs = [r for r in rows if r["mode"] == mode]
        if rs:
            out.append(line(mode, rs))
    return "\n".join(out)


def run(cfg: BudgetOracleConfig) -> dict:
    import pandas as pd

    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    template = sim_oracle.own_template(out, cfg.prompt_template, cfg.pool)
    t0 = time.perf_counter()
    rows = build_rows(cfg, template)
    pd.DataFrame(rows).to_parquet(out / "oracle.parquet", index=False)
    written = {"oracle": str(out / "oracle.parquet"), "template": str(template), "rows": len(rows),
               "data_s": time.perf_counter() - t0}
    if cfg.report:
        written["report"] = report(rows)
    return written


def parse_args(argv: list[str] | None = None) -> BudgetOracleConfig:
    p = argparse.ArgumentParser(prog="python -m data_process.sim_oracle_budget", description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", default="data/adaturn", help="where the budget-aware oracle trajectories are written")
    p.add_argument("--n", type=size_arg, default=2000, help="trajectories to write")
    p.add_argument("--budgets", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6], help="the set B is drawn from")
    p.add_argument("--forced-frac", type=float, default=0.3,
                   help="share of the rows whose unbudgeted plan exceeds B shown as a forced answer")
    p.add_argument("--noise", type=float, default=0.2, help="probability of a suboptimal (sim_oracle) mode")
    p.add_argument("--seed", type=int, default=0, help="seed of the question draw and the noise")
    p.add_argument("--world-seed", type=int, default=0, help="must match the simulated pool's seed")
    p.add_argument("--pool", default=str(DEFAULT_POOL), help="pool yaml the trajectories route to")
    p.add_argument("--prompt-template", default=None, help="template with {budget} (default: compact + pool)")
    p.add_argument("--two-hop-frac", type=float, default=0.4, help="share of two-hop questions")
    p.add_argument("--max-routes", type=int, default=3, help="most routing turns of one trajectory")
    p.add_argument("--report", action="store_true", help="print how the trajectories split by mode and budget")
    a = p.parse_args(argv)
    return BudgetOracleConfig(**{**vars(a), "budgets": tuple(a.budgets)})


def main(argv: list[str] | None = None) -> int:
    return sim_oracle.main(argv, parse=parse_args, build=run)


if __name__ == "__main__":
    sys.exit(main())
