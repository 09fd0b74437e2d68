"""The simulated world as router_r1 loads it (router_r1/pool/world.py): a pool yaml's `world: sim` names it.

make_backend gives the pool server its experts (sim/backend.py); make_truth gives the answer key
(sim/truth.py) with the stages (sim/stages.py) and oracle baselines (sim/oracle_baselines.py) that read it;
listing_topics words a model's domains for the domain listing (router_r1/pool/listing.py).
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from router_r1.pool.registry import ModelRegistry, RegistryError
from sim.backend import SimBackend
from sim.embedded import model_topics
from sim.stages import call_stages
from sim.truth import SimTruth
from sim.world import DEFAULT_ENTITIES, SimWorld

if TYPE_CHECKING:  # `import sim` stays light: the client loads openai
    from router_r1.pool.client import PoolClient


def make_backend(pool: str | os.PathLike, *, seed: int, latency_scale: float,
                 entities: int | None = None) -> SimBackend:
    """The experts of `pool`'s models (their `sim:` profiles) over SimWorld(seed) with `entities` per type."""
    world = SimWorld(seed=seed, n_entities_per_type=DEFAULT_ENTITIES if entities is None else entities)
    return SimBackend.from_pool_yaml(pool, seed=seed, latency_scale=latency_scale, world=world)


class AnswerKey(SimTruth):
    """SimTruth as router_r1's answer key (router_r1.pool.world.Truth): with the stages and oracles that read it."""

    def call_stages(self, question: str | None, calls: list[dict],
                    routable: list[str] | None) -> dict[str, float | None]:
        return call_stages(self, question, calls, routable)

    def oracle_episodes(self, kind: str, questions: list[str], wheres: list[str], models: list[str],
                        client: PoolClient, chunk: int, max_obs_length: int) -> list[dict]:
        from sim.oracle_baselines import ORACLES  # evaluation only: it loads the pool client and baselines

        return ORACLES[kind](self, models, questions, wheres, client, chunk, max_obs_length)


def listing_topics(spec) -> str:
    """What the domain listing says `spec` is good at, from its `sim:` profile: "science, business" (sim/embedded.py)."""
    return model_topics(spec)


def make_truth(registry: ModelRegistry, seed: int) -> AnswerKey:
    """The answer key for `registry`'s models, each of which needs a `sim:` profile, in SimWorld(seed)."""
    bare = [s.name for s in registry.models.values() if not s.sim]
    if bare:
        raise RegistryError(f"{registry.source}: world sim needs a sim: profile for every model; "
                            f"{', '.join(bare)} has none")
    return AnswerKey.from_registry(registry, seed=seed)
