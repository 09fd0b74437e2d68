"""Entity renaming of the SFT data (--rename): consistent, same kind, routes untouched, off by default."""
import random
import re

from sim.warm_start.cli import main as oracle_main
from sim.warm_start.name_swap import EntityNames, apply
from sim.world import SimWorld
from verl.trainer.sft_data import load_rows

WORLD = SimWorld(seed=0, n_entities_per_type=20)
WORLD40 = SimWorld(seed=0, n_entities_per_type=40)


def test_apply_renames_whole_words_at_once():
    # a chained rename (A -> B, B -> C) would turn A into C; whole words only
    assert apply({"Velo": "Duna", "Duna": "Kiro"}, "Velo met Duna at Velomar.") == "Duna met Kiro at Velomar."


def test_mapping_is_one_to_one_and_keeps_types_and_aliases():
    names = EntityNames.from_world(WORLD)
    person, element, company = (WORLD.by_type[t][0] for t in ("person", "element", "company"))
    last = WORLD.entities[person].aliases[0]
    text = f"{person} discovered {element}; {company} was founded by {person}. {last} is famous."
    mapping = names.mapping([text], random.Random(0), {})
    assert {person, element, company} <= set(mapping)
    assert len(set(mapping.values())) == len(mapping)
    assert all(names.type_of[new] == names.type_of[old] for old, new in mapping.items())
    new_person = mapping[person]
    assert mapping[last] == WORLD.entities[new_person].aliases[0]  # the alias follows its entity
    out = apply(mapping, text)
    assert out == (f"{new_person} discovered {mapping[element]}; {mapping[company]} was founded by {new_person}. "
                   f"{mapping[last]} is famous.")


def test_decks_use_every_name_before_any_twice():
    names, decks, rng = EntityNames.from_world(WORLD), {}, random.Random(1)
    cities = names.by_type["city"]
    drawn = [names.mapping([cities[0]], rng, decks)[cities[0]] for _ in range(len(cities) - 1)]
    assert len(set(drawn)) == len(drawn)  # the first pass through the deck repeats nothing


def test_reserved_words_are_never_renamed():
    city = WORLD.by_type["city"][0]
    names = EntityNames.from_world(WORLD, reserved={city})
    assert city not in names.type_of
    assert names.mapping([f"Where is {city}?"], random.Random(0), {}) == {}


def test_rename_spreads_copies_over_the_lexicon(tmp_path):
    common = ["--n", "300", "--noise", "0.05", "--no-tokenizer", "--world-entities", "40"]
    assert oracle_main(["--out-dir", str(tmp_path / "plain"), *common]) == 0
    assert oracle_main(["--out-dir", str(tmp_path / "renamed"), *common, "--rename", "1"]) == 0
    plain, renamed = load_rows(tmp_path / "plain" / "oracle.parquet"), load_rows(tmp_path / "renamed" / "oracle.parquet")
    assert not any(r["renamed"] for r in plain) and all(r["renamed"] for r in renamed)
    people = set(WORLD40.by_type["person"])

    def written(rows):  # people the policy itself names (sub-questions, answers): what copying trains
        return {p for r in rows for s in r["segments"] if s["by_policy"] for p in people if p in s["text"]}
    # the renaming draws each person once before any twice: nearly all 120 are written, ~3/4 without
    assert len(written(renamed)) >= 0.95 * len(people) > len(written(plain)) + 15  # 119 and 92 of 120 today
    for p, r in zip(plain, renamed):
        # same question shape, same routes and cost, same correctness; names differ and stay consistent
        assert list(p["route_models"]) == list(r["route_models"]) and p["cost_usd"] == r["cost_usd"]
        assert p["em"] == r["em"] and p["domain"] == r["domain"]
        assert re.sub(r"[A-Z]\w*", "X", p["question"]) == re.sub(r"[A-Z]\w*", "X", r["question"])
        assert r["question"] in r["prompt"][-1]["content"] and p["question"] not in r["prompt"][-1]["content"]
        if r["em"]:
            assert r["response_text"].endswith(f"<answer>{r['answers'][0]}</answer>")


def test_rename_share_is_checked(tmp_path, capsys):
    assert oracle_main(["--out-dir", str(tmp_path), "--n", "10", "--no-tokenizer", "--rename", "1.5"]) == 1
    assert "--rename must be in [0, 1], got 1.5" in capsys.readouterr().err


def test_whole_names_are_one_token(tmp_path):
    from transformers import AutoTokenizer

    assert oracle_main(["--out-dir", str(tmp_path), "--n", "100", "--noise", "0", "--world-entities", "20",
                        "--whole-names", "--rename", "1"]) == 0
    tok = AutoTokenizer.from_pretrained(tmp_path / "tokenizer")
    person, company = WORLD.by_type["person"][3], WORLD.by_type["company"][3]
    ids = tok(f"{company} was founded by {person}.", add_special_tokens=False)["input_ids"]
    pieces = [tok.decode([i]) for i in ids]
    assert company in pieces and person in pieces  # each a single token, not word, space, word
    assert tok.decode(ids) == f"{company} was founded by {person}."
    last = WORLD.entities[person].aliases[0]
    assert last in [tok.decode([i]) for i in tok(f"Ask about {last}.", add_special_tokens=False)["input_ids"]]
    assert oracle_main(["--out-dir", str(tmp_path / "x"), "--n", "10", "--world-entities", "20",
                        "--whole-names", "--no-name-tokens"]) == 1
