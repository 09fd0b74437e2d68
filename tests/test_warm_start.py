"""The warm-start builder (sim/warm_start/): recipes, their flags, and rows pinned to the builders it replaced.

The pins are sha256 prefixes of a 40-row build's rows (as JSON, keys sorted), one per recipe. They were equal to the
rows of the three oracle builders this package replaced (data_process/, commit 3f5e27c) given the recipes' flags, so
a drift in the oracle, an augmentation, the world or the prompt fails here. A change that means to
alter the rows updates the pin and says why.
"""
import dataclasses
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim.warm_start.build import BuildConfig, build_rows, own_template
from sim.warm_start.cli import main
from sim.warm_start.recipe import (AUGMENTATIONS, RECIPES, RecipeError, from_sections, load_sections, make_recipe,
                                   parse_args, parser)

ROOT = Path(__file__).resolve().parents[1]
PINS = {"default": "3f08db635f36f249", "alpha": "d4a69fa791bf9ee5", "budget": "33352729960188dc",
        "unseen_fallback": "65b318996f041c1e"}


def small(name: str, tmp_path: Path, n: int = 40):
    """The recipe `name` at n rows without a tokenizer, and its template written under tmp_path."""
    sections = load_sections(name)
    sections.setdefault("build", {}).update(n=n, tokenizer=False, out_dir=str(tmp_path))
    recipe = from_sections(sections)
    return recipe, own_template(tmp_path, None, recipe.listing_style.listing)


@pytest.mark.parametrize("name", sorted(PINS))
def test_each_recipes_rows_are_the_old_builders(tmp_path, name):
    recipe, template = small(name, tmp_path)
    rows = build_rows(recipe, template).rows
    digest = hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16]
    assert digest == PINS[name], f"the {name} recipe's rows drifted (pin {PINS[name]}, now {digest})"


def test_the_default_recipe_is_train_shs_annotator(tmp_path):
    """What the pin stands for: a few slips, every row renamed, the columns the SFT and name tools read."""
    recipe, template = small("default", tmp_path, n=200)
    assert (recipe.build.noise, recipe.names.rename, recipe.names.whole_names) == (0.05, 1.0, True)
    assert (recipe.habits.prefer_big, recipe.habits.confuse) == (0.0, 0.0)
    rows = build_rows(recipe, template).rows
    assert list(rows[0]) == ["data_source", "uid", "prompt", "response_text", "segments", "answers", "question",
                             "domain", "mode", "routes", "renamed", "route_models", "cost_usd", "misnamed", "em",
                             "listing", "route_profiles"]
    modes = [r["mode"] for r in rows]
    assert 0.85 < modes.count("oracle") / len(modes) < 1.0 and not {"big", "confused"} & set(modes)
    assert all(r["renamed"] for r in rows) and sum(r["em"] for r in rows) / len(rows) > 0.8


def test_every_recipe_loads_and_names_only_known_sections():
    names = sorted(p.stem for p in RECIPES.glob("*.yaml"))
    assert set(PINS) <= set(names)
    for name in names:
        recipe = parse_args(["--recipe", name, "--out-dir", "x"])
        assert recipe.changes(), name  # a recipe that changes nothing is the bare builder
        assert set(load_sections(name)) <= {"build", *AUGMENTATIONS}


@pytest.mark.parametrize("text, words", [
    ("noize: 0.1\n", "unknown key 'noize'"),
    ("rename: 1.0\n", "unknown key 'rename' (it belongs in the names section)"),
    ("names:\n  renme: 1.0\n", "names.renme is not a field of names"),
    ("noise: high\n", "noise: expected float, got 'high'"),
    ("per_alpha:\n  alphas: 0.3\n", "per_alpha.alphas: expected a list"),
    ("rivals: 0.8\n", "rivals: expected a mapping"),
])
def test_a_bad_recipe_names_its_file_and_key(tmp_path, capsys, text, words):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError, match="bad.yaml") as e:
        load_sections(path)
    assert words in str(e.value)
    assert main(["--recipe", str(path), "--out-dir", str(tmp_path / "o")]) == 1
    assert words in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_an_unknown_recipe_lists_the_known_ones(capsys):
    assert main(["--recipe", "nonesuch", "--out-dir", "x"]) == 1
    err = capsys.readouterr().err
    assert "recipe nonesuch: no such file" in err and "default" in err and "unseen_fallback" in err


def test_a_flag_overrides_the_recipe_and_an_unset_flag_keeps_it():
    recipe = parse_args(["--recipe", "configs/recipes/default.yaml", "--out-dir", "x", "--noise", "0.2",
                         "--no-whole-names", "--prefer-big", "0.3"])
    assert (recipe.build.noise, recipe.names.whole_names, recipe.habits.prefer_big) == (0.2, False, 0.3)
    assert recipe.names.rename == 1.0 and recipe.build.n == 2000  # the recipe's
    bare = parse_args(["--out-dir", "x"])
    assert bare == make_recipe(out_dir="x") and bare.changes() == []
    assert parse_args(["--out-dir", "x", "--whole-names"]).names.whole_names is True
    alpha = parse_args(["--recipe", "alpha", "--out-dir", "x", "--alphas", "0.6", "--no-each-alpha"])
    assert alpha.per_alpha.alphas == [0.6] and not alpha.per_alpha.each_alpha and alpha.per_alpha.think_alpha


def test_the_builders_own_flags_are_at_most_fifteen():
    own = [a for a in parser()._actions if a.dest in {"recipe", *(f.name for f in dataclasses.fields(BuildConfig))}]
    assert len({a.dest for a in own}) <= 15, [a.option_strings for a in own]
    helps = parser().format_help()
    for cls in AUGMENTATIONS.values():  # each augmentation's fields are flags of their own, documented
        for f in dataclasses.fields(cls):
            assert f.name.replace("_", "-") in helps, f.name


@pytest.mark.parametrize("values, words", [
    ({"alphas": [0.3], "budgets": [1, 2]}, "two route sources"),
    ({"alphas": [0.3], "vary_pool": 0.5}, "--vary-pool shapes the hop-by-hop oracle's rows"),
    ({"budgets": [1], "think_candidates": True}, "--think-candidates shapes the hop-by-hop oracle's rows"),
    ({"budgets": [1], "prefer_big": 0.2}, "habits of the hop-by-hop oracle"),
    ({"alphas": [0.3], "confuse": 0.5}, "habits of the hop-by-hop oracle"),
    ({"budgets": [1], "rename": 1.0}, "turn-budget rows keep their questions' names"),
    ({"each_alpha": True}, "give --alphas"),
    ({"budgets": [2, -1]}, "--budgets must be integers >= 0"),
    ({"n": 0}, "--n must be >= 1"),
    ({"model": "[1]"}, "--model must be a JSON object"),
    ({"confuse_domains": ["people,cooking"]}, "confuse domain 'cooking'"),
])
def test_augmentations_check_each_other(values, words):
    with pytest.raises(ValueError, match=None) as e:
        make_recipe(out_dir="x", **values)
    assert words in str(e.value)


def test_the_cli_runs_as_a_module(tmp_path):
    done = subprocess.run([sys.executable, "-m", "sim.warm_start", "--recipe", "default", "--out-dir", str(tmp_path),
                           "--n", "12", "--no-tokenizer", "--report"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "recipe: build.n=12" in done.stdout and "names.rename=1.0" in done.stdout
    assert "wrote" in done.stdout and "all          n=12" in done.stdout
    assert (tmp_path / "oracle.parquet").exists() and (tmp_path / "prompt_template.txt").exists()
