"""Pool listings as users have them (issue 44, item 1): a one-line model card per model in the pool yaml, the card
listing (name, input and output price, card; no domains) beside the domain listing, each a template placeholder
filled from the pool in use, and the warm start's --listing so SFT and RL prompts agree."""
from pathlib import Path

import pandas as pd
import pytest
import yaml

from router_r1.pool.listing import card_line, render, styles_in
from router_r1.pool.registry import ModelRegistry, RegistryError
from router_r1.prompts import build_router_prompt, with_pool
from router_r1.runtime import template_pattern
from sim.embedded import compact_pool_text
from sim.qa import SimConfig, build_sim
from sim.warm_start.build import build_rows, own_template
from sim.warm_start.recipe import make_recipe
from sim.world import DOMAINS

REPO = Path(__file__).resolve().parents[1]
POOLS = REPO / "configs" / "pool"
SIM = POOLS / "sim.yaml"
SEEN = ["Qwen2.5-7B-Instruct", "LLaMA-3.1-8B-Instruct", "LLaMA-3.1-70B-Instruct", "Mistral-7B-Instruct",
        "Mixtral-8x22B-Instruct", "Gemma-2-27B-Instruct"]
# the public facts each card line states: family, parameters, context length
FACTS = {"Qwen2.5-7B-Instruct": ("Qwen2.5", "7.6B", "128K"), "LLaMA-3.1-8B-Instruct": ("Llama 3.1", "8B", "128K"),
         "LLaMA-3.1-70B-Instruct": ("Llama 3.1", "70B", "128K"), "Mistral-7B-Instruct": ("Mistral 7B", "7.3B", "32K"),
         "Mixtral-8x22B-Instruct": ("Mixtral", "141B", "64K"), "Gemma-2-27B-Instruct": ("Gemma 2", "27B", "8K")}
TOPIC_WORDS = set(DOMAINS) | {"topics"}


@pytest.fixture(scope="module")
def seen():
    return ModelRegistry.from_yaml(SIM).seen()


def test_the_sim_pool_s_six_models_carry_a_model_card_line(seen):
    assert seen.names == SEEN
    for name, (family, size, context) in FACTS.items():
        card = seen[name].card
        assert family in card and f"{size} parameters" in card and f"{context} context" in card, card
        assert "instruction-tuned general assistant" in card
        assert not TOPIC_WORDS & set(card.replace(",", " ").split()), card  # a card says nothing of the world


def test_the_pools_that_repeat_sim_yaml_s_models_repeat_their_cards(seen):
    for name in ("sim_unseen", "sim_probe", "paper"):
        other = ModelRegistry.from_yaml(POOLS / f"{name}.yaml")
        assert all(other[n].card == seen[n].card for n in SEEN), name


def test_the_card_listing_shows_name_prices_and_card_and_no_domains(seen):
    lines = render("card", seen).splitlines()
    assert lines[0] == ("Qwen2.5-7B-Instruct $0.30 in $0.30 out: Alibaba Qwen2.5, 7.6B parameters, "
                        "instruction-tuned general assistant, 128K context")
    assert [ln.split(" $")[0] for ln in lines] == SEEN
    assert not any(TOPIC_WORDS & set(ln.replace(",", " ").replace(":", " ").split()) for ln in lines)
    priced = ModelRegistry.from_dict({"models": [{"name": "A", "api_id": "a", "price_in_per_m": 0.1,
                                                  "price_out_per_m": 0.035, "card": "Acme, 3B parameters"}]})
    assert card_line(priced["A"]) == "A $0.10 in $0.035 out: Acme, 3B parameters"


def test_the_domain_listing_is_today_s_compact_one(seen):
    assert render("domains", seen) == compact_pool_text(seen)
    assert render("domains", seen).splitlines()[0] == "Qwen2.5-7B-Instruct $0.30: science, business"


def test_a_pool_without_a_world_lists_its_topics_field_or_name_and_price_only():
    real = ModelRegistry.from_dict({"models": [
        {"name": "Own-A", "api_id": "a", "price_out_per_m": 0.5, "topics": "law, medicine"},
        {"name": "Own-B", "api_id": "b", "price_out_per_m": 2}]})
    assert render("domains", real) == "Own-A $0.50: law, medicine\nOwn-B $2.00"
    assert render("card", real) == "Own-A $0.00 in $0.50 out\nOwn-B $0.00 in $2.00 out"


@pytest.mark.parametrize("key, value", [("card", "line one\nline two"), ("topics", ["science"])])
def test_a_card_or_topics_that_is_not_one_line_names_file_and_model(tmp_path, key, value):
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump({"models": [{"name": "M", "api_id": "m", "price_out_per_m": 1, key: value}]}))
    with pytest.raises(RegistryError, match=rf"pool.yaml: models\[0\] \(M\): {key} must be one line"):
        ModelRegistry.from_yaml(path)


def test_the_template_placeholder_lists_the_pool_each_prompt_is_built_with(seen):
    """One template, two pools: each prompt lists its own pool, in the template's style."""
    template = "Models:\n{pool_card}\nQuestion: {question}\n"
    other = ModelRegistry.from_dict({"models": [{"name": "Own-A", "api_id": "a", "price_out_per_m": 0.5,
                                                 "card": "Acme, 3B parameters"}]})
    mine = build_router_prompt("Who?", seen, template)[0]["content"]
    theirs = build_router_prompt("Who?", other, template)[0]["content"]
    assert render("card", seen) in mine and "Own-A" not in mine
    assert theirs == "Models:\nOwn-A $0.00 in $0.50 out: Acme, 3B parameters\nQuestion: Who?\n"
    assert styles_in(template) == ["card"] and styles_in("{pool_domains} {question}") == ["domains"]
    assert template_pattern(template).fullmatch(theirs)  # evaluation reads such a prompt as built from it
    # one pass: a question that writes a placeholder is not filled
    assert "{pool_domains}" in build_router_prompt("What is {pool_domains}?", seen, template)[0]["content"]


def _rows(tmp_path, **values):
    tmp_path.mkdir(exist_ok=True)
    recipe = make_recipe(out_dir=str(tmp_path), n=20, tokenizer=False, **values)
    template = own_template(tmp_path, None, recipe.listing_style.listing)
    return template, build_rows(recipe, template).rows


def test_the_warm_start_writes_the_card_listing_and_sim_qa_prompts_agree(tmp_path, seen):
    template, rows = _rows(tmp_path / "oracle", listing="card", rename=1.0)
    kept = template.read_text()
    assert "{pool_card}" in kept and "{pool_domains}" not in kept  # the placeholder, filled where it is used
    listing = render("card", seen)
    for r in rows:
        content = r["prompt"][0]["content"]
        assert listing in content and ": science, business" not in content
    build_sim(SimConfig(out_dir=tmp_path / "data", prompt_template=template, train_size=4, val_size=1, test_size=1))
    for r in pd.read_parquet(tmp_path / "data" / "train.parquet")["prompt"]:
        assert listing in r[0]["content"]  # RL's prompts list the pool as SFT's did
    assert with_pool(kept, seen) == kept.replace("{pool_card}", listing)


def test_the_default_listing_stays_the_domain_one(tmp_path, seen):
    template, rows = _rows(tmp_path)
    assert "{pool_domains}" in template.read_text()
    assert all(compact_pool_text(seen) in r["prompt"][0]["content"] for r in rows)


@pytest.mark.parametrize("values, words", [
    ({"vary_pool": 0.5}, "--vary-pool reads them from the listing"),
    ({"think_candidates": True}, "--think-candidates reads them"),
    ({"prompt_template": str(REPO / "configs" / "prompts" / "compact.txt")}, "drop --prompt-template"),
    ({"pool": str(POOLS / "sim_unseen.yaml")}, None),  # its six seen models have cards: fine
    ({"listing": "cards"}, "--listing must be one of domains, card"),
])
def test_the_card_listing_refuses_what_reads_domains_from_the_listing(values, words):
    values = {"listing": "card", **values}
    if words is None:
        make_recipe(out_dir="x", **values)
        return
    with pytest.raises(ValueError) as e:
        make_recipe(out_dir="x", **values)
    assert words in str(e.value)


def test_the_card_listing_needs_a_card_for_every_seen_model(tmp_path):
    doc = yaml.safe_load(SIM.read_text())
    del doc["models"][1]["card"]
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ValueError, match="has no `card` line for LLaMA-3.1-8B-Instruct"):
        make_recipe(out_dir="x", pool=str(path), listing="card")
