"""A simulated pool's world, loaded by the name its pool yaml gives (`world: sim`); router_r1 imports none.

A world is a module offering `make_backend` (the experts the pool server serves, router_r1/pool/server.py)
and `make_truth` (its answer key: what a question asks and which expert should get it). The training
environment's stage/* metrics (router_r1/stages.py), the evaluation's oracle baselines and its unseen-model
shares read the answer key; a pool without a world gets the world-free stages and no oracle.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from router_r1.pool.registry import ModelRegistry, RegistryError

if TYPE_CHECKING:  # annotations only: the server imports this module
    from router_r1.pool.client import PoolClient
    from router_r1.pool.server import Backend

SIM_POOL = Path(__file__).resolve().parents[2] / "configs" / "pool" / "sim.yaml"  # the default pool: simulated
WORLD_STAGES = ("expert_ok", "expert_best", "decomposed")  # the stages only a world can judge
ORACLE_KINDS = ("oracle", "oracle-hops")  # evaluation's baselines that route by the answer key


class Truth(Protocol):
    """A world's answer key for the models of one pool."""

    def entities(self, text: str) -> list[str] | None:
        """The entity names as `text` writes them, or None where the world reads none."""

    def domain(self, text: str) -> str | None:
        """The domain of a one-fact query; None for any other."""

    def strong_domains(self, model: str) -> list[str]:
        """The domains `model` is reliable on (where an unseen model should get the calls)."""

    def call_stages(self, question: str | None, calls: list[dict],
                    routable: list[str] | None) -> dict[str, float | None]:
        """WORLD_STAGES of one trajectory's pool calls (turns with "model", "query"), None where one does not
        apply; `routable`: the experts the router could call (None: every model of the pool)."""

    def oracle_episodes(self, kind: str, questions: list[str], wheres: list[str], models: list[str],
                        client: PoolClient, chunk: int, max_obs_length: int) -> list[dict]:
        """The episodes of an ORACLE_KINDS baseline over `models`, through `client` (`wheres` name the rows
        in errors)."""


class World(Protocol):
    """What a world module offers."""

    def make_backend(self, pool: str | Path, *, seed: int, latency_scale: float,
                     entities: int | None = None) -> Backend:
        """The experts of `pool`'s models over the world of `seed` (`entities` per type: None, its default)."""

    def make_truth(self, registry: ModelRegistry, seed: int) -> Truth:
        """The answer key for `registry`'s models in the world of `seed`."""

    # optional: listing_topics(spec) -> str, a model's domains as the domain listing shows them (router_r1/pool/listing.py)


_ENTRY_POINTS = ("make_backend", "make_truth")


def load_world(name: str, source: str) -> World:
    """The world module `name`, as pool file `source` names it; RegistryError naming both when it cannot serve."""
    try:
        module = importlib.import_module(name)
    except ImportError as e:
        raise RegistryError(f"{source}: world {name!r} cannot be imported ({e})") from e
    missing = [f for f in _ENTRY_POINTS if not callable(getattr(module, f, None))]
    if missing:
        raise RegistryError(f"{source}: world {name!r} ({module.__file__}) is not a world: it lacks "
                            f"{', '.join(missing)}")
    return module


def world_of(registry: ModelRegistry, why: str) -> World:
    """The world of a simulated pool; RegistryError saying `why` one is needed when the pool names none."""
    if registry.world is None:
        raise RegistryError(f"{registry.source}: {why} needs a simulated pool, and this one names no world "
                            "(a top-level `world:` key, as configs/pool/sim.yaml has)")
    return load_world(registry.world, registry.source)


def answer_key(registry: ModelRegistry, seed: int) -> Truth | None:
    """The answer key of `registry`'s world for its models, None for a pool without a world."""
    if registry.world is None:
        return None
    return load_world(registry.world, registry.source).make_truth(registry, seed)
