"""configs/pool/sim_tradeoff.yaml: a pool where the cost weight changes the per-alpha oracle's routes (issue 31)."""
import pytest

from sim.warm_start.alpha import GUESS, AlphaOracle, alpha0_costs, plan_shift
from router_r1.pool.registry import ModelRegistry
from sim.backend import SimBackend
from sim.world import SimWorld

POOL = "configs/pool/sim_tradeoff.yaml"
ALPHAS = (0.0, 0.3, 0.6, 0.9)
CHEAP = {"Qwen2.5-1.5B-Instruct": ("science", "business"), "Gemma-2-2B-Instruct": ("people", "arts"),
         "LLaMA-3.2-1B-Instruct": ("geography", "sports")}


@pytest.fixture(scope="module")
def oracle():
    registry = ModelRegistry.from_yaml(POOL)
    world = SimWorld(seed=0)
    o = AlphaOracle(SimBackend.from_pool_yaml(POOL, seed=0, latency_scale=0.0, world=world), registry.seen())
    questions = world.questions(200, 0, "train", 0.4)
    o.set_window(alpha0_costs(o, questions))
    return o, questions, registry


def first_plans(o, questions, alpha):
    return [o.plan(q, 0, None, 0.0, set(), alpha, o.max_routes) for q in questions]


def test_planned_cost_and_p_right_fall_at_each_trained_alpha(oracle):
    """Unlike sim.yaml (plans equal up to alpha 0.8), each step 0 -> 0.3 -> 0.6 -> 0.9 changes the best plan of
    over a tenth of the questions, cheaper and less often right; no plan guesses."""
    o, questions, _ = oracle
    shift = plan_shift(o, questions, ALPHAS)
    for lo, hi in zip(ALPHAS, ALPHAS[1:]):
        assert shift[hi]["cost_1e6"] < shift[lo]["cost_1e6"] - 0.3, (lo, hi, shift)
        assert shift[hi]["p_right"] < shift[lo]["p_right"], (lo, hi, shift)
        changed = sum(a.label != b.label for a, b in zip(first_plans(o, questions, lo), first_plans(o, questions, hi)))
        assert changed > 0.1 * len(questions), (lo, hi, changed)
    assert all(shift[a][GUESS] == 0 for a in ALPHAS)


def test_cheap_models_take_over_tier_by_tier(oracle):
    """Alpha 0 asks only the reliable models; at 0.3 the cheap model used is science and business's; at 0.9 all
    three cheap models are, each only on its own domains."""
    o, questions, _ = oracle
    used = {}
    for a in ALPHAS:
        used[a] = {}
        for q, p in zip(questions, first_plans(o, questions, a)):
            if p.kind == "hops":
                for hop, m in zip(q.hops, p.models):
                    used[a].setdefault(m, set()).add(hop.domain)
    assert not set(CHEAP) & set(used[0.0])
    assert set(CHEAP) & set(used[0.3]) == {"Qwen2.5-1.5B-Instruct"}
    assert set(CHEAP) <= set(used[0.9])
    for m, domains in CHEAP.items():
        assert used[0.9][m] <= set(domains), (m, used[0.9][m])


def test_descriptors_name_the_cheap_models_domains(oracle):
    """The words match the sim: each cheap model's descriptor names its two domains and says it is cheap."""
    *_, registry = oracle
    assert not any(s.unseen for s in registry.models.values())
    for name, domains in CHEAP.items():
        spec = registry.models[name]
        text = spec.descriptor.lower()
        assert "cheap" in text and all(d.rstrip("s") in text for d in domains), name
        assert spec.price_out_per_m < min(registry.models[r].price_out_per_m for r in
                                          ("Qwen2.5-7B-Instruct", "LLaMA-3.1-8B-Instruct", "Mistral-7B-Instruct"))
