"""A simulated pool names its world (`world: sim`); router_r1 loads it by that name (router_r1/pool/world.py)."""
from pathlib import Path

import pytest
import yaml

from router_r1.pool.preflight import pool_problems
from router_r1.pool.registry import ModelRegistry, RegistryError
from router_r1.pool.world import answer_key, load_world, world_of
from test_registry import pool_error

POOLS = Path(__file__).resolve().parents[1] / "configs" / "pool"
ONE = {"name": "A", "api_id": "a", "price_out_per_m": 1.0}


def test_simulated_pools_name_their_world_and_real_ones_do_not():
    for path in sorted(POOLS.glob("*.yaml")):
        reg = ModelRegistry.from_yaml(path)
        assert reg.world == ("sim" if path.stem.startswith("sim") else None), path
        assert reg.seen().world == reg.subset(reg.names[:1]).world == reg.world  # a subset keeps its world
    assert answer_key(ModelRegistry.from_yaml(POOLS / "paper.yaml"), 0) is None


def test_the_answer_key_covers_the_pool_s_models_in_the_seed_s_world():
    reg = ModelRegistry.from_yaml(POOLS / "sim_unseen.yaml")
    truth = answer_key(reg, 4)
    assert truth.world.seed == 4 and set(truth.experts) == set(reg.names)
    q = next(q for q in truth.world.questions(50, seed=1) if len(q.hops) == 1)
    assert truth.domain(q.question) == q.hops[0].domain
    assert truth.entities(q.question) == [q.hops[0].subject]
    assert "science" in truth.strong_domains("SciGLM-6B")


@pytest.mark.parametrize("doc, needle", [
    ({"models": [ONE], "wrold": "sim"}, "unknown top-level key(s) ['wrold']"),
    ({"models": [ONE], "world": "sim/"}, "world must be a module name"),
    ({"models": [ONE], "world": ["sim"]}, "world must be a module name"),
])
def test_a_bad_top_level_key_is_named(tmp_path, doc, needle):
    assert needle in pool_error(tmp_path, doc)


def test_a_world_that_cannot_serve_is_named_with_its_pool_file():
    with pytest.raises(RegistryError, match="pool.yaml: world 'no_such_world' cannot be imported"):
        load_world("no_such_world", "pool.yaml")
    with pytest.raises(RegistryError, match="pool.yaml: world 'json' .* lacks make_backend, make_truth"):
        load_world("json", "pool.yaml")
    real = ModelRegistry.from_dict({"models": [ONE]}, source="real.yaml")
    with pytest.raises(RegistryError, match="real.yaml: --sim needs a simulated pool.*names no world"):
        world_of(real, "--sim")
    bare = ModelRegistry.from_dict({"models": [ONE], "world": "sim"}, source="bare.yaml")
    with pytest.raises(RegistryError, match="bare.yaml: world sim needs a sim: profile for every model; A has none"):
        answer_key(bare, 0)


def test_preflight_reports_a_world_that_cannot_judge_the_pool(tmp_path):
    assert pool_problems({"pool": str(POOLS / "sim.yaml")}) == []
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump({"world": "sim", "models": [ONE]}))
    problems = pool_problems({"pool": str(path)})
    assert len(problems) == 1 and problems[0].startswith(f"env.pool: {path}")
    assert "world sim needs a sim: profile for every model; A has none" in problems[0]
