"""What the simulated world knows about a question: its facts, its entities, and which expert knows it.

Evaluation's oracle baselines (sim/oracle_baselines.py) and the stage diagnosis (sim/stages.py)
read the world the pool's experts answer from, so they can say which expert *should* have been
asked. The rule, in one place:

    P(m right | q asked verbatim) = acc_m[d]                              one fact of domain d
                                  = acc_m[d1] * acc_m[d2] * multi_hop_m   two facts asked whole

(exactly the sim experts' coins, sim/backend.py). An expert *knows* q when its
P is within KNOW_MARGIN of the best model's; the oracle's pick is the cheapest expert that
knows q. For one fact that is the domain's cheap specialist (0.95 in configs/pool/sim.yaml;
Mixtral's 0.92 also knows it but costs six times more); asked whole, a two-fact question is
known only by the strong generalists (the cheap experts' multi_hop is 0.2-0.3).
"""
from __future__ import annotations

from dataclasses import dataclass

from router_r1.pool.registry import ModelRegistry
from sim.backend import SimProfile
from sim.world import DEFAULT_ENTITIES, DOMAINS, RELATIONS, Fact, SimWorld

KNOW_MARGIN = 0.05  # an expert within this of the best P(right) knows the question


@dataclass(frozen=True)
class Expert:
    name: str
    price: float  # USD per 1M output tokens
    profile: SimProfile


class SimTruth:
    """The world's facts and the experts' accuracies, for the models of one pool registry."""

    def __init__(self, world: SimWorld, experts: list[Expert]):
        if not experts:
            raise ValueError("SimTruth: no experts")
        self.world = world
        self.experts = {e.name: e for e in experts}

    @classmethod
    def from_registry(cls, registry: ModelRegistry, seed: int = 0,
                      n_entities_per_type: int = DEFAULT_ENTITIES) -> "SimTruth | None":
        """The truth for a pool whose every model has a `sim:` profile; None for any other pool."""
        specs = list(registry.models.values())
        if not specs or any(not s.sim for s in specs):
            return None
        experts = [Expert(s.name, s.price_out_per_m,
                          SimProfile.from_dict(s.sim, f"{registry.source}: model {s.name!r}")) for s in specs]
        return cls(SimWorld(seed=seed, n_entities_per_type=n_entities_per_type), experts)

    # ---- the question ---------------------------------------------------------------

    def facts(self, text: str) -> list[Fact] | None:
        """The chain of facts a query asks (one or two), or None when the world cannot read it."""
        parsed = self.world.parse(text or "")
        if parsed is None or not parsed.relations:
            return None
        out, subject = [], parsed.entity.name
        for rel in parsed.relations:
            f = self.world.fact(rel.name, subject)
            out.append(f)
            subject = f.object
        return out

    def domain(self, text: str) -> str | None:
        """The domain of a one-fact query; None for a chain of two or a query the world cannot read."""
        facts = self.facts(text)
        return facts[0].domain if facts and len(facts) == 1 else None

    def entities(self, text: str) -> list[str] | None:
        """The entity names as the query writes them (the world's parse), or None when it names none."""
        found = self.world.find_entity(text or "")
        return None if found is None else [text[found[1]:found[2]]]

    # ---- the experts ----------------------------------------------------------------

    def p_right(self, model: str, facts: list[Fact]) -> float:
        """P(the expert answers the chain right when asked it whole), from its profile."""
        prof = self.experts[model].profile
        p = 1.0
        for f in facts:
            p *= prof.accuracy[f.domain]
        return p * (prof.multi_hop if len(facts) > 1 else 1.0)

    def knowing(self, facts: list[Fact], among: list[str] | None = None) -> list[str]:
        """The experts (of `among`, default all) within KNOW_MARGIN of the best P(right), cheapest first."""
        names = list(among) if among is not None else list(self.experts)
        p = {m: self.p_right(m, facts) for m in names}
        best = max(p.values())
        return sorted((m for m in names if p[m] >= best - KNOW_MARGIN), key=lambda m: (self.experts[m].price, m))

    def strong_domains(self, model: str, threshold: float = 0.9) -> list[str]:
        """The domains on which `model` is right at least `threshold` of the time (its specialities)."""
        acc = self.experts[model].profile.accuracy
        return [d for d in DOMAINS if acc[d] >= threshold]

    def pick(self, facts: list[Fact], among: list[str] | None = None) -> str:
        """The oracle's expert for the chain asked whole: the cheapest that knows it."""
        return self.knowing(facts, among)[0]

    def hop_question(self, fact: Fact, subject: str, variant: int = 0) -> str:
        """The one-fact question of `fact`'s relation about `subject` (hop 2 asks about hop 1's answer)."""
        return RELATIONS[fact.relation].ask(subject, variant)
