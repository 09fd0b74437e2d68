"""Entity renaming of the SFT data (--rename): consistent, same kind, routes untouched, off by default."""
import random
import re

from data_process.name_swap import NameClasses, apply
from data_process.sim_oracle import main as oracle_main
from router_r1.pool.sim_world import SimWorld
from verl.trainer.sft_data import load_rows

WORLD = SimWorld(seed=0, n_entities_per_type=20)


def test_apply_renames_whole_words_at_once():
    # a chained rename (A -> B, B -> C) would turn A into C; whole words only
    assert apply({"Velo": "Duna", "Duna": "Kiro"}, "Velo met Duna at Velomar.") == "Duna met Kiro at Velomar."


def test_mapping_is_one_to_one_and_keeps_kinds():
    classes = NameClasses.from_world(WORLD)
    person = WORLD.by_type["person"][0]
    element = WORLD.by_type["element"][0]
    company = WORLD.by_type["company"][0]
    text = f"{person} discovered {element}; {company} was founded by {person}."
    names = classes.mapping([text], random.Random(0), {})
    assert set(names) == {*person.split(), element, company.split()[0]}  # the suffix ("Works") stays
    assert len(set(names.values())) == len(names)
    assert classes.by_word[names[element]] == "element"
    assert all(classes.by_word[names[w]] == "stem" for w in person.split())
    out = apply(names, text)
    assert company.split()[-1] in out and person not in out and element not in out


def test_reserved_words_are_never_renamed():
    stem = WORLD.by_type["city"][0]
    classes = NameClasses.from_world(WORLD, reserved={stem})
    assert stem not in classes.by_word
    assert classes.mapping([f"Where is {stem}?"], random.Random(0), {}) == {}


def test_rename_spreads_copies_over_the_lexicon(tmp_path):
    common = ["--n", "300", "--noise", "0.05", "--no-tokenizer", "--world-entities", "40"]
    assert oracle_main(["--out-dir", str(tmp_path / "plain"), *common]) == 0
    assert oracle_main(["--out-dir", str(tmp_path / "renamed"), *common, "--rename", "1"]) == 0
    plain, renamed = load_rows(tmp_path / "plain" / "oracle.parquet"), load_rows(tmp_path / "renamed" / "oracle.parquet")
    assert not any(r["renamed"] for r in plain) and all(r["renamed"] for r in renamed)
    stems = set(NameClasses.from_world(SimWorld(seed=0, n_entities_per_type=40)).words["stem"])

    def written(rows):  # stems the policy itself writes (sub-questions, answers): what copying trains
        return {w for r in rows for s in r["segments"] if s["by_policy"] for w in re.findall(r"\w+", s["text"])} & stems
    # the renaming draws each stem once before any twice: nearly all ~400 are written, against ~3/4 without
    assert len(written(renamed)) > 0.95 * len(stems) > len(written(plain)) / 0.85
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
