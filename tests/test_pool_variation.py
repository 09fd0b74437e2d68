"""Varied pool listings in the oracle's SFT rows (--vary-pool, sim/warm_start/pool_variation.py).

Each varied row lists its own models (subset, order, names, prices); its routes must name a listed model,
the oracle's first ask per hop must be the cheapest listed line naming the hop's domain, every shown name
must resolve to its profile's backend, and the unseen model's name must be a frozen whole token.
"""
import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sim.warm_start.build import build_rows, own_template
from sim.warm_start.cli import main as oracle_main
from sim.warm_start.pool_variation import (Line, Listing, PoolVariation, canonical_listing, name_bank,
                                           strong_domains)
from sim.warm_start.recipe import make_recipe
from sim.embedded import compact_pool_text
from router_r1.pool.registry import ModelRegistry, normalize_name
from sim.backend import SimBackend
from sim.world import DOMAINS
from router_r1.pool.messages import submodel_messages

ROOT = Path(__file__).resolve().parents[1]
UNSEEN = ROOT / "configs" / "pool" / "sim_unseen.yaml"
LINE = re.compile(r"^(\S+) \$([0-9.]+): (.+)$", re.M)
ASK = re.compile(r"A (\w+) fact\. Ask (\S+)\.</think><search>\2: ([^<]+)</search>\s*<information>([^<]*)</information>")


def varied_rows(tmp_path, n=60, share=1.0, **kw):
    Path(tmp_path).mkdir(parents=True, exist_ok=True)
    recipe = make_recipe(out_dir=tmp_path, n=n, noise=0.0, pool=UNSEEN, vary_pool=share, tokenizer=False, **kw)
    return build_rows(recipe, own_template(Path(tmp_path), None))[0]


def listed(row) -> dict[str, tuple[float, str]]:
    return {name: (float(price), topics) for name, price, topics in LINE.findall(row["listing"])}


def test_rows_list_varied_pools_and_route_to_the_cheapest_listed_model_naming_the_domain(tmp_path):
    rows = varied_rows(tmp_path)
    listings = [r["listing"] for r in rows]
    assert all(listings) and len(set(listings)) == len(rows)  # every row its own pool
    sizes = {len(listed(r)) for r in rows}
    assert len(sizes) >= 3  # subsets of several sizes
    assert len({tuple(sorted(listed(r))) for r in rows}) == len(rows)  # names vary, not only order
    backend = SimBackend.from_pool_yaml(UNSEEN)
    full = ModelRegistry.from_yaml(UNSEEN)
    rivals = 0
    for r in rows:
        lines = listed(r)
        prompt = r["prompt"][-1]["content"]
        assert r["listing"] in prompt and "SciGLM" not in prompt  # the unseen model is never listed in training
        assert set(r["route_models"]) <= set(lines)  # every call names a listed model
        asks = ASK.findall(r["response_text"])
        assert asks, r["response_text"]
        domain, model, query, reply = asks[0]  # the first ask of the first hop (retries say "No answer")
        naming = {m: p for m, (p, topics) in lines.items() if domain in topics.split(", ")}
        assert model == min(naming, key=naming.get), (domain, model, lines)
        rivals += sum(1 for d in DOMAINS if sum(d in t.split(", ") for _, t in lines.values()) > 1) > 0
        # the shown name is answered by its profile's expert: the observation is that expert's reply
        spec = full[r["route_profiles"][0]]
        assert backend.respond(spec.api_id, submodel_messages(query), spec.max_tokens)[0].strip() == reply.strip()
    assert rivals > len(rows) // 3  # two listed lines naming one domain at different prices are common


def test_vary_pool_keeps_questions_and_noise_and_a_share_keeps_the_pools_own_listing(tmp_path):
    plain = varied_rows(tmp_path / "a", n=80, share=0.0)
    half = varied_rows(tmp_path / "b", n=80, share=0.5)
    assert [r["question"] for r in plain] == [r["question"] for r in half]
    assert [r["mode"] for r in plain] == [r["mode"] for r in half]
    kept = [(p, h) for p, h in zip(plain, half) if not h["listing"]]
    assert 20 < len(kept) < 60
    assert all(p["prompt"] == h["prompt"] and p["response_text"] == h["response_text"] for p, h in kept)
    assert not any(r["listing"] for r in plain)


def test_listing_choice_names_resolution_and_the_unseen_specialist():
    full = ModelRegistry.from_yaml(UNSEEN)
    seen = full.seen()
    assert canonical_listing(seen).text == compact_pool_text(seen)
    # the pool's own listing picks the oracle's specialists, and with the unseen line SciGLM-6B for science
    assert {d: s.name for d, s in canonical_listing(seen).choices().items()}["science"] == "Qwen2.5-7B-Instruct"
    assert canonical_listing(full).choice("science").name == "SciGLM-6B"
    assert canonical_listing(full).choice("business").name == "Qwen2.5-7B-Instruct"
    bank = name_bank(reserved=set(full.names))
    variation = PoolVariation(seen, bank)
    rng = random.Random(3)
    for _ in range(50):
        listing = variation.draw(rng)
        reg = listing.registry
        for line in listing.lines:
            assert line.spec.name in bank
            assert reg.resolve(line.spec.name).api_id == seen[line.profile].api_id  # the name's backend
            assert set(line.topics) <= set(DOMAINS)
        for d in DOMAINS:
            pick = listing.choice(d)
            naming = [ln for ln in listing.lines if d in ln.topics]
            assert naming and pick.price_out_per_m == min(ln.spec.price_out_per_m for ln in naming)
    gen = seen["Mixtral-8x22B-Instruct"]
    with pytest.raises(ValueError, match="names no model for 'arts'"):
        Listing((Line(seen["Qwen2.5-7B-Instruct"], "Qwen2.5-7B-Instruct", ("science",)),)).choice("arts")
    assert Listing((Line(gen, gen.name, ()),)).choice("arts") is gen  # no line names it: the generalist


def test_name_bank_is_distinct_and_avoids_reserved_words():
    bank = name_bank(50, reserved={"Kavo"})
    assert len(bank) == 50 and len({b.lower().replace("-", "") for b in bank}) == 50
    assert not any(b.split("-")[0] == "Kavo" for b in bank)
    assert bank == name_bank(50, reserved={"Kavo"})  # deterministic: the tokenizer and the data agree
    with pytest.raises(ValueError, match="too small"):
        PoolVariation(ModelRegistry.from_yaml(UNSEEN).seen(), bank[:3])


def test_every_model_name_is_one_token_and_a_new_name_gets_a_row_like_the_routed_ones(tmp_path, capsys):
    import pandas as pd
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    oracle = tmp_path / "oracle"
    assert oracle_main(["--out-dir", str(oracle), "--pool", str(UNSEEN), "--n", "24", "--vary-pool", "1",
                        "--vocab-size", "300", "--whole-names", "--model",
                        '{"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1}']) == 0
    tok = AutoTokenizer.from_pretrained(oracle / "tokenizer")
    rows = pd.read_parquet(oracle / "oracle.parquet")
    for name in [*listed(rows.iloc[0]), "SciGLM-6B"]:  # the bank's names and the unseen one: whole tokens
        assert tok.tokenize(name) == [name]
    spec = json.loads((oracle / "model.json").read_text())
    spec.pop("model_type")
    ckpt = tmp_path / "sft"
    AutoModelForCausalLM.from_config(LlamaConfig(**spec)).save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    new = tmp_path / "new"
    script = [sys.executable, "-m", "tools.analysis.new_model_names", "--checkpoint", str(ckpt),
              "--like", str(oracle / "oracle.parquet"), "--out", str(new)]
    done = subprocess.run(script + ["--names", "SciGLM-6B"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    before = AutoModelForCausalLM.from_pretrained(ckpt).get_input_embeddings().weight.detach()
    after = AutoModelForCausalLM.from_pretrained(new).get_input_embeddings().weight.detach()
    sci = tok.convert_tokens_to_ids("SciGLM-6B")
    changed = (before != after).any(1).nonzero().flatten().tolist()
    assert changed == [sci]  # only the new name's row; the head is tied to it
    routed = [tok.convert_tokens_to_ids(m) for m in {m for r in rows["route_models"] for m in r}]
    assert torch.allclose(after[sci].mean(), before[routed].mean(), atol=3 * before[routed].std().item())
    taken = rows["route_models"].iloc[0][0]  # a routed name is not new: refused, nothing written
    bad = subprocess.run(script[:-2] + ["--out", str(tmp_path / "bad"), "--names", taken], capture_output=True, text=True)
    assert bad.returncode == 1 and f"{taken} appear(s) in the routes" in bad.stderr
    assert not (tmp_path / "bad").exists()


def test_bad_vary_pool_values_are_errors(tmp_path, capsys):
    assert oracle_main(["--out-dir", str(tmp_path), "--n", "5", "--vary-pool", "1.5", "--no-tokenizer"]) == 1
    assert "--vary-pool must be in [0, 1], got 1.5" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--vary-pool", "--add-rival"])
def test_a_row_listing_refuses_a_prompt_template(tmp_path, capsys, flag):
    template = tmp_path / "t.txt"
    template.write_text("Models:\nX $1: all\nQuestion: {question}\n")
    assert oracle_main(["--out-dir", str(tmp_path), "--n", "5", flag, "0.5", "--prompt-template", str(template),
                        "--no-tokenizer"]) == 1
    assert f"{flag} lists each row's own pool in the compact template: drop --prompt-template" in \
        capsys.readouterr().err


def rival_rows(tmp_path, n=60, **kw):
    Path(tmp_path).mkdir(parents=True, exist_ok=True)
    recipe = make_recipe(out_dir=tmp_path, n=n, noise=0.0, pool=UNSEEN, tokenizer=False, **kw)
    return build_rows(recipe, own_template(Path(tmp_path), None))[0]


def test_with_rival_adds_one_bank_line_to_the_pools_own_listing_picked_iff_cheaper():
    seen = ModelRegistry.from_yaml(UNSEEN).seen()
    own = canonical_listing(seen)
    bank = name_bank(reserved=set(seen.names))
    variation = PoolVariation(seen, bank)
    rng, cheaper, draws, places = random.Random(5), 0, 400, set()
    for _ in range(draws):
        listing = variation.with_rival(own, rng)
        assert len(listing.lines) == len(own.lines) + 1
        rival = [ln for ln in listing.lines if ln not in own.lines]
        assert len(rival) == 1 and rival[0].spec.name in bank
        places.add(listing.lines.index(rival[0]))
        assert tuple(ln for ln in listing.lines if ln is not rival[0]) == own.lines  # the others, in order
        line = rival[0]
        assert line.topics and set(line.topics) <= set(strong_domains(seen[line.profile]))
        assert listing.registry.resolve(line.spec.name).api_id == seen[line.profile].api_id
        below = [line.spec.price_out_per_m < own.choice(d).price_out_per_m for d in line.topics]
        assert all(below) or not any(below)  # under every pick of its topics or over them all
        for d in line.topics:
            assert (listing.choice(d) is line.spec) == below[0]
        cheaper += below[0]
    assert 0.62 < cheaper / draws < 0.78  # RIVAL_CHEAPER = 0.7 (+-4 standard errors)
    assert places == set(range(len(own.lines) + 1))  # first, last and everywhere between


def test_a_rival_rows_prompt_is_the_normal_prompt_plus_its_line_and_routes_by_price(tmp_path):
    seen = ModelRegistry.from_yaml(UNSEEN).seen()
    plain = rival_rows(tmp_path / "a", n=60)
    rival = rival_rows(tmp_path / "b", n=60, add_rival=1.0)
    assert [r["question"] for r in plain] == [r["question"] for r in rival]
    undercut = 0
    for p, r in zip(plain, rival):
        lines = listed(r)
        new = [m for m in lines if m not in seen.names]
        assert len(new) == 1 and len(lines) == len(seen.names) + 1
        price, topics = lines[new[0]]
        extra = f"\n{new[0]} ${price:.2f}: {topics}"
        if extra not in r["prompt"][-1]["content"]:
            extra = f"{new[0]} ${price:.2f}: {topics}\n"  # the rival listed first
        assert r["prompt"][-1]["content"].replace(extra, "", 1) == p["prompt"][-1]["content"]
        for domain, model, _query, _reply in ASK.findall(r["response_text"])[:1]:
            naming = {m: pr for m, (pr, t) in lines.items() if domain in t.split(", ")}
            assert model == min(naming, key=naming.get)
            if domain in topics.split(", "):
                cheaper = price < min(pr for m, pr in naming.items() if m != new[0])
                assert (model == new[0]) == cheaper
                if cheaper:  # answered by the rival's profile
                    assert r["route_profiles"][0] != "" and r["route_profiles"][0] in seen.names
                    undercut += 1
    assert undercut >= 5  # the rival takes its domains' hops often


def test_add_rival_zero_gives_the_rows_built_without_it(tmp_path):
    for vary in (0.0, 0.5):
        before = varied_rows(tmp_path / f"a{vary}", n=40, share=vary)
        after = varied_rows(tmp_path / f"b{vary}", n=40, share=vary, add_rival=0.0)
        assert before == after
    seen = set(ModelRegistry.from_yaml(UNSEEN).seen().names)
    mixed = varied_rows(tmp_path / "c", n=40, share=0.5, add_rival=0.5)
    assert all(r["listing"] for r in mixed)  # every row varied or with a rival
    with_rival = sum(seen < set(listed(r)) for r in mixed)  # the pool's own names, and one more
    assert 8 < with_rival < 32


def test_bad_add_rival_values_are_errors(tmp_path, capsys):
    for args in (["--add-rival", "-0.1"], ["--add-rival", "0.6", "--vary-pool", "0.5"]):
        assert oracle_main(["--out-dir", str(tmp_path), "--n", "5", "--no-tokenizer", *args]) == 1
        assert "--add-rival must be >= 0 with --vary-pool + --add-rival <= 1" in capsys.readouterr().err


def test_bank_size_sets_how_many_made_up_names_the_rival_lines_draw_from(tmp_path):
    names = {}
    for size in (96, 1000):
        got = rival_rows(tmp_path / str(size), n=300, add_rival=1.0, bank_size=size)
        seen = set(ModelRegistry.from_yaml(UNSEEN).seen().names)
        names[size] = {m for r in got for m in listed(r) if m not in seen}
    assert len(names[96]) <= 96 < len(names[1000])  # 300 draws from 1000 names: mostly distinct


def test_a_styled_bank_has_real_model_name_shapes_and_stays_distinct():
    plain, styled = name_bank(300), name_bank(300, styled=True)
    assert all(re.fullmatch(r"[A-Z][a-z]+-\d+B", n) for n in plain)
    shapes = {"instruct": r"[A-Z][a-z]+[\d.]+-\d+B-Instruct", "caps": r"[A-Z]+-\d+B", "lm": r"[A-Z][a-z]+LM-\d+B",
              "chat": r"[A-Z][a-z]+-\d+B-Chat", "plain": r"[A-Z][a-z]+-\d+B"}
    counts = {k: sum(bool(re.fullmatch(p, n)) for n in styled) for k, p in shapes.items()}
    assert all(c > 20 for c in counts.values()), counts  # every shape, each often
    assert sum(counts.values()) == len(styled)  # and no other
    assert len({normalize_name(n) for n in styled}) == len(styled) and styled == name_bank(300, styled=True)
    stem = plain[0].split("-")[0]  # a reserved word is no name's stem, in any shape
    assert not [n for n in name_bank(300, reserved={stem}, styled=True) if n.lower().startswith(stem.lower())]


@pytest.mark.parametrize("cheaper", [0.0, 1.0])
def test_rival_cheaper_sets_which_side_of_the_pick_a_rival_line_is_priced(cheaper):
    seen = ModelRegistry.from_yaml(UNSEEN).seen()
    own = canonical_listing(seen)
    variation = PoolVariation(seen, name_bank(reserved=set(seen.names)), rival_cheaper=cheaper)
    rng = random.Random(0)
    for _ in range(40):
        listing = variation.with_rival(own, rng)
        (rival,) = [ln for ln in listing.lines if ln.spec.name not in seen.names]
        picks = [own.choice(d).price_out_per_m for d in rival.topics]
        assert (rival.spec.price_out_per_m < min(picks)) if cheaper else (rival.spec.price_out_per_m > max(picks))
    with pytest.raises(ValueError, match="rival_cheaper"):
        PoolVariation(seen, name_bank(), rival_cheaper=1.5)
