"""The uniform-routes annotator (sim/warm_start/uniform.py, configs/recipes/uniform_routes.yaml): every row routes,
in the oracle's format, to models drawn uniformly among the listed ones, whatever the hop's domain."""
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from router_r1.pool.registry import ModelRegistry
from router_r1.reward.format import check_format
from sim.warm_start.build import build_rows, own_template
from sim.warm_start.recipe import from_sections, load_sections, make_recipe

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs" / "recipes" / "uniform_routes.yaml"


def uniform_rows(tmp_path, n: int):
    sections = load_sections(RECIPE)
    sections["build"].update(n=n, tokenizer=False, out_dir=str(tmp_path))
    recipe = from_sections(sections)
    return recipe, build_rows(recipe, own_template(tmp_path, None)).rows


def test_uniform_rows_route_every_hop_to_a_uniformly_drawn_model_in_the_oracles_format(tmp_path):
    recipe, rows = uniform_rows(tmp_path, 600)
    registry = ModelRegistry.from_yaml(recipe.build.pool).seen()
    for r in rows:  # well formed: routes, then an answer, every route to a listed model
        ok, why = check_format(r["response_text"], registry)
        assert ok, (why, r["response_text"])
        assert r["mode"] == "uniform" and r["routes"] >= 1 and r["routes"] == len(r["route_models"]) <= 3
        assert set(r["route_models"]) <= set(registry.names)
        assert r["response_text"].startswith("<think>A ") and r["response_text"].rstrip().endswith("</answer>")
    routes = Counter(m for r in rows for m in r["route_models"])
    n, k = sum(routes.values()), len(registry.names)
    assert n > 800 and set(routes) == set(registry.names)
    assert all(abs(c / n - 1 / k) < 0.04 for c in routes.values()), routes  # 1/6 each; the sd of a share is 0.012
    # nothing of who knows what: a domain's specialist gets its hops no more often than any other model
    science = Counter(r["route_models"][0] for r in rows if r["domain"] == "science" and r["data_source"] == "sim_1hop")
    assert science["Qwen2.5-7B-Instruct"] / sum(science.values()) < 0.3, science
    # the replies are the world's: right where the drawn model knew, so well below the oracle's 0.95
    assert 0.4 < sum(r["em"] for r in rows) / len(rows) < 0.9


def test_the_oracle_stays_the_default_route_source(tmp_path):
    """Without the annotator section the recipe is the hop oracle's (tests/test_warm_start.py pins its rows)."""
    sections = load_sections("default")
    assert "annotator" not in sections and from_sections(sections).annotator.routes == "oracle"
    recipe, _ = uniform_rows(tmp_path, 4)
    assert recipe.annotator.on and not recipe.hop_routes and recipe.build.noise == 0.0


@pytest.mark.parametrize("values, words", [
    ({"routes": "random"}, "--routes must be one of oracle, uniform"),
    ({"routes": "uniform"}, "set --noise 0"),  # the builder's default noise is 0.3
    ({"routes": "uniform", "noise": 0.0, "alphas": [0.3]}, "a recipe takes one"),
    ({"routes": "uniform", "noise": 0.0, "vary_pool": 0.5}, "--vary-pool shapes the hop-by-hop oracle's rows"),
    ({"routes": "uniform", "noise": 0.0, "prefer_big": 0.2}, "habits of the hop-by-hop oracle"),
])
def test_uniform_routes_refuse_what_they_cannot_do(values, words):
    with pytest.raises(ValueError, match=words):
        make_recipe(out_dir="x", **values)


def test_train_sh_builds_and_trains_on_the_uniform_recipe(tmp_path):
    """RECIPE=uniform_routes.yaml bash train.sh, stages 1-3 shrunk: the rows are uniform ones, as many as the recipe's
    n (N_ORACLE unset: train.sh once passed 2,000 over every recipe's n)."""
    text = (ROOT / "configs/recipes/uniform_routes.yaml").read_text()
    assert "\nn: 2000\n" in text
    recipe = tmp_path / "uniform_64.yaml"
    recipe.write_text(text.replace("\nn: 2000\n", "\nn: 64\n"))
    env = {k: v for k, v in os.environ.items() if k != "N_ORACLE"}
    env.update(PYTHON=sys.executable, OUT=str(tmp_path / "run"), RECIPE=str(recipe), SFT_MAX_STEPS="2", SFT_ONLY="1",
               OMP_NUM_THREADS="2")
    proc = subprocess.run(["bash", "train.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "annotator.routes='uniform'" in proc.stdout
    rows = pd.read_parquet(tmp_path / "run" / "oracle" / "oracle.parquet")
    assert len(rows) == 64 and set(rows["mode"]) == {"uniform"} and (rows["routes"] >= 1).all()
    assert (tmp_path / "run" / "sft" / "model.safetensors").exists()


def test_without_think_names_model_the_route_is_the_one_place_a_model_is_named(tmp_path):
    """--no-think-names-model: the think states the domain only, so a policy makes the draw once, at the route."""
    sections = load_sections(RECIPE)
    sections["build"].update(n=200, tokenizer=False, out_dir=str(tmp_path))
    sections["annotator"]["think_names_model"] = False
    recipe = from_sections(sections)
    rows = build_rows(recipe, own_template(tmp_path, None)).rows
    names = ModelRegistry.from_yaml(recipe.build.pool).seen().names
    retried = 0
    for r in rows:
        thinks = [t.split("</think>")[0] for t in r["response_text"].split("<think>")[1:]]
        assert not any(n in t for t in thinks for n in names), r["response_text"]
        assert thinks[0].startswith(f"A {r['domain'] if r['data_source'] == 'sim_1hop' else ''}"), thinks
        retried += any(t == "No answer." for t in thinks)
    assert retried > 0  # the retry after a reply without an answer keeps its short think
    (tmp_path / "named").mkdir()
    _, named = uniform_rows(tmp_path / "named", 50)  # the default still names the drawn model in the think
    assert all(f"Ask {r['route_models'][0]}." in r["response_text"] for r in named)
    with pytest.raises(ValueError, match="add --routes uniform"):
        make_recipe(out_dir="x", think_names_model=False)
