"""The simulated world and its experts: determinism, splits, parsing, and expert behaviour."""
from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

from router_r1.pool.registry import ModelRegistry
from sim.backend import CANT_TELL, SimBackend, SimProfileError
from sim.world import DOMAINS, RELATIONS, SimWorld, count_tokens, truncate_tokens
from router_r1.pool.messages import submodel_messages
from router_r1.reward.qa_em import normalize_answer

ROOT = Path(__file__).resolve().parents[1]
SIM_YAML = ROOT / "configs" / "pool" / "sim.yaml"


@pytest.fixture(scope="module")
def backend() -> SimBackend:
    return SimBackend.from_pool_yaml(SIM_YAML, seed=0, latency_scale=0.0)


@pytest.fixture(scope="module")
def world(backend) -> SimWorld:
    return backend.world


def _ask(backend: SimBackend, api_id: str, query: str) -> str:
    return backend.respond(api_id, submodel_messages(query), max_tokens=512)[0]


def _leads_with(reply: str, answer: str) -> bool:
    """The expert's answer is its first sentence."""
    return reply.startswith(answer + ".")


# ---- world ------------------------------------------------------------------------------

_DIGEST_CODE = """
import hashlib, json, sys
from dataclasses import asdict
from sim.world import SimWorld
w = SimWorld(seed=int(sys.argv[1]), n_entities_per_type=20)
qs = w.questions(60, seed=3, split="train") + w.questions(20, seed=3, split="test")
blob = json.dumps([sorted(w.facts.items()), [asdict(q) for q in qs]], sort_keys=True)
print(hashlib.sha256(blob.encode()).hexdigest())
"""


def _digest_in_subprocess(seed: int, hash_seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", _DIGEST_CODE, str(seed)], env=env, cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_world_is_seed_deterministic_across_processes():
    w = SimWorld(seed=7, n_entities_per_type=20)
    qs = w.questions(60, seed=3, split="train") + w.questions(20, seed=3, split="test")
    here = hashlib.sha256(json.dumps([sorted(w.facts.items()), [asdict(q) for q in qs]],
                                     sort_keys=True).encode()).hexdigest()
    # different string-hash salts must not matter: nothing may depend on hash()
    assert _digest_in_subprocess(7, "1") == here
    assert _digest_in_subprocess(7, "987") == here
    assert _digest_in_subprocess(8, "1") != here


def test_names_are_unique_and_types_have_their_sizes():
    w = SimWorld(seed=1, n_entities_per_type=30)
    keys = [k.lower() for e in w.entities.values() for k in (e.name, *e.aliases)]
    assert len(keys) == len(set(keys))
    assert len(w.by_type["country"]) == 30 and len(w.by_type["city"]) == 90
    assert len(set(w.by_type["symbol"])) == 30
    # every relation has a fact for every entity of its subject type
    for r in RELATIONS.values():
        assert all((r.name, s) in w.facts for s in w.by_type[r.subj])
    # capitals lie in their own country
    for country in w.by_type["country"]:
        assert w.facts[("located_in", w.facts[("capital", country)])] == country


def test_splits_are_disjoint_by_fact_and_well_formed(world):
    train = world.questions(600, seed=0, split="train", two_hop_frac=0.4)
    test = world.questions(300, seed=0, split="test", two_hop_frac=0.4)
    facts = {s: {(h.relation, h.subject) for q in qs for h in q.hops} for s, qs in (("train", train), ("test", test))}
    assert facts["train"] and facts["test"] and not facts["train"] & facts["test"]
    assert not {q.question for q in train} & {q.question for q in test}
    for split, qs in (("train", train), ("test", test)):
        assert len({q.uid for q in qs}) == len(qs) and len({q.question for q in qs}) == len(qs)
        assert sum(len(q.hops) == 2 for q in qs) == round(0.4 * len(qs))
        for q in qs:
            assert q.split == split and q.answers == [q.hops[-1].answer]
            assert q.domain == ">".join(h.domain for h in q.hops)
            for h in q.hops:
                assert world.facts[(h.relation, h.subject)] == h.answer
            if len(q.hops) == 2:
                assert q.hops[1].subject == q.hops[0].answer  # the chain is connected
                assert q.answers[0] not in q.question
    # questions are balanced over relations, not dominated by the big entity types
    rels = [q.hops[0].relation for q in train if len(q.hops) == 1]
    assert len(set(rels)) == len(RELATIONS)
    assert max(rels.count(r) for r in set(rels)) <= 3 * min(rels.count(r) for r in set(rels))


def test_questions_depend_on_seed_and_too_many_is_a_clear_error():
    w = SimWorld(seed=0, n_entities_per_type=10)
    assert [q.question for q in w.questions(20, seed=1)] == [q.question for q in w.questions(20, seed=1)]
    assert [q.question for q in w.questions(20, seed=1)] != [q.question for q in w.questions(20, seed=2)]
    with pytest.raises(ValueError, match="n_entities_per_type"):
        w.questions(5000, split="test")
    with pytest.raises(ValueError, match="split"):
        w.questions(5, split="dev")


def test_every_question_and_hop_parses_to_its_oracle(world):
    qs = world.questions(1500, seed=1, split="train") + world.questions(400, seed=1, split="test")
    for q in qs:
        p = world.parse(q.question)
        assert p is not None and p.entity.name == q.hops[0].subject, q.question
        assert [r.name for r in p.relations] == [h.relation for h in q.hops], q.question
        for h in q.hops:
            ph = world.parse(h.sub_question)
            assert ph.entity.name == h.subject and [r.name for r in ph.relations] == [h.relation], h.sub_question


def test_free_form_queries(world):
    country = world.by_type["country"][0]
    person = world.by_type["person"][0]
    company = world.by_type["company"][0]
    last, stem = world.entities[person].aliases[0], world.entities[company].aliases[0]
    assert [r.name for r in world.parse(f"capital of {country.lower()}??").relations] == ["capital"]
    assert [r.name for r in world.parse(f"{last} birthplace").relations] == ["born_in"]
    assert [r.name for r in world.parse(f"In which country was {person} born?").relations] == ["born_in", "located_in"]
    assert [r.name for r in world.parse(f"founder of {stem}").relations] == ["founder"]
    # the inverse chain reads as the one-hop question it means
    assert [r.name for r in world.parse(f"Which city is the capital of the country {country}?").relations] == ["capital"]
    assert world.parse("What is the capital of Atlantis?") is None
    assert world.parse(f"Tell me about {person}.").relations == ()


def test_count_and_truncate_tokens():
    assert count_tokens("Velmora's capital is Dunmere.") == 7  # Velmora ' s capital is Dunmere .
    assert count_tokens("") == 0
    text = "One, two three. Four!"
    assert truncate_tokens(text, 3) == ("One, two", True)
    assert truncate_tokens(text, 6) == ("One, two three. Four", True)
    assert truncate_tokens(text, 7) == (text, False)
    cut, was_cut = truncate_tokens(text, 4)
    assert was_cut and count_tokens(cut) == 4


# ---- experts -----------------------------------------------------------------------------

def test_pool_matches_the_paper_names_and_prices():
    sim, paper = ModelRegistry.from_yaml(SIM_YAML), ModelRegistry.from_yaml(ROOT / "configs/pool/paper.yaml")
    assert sim.names == paper.names
    for name in sim.names:
        assert sim[name].price_out_per_m == paper[name].price_out_per_m
        assert sim[name].unseen == paper[name].unseen
        assert sim[name].base_url == "http://127.0.0.1:8000/v1"
        assert sim[name].api_id.startswith("sim/")


def test_descriptors_name_exactly_the_specialists_strengths(backend):
    registry = ModelRegistry.from_yaml(SIM_YAML)
    specialists = 0
    for spec in registry.models.values():
        acc = backend.experts[spec.api_id].profile.accuracy
        if max(acc.values()) - min(acc.values()) < 0.3:
            continue  # a generalist: its descriptor speaks of all topics
        specialists += 1
        text = spec.descriptor.lower()
        for dom, a in acc.items():
            assert (dom in text) == (a >= 0.9), (spec.name, dom)
    assert specialists >= 4


def test_oracle_hops_are_answered_by_experts_that_know_them(backend, world):
    qs = world.questions(200, seed=5, split="test")
    checked = 0
    for api_id, expert in backend.experts.items():
        for q in qs:
            for h in q.hops:
                reply = _ask(backend, api_id, h.sub_question)
                if expert.knows(world.fact(h.relation, h.subject)):
                    assert _leads_with(reply, h.answer), (api_id, h.sub_question, reply)
                    assert normalize_answer(h.answer) in normalize_answer(reply)
                    checked += 1
                else:
                    assert not _leads_with(reply, h.answer), (api_id, h.sub_question, reply)
    assert checked > 500


def test_measured_accuracy_matches_the_profile(backend, world):
    for api_id, expert in backend.experts.items():
        for dom in DOMAINS:
            facts = world.all_facts(dom)
            right = sum(_leads_with(_ask(backend, api_id, RELATIONS[f.relation].ask(f.subject)), f.object)
                        for f in facts)
            want = expert.profile.accuracy[dom]
            tol = 4 * math.sqrt(want * (1 - want) / len(facts)) + 0.01
            assert abs(right / len(facts) - want) <= tol, (api_id, dom, right / len(facts), want)


def test_unknown_facts_split_into_admissions_and_hallucinations(backend, world):
    expert = backend.experts["sim/llama-3.1-8b-instruct"]
    unknown = [f for f in world.all_facts("people") if not expert.knows(f)]
    replies = [_ask(backend, "sim/llama-3.1-8b-instruct", RELATIONS[f.relation].ask(f.subject)) for f in unknown]
    admitted = sum(r.startswith("I don't know") for r in replies)
    rate = expert.profile.idk_rate
    assert abs(admitted / len(unknown) - rate) <= 4 * math.sqrt(rate * (1 - rate) / len(unknown)) + 0.01
    for f, r in zip(unknown, replies):
        if not r.startswith("I don't know"):  # a confident wrong entity of the right type
            wrong = r.split(".")[0]
            assert wrong != f.object and wrong in world.by_type[RELATIONS[f.relation].obj]
    # asking again gives the same reply: experts are consistent
    f = unknown[0]
    q = RELATIONS[f.relation].ask(f.subject)
    assert _ask(backend, "sim/llama-3.1-8b-instruct", q) == replies[0]


def test_two_hop_whole_needs_both_facts_and_multi_hop_skill(backend, world):
    qs = [q for q in world.questions(1000, seed=2, split="train", two_hop_frac=1.0)]
    for api_id in ("sim/qwen2.5-7b-instruct", "sim/mixtral-8x22b-instruct-v0.1"):
        expert = backend.experts[api_id]
        both = right_with_both = 0
        for q in qs:
            reply = _ask(backend, api_id, q.question)
            knows_both = all(expert.knows(world.fact(h.relation, h.subject)) for h in q.hops)
            right = _leads_with(reply, q.answers[0])
            assert not (right and not knows_both), (api_id, q.question, reply)
            both += knows_both
            right_with_both += right
        mh = expert.profile.multi_hop
        assert abs(right_with_both / both - mh) <= 4 * math.sqrt(mh * (1 - mh) / both) + 0.01, api_id


def test_decomposing_into_hops_beats_asking_cheap_experts_whole(backend, world):
    cheap = ["sim/qwen2.5-7b-instruct", "sim/llama-3.1-8b-instruct", "sim/mistral-7b-instruct-v0.3"]
    best = {dom: max(cheap, key=lambda a: backend.experts[a].profile.accuracy[dom]) for dom in DOMAINS}
    qs = world.questions(300, seed=4, split="train", two_hop_frac=1.0)
    decomposed = 0
    for q in qs:
        subject = q.hops[0].subject
        for i, h in enumerate(q.hops):  # the router carries each hop's answer into the next
            reply = _ask(backend, best[h.domain], RELATIONS[h.relation].ask(subject))
            subject = reply.split(".")[0]
        decomposed += subject == q.answers[0]
    whole = {a: sum(_leads_with(_ask(backend, a, q.question), q.answers[0]) for q in qs) for a in cheap}
    assert decomposed / len(qs) > 0.8
    assert max(whole.values()) / len(qs) < 0.4


def test_verbose_experts_write_longer_replies(backend, world):
    qs = world.questions(100, seed=6, split="train")
    mean = {a: sum(backend.respond(a, submodel_messages(q.question), 512)[2] for q in qs) / len(qs)
            for a in ("sim/mistral-7b-instruct-v0.3", "sim/gemma-2-27b-it",
                      "sim/mixtral-8x22b-instruct-v0.1", "sim/palmyra-creative-122b")}
    values = list(mean.values())
    assert values == sorted(values) and values[-1] > 3 * values[0]


def test_unparseable_query_gets_a_polite_reply(backend, world):
    assert _ask(backend, "sim/gemma-2-27b-it", "What is the meaning of life?").startswith(CANT_TELL)
    reply = _ask(backend, "sim/mistral-7b-instruct-v0.3", f"Tell me about {world.by_type['city'][3]}.")
    assert "can't tell what you want to know" in reply


def test_max_tokens_truncates_the_reply_and_usage(backend, world):
    q = world.questions(1, seed=0)[0].question
    text, prompt_tokens, completion_tokens = backend.respond("sim/palmyra-creative-122b", submodel_messages(q), 5)
    assert completion_tokens == 5 == count_tokens(text)
    assert prompt_tokens == sum(count_tokens(m["content"]) for m in submodel_messages(q))


def _write_pool(tmp_path: Path, sim: dict) -> Path:
    doc = {"models": [{"name": "M", "api_id": "sim/m", "price_out_per_m": 0.1, "sim": sim}]}
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("sim, field", [
    ({"accuracy": {"default": 1.5}}, "accuracy.geography"),
    ({"accuracy": {"geography": 0.9}}, "'people'"),
    ({"accuracy": {"default": 0.5, "cooking": 0.9}}, "cooking"),
    ({"accuracy": {"default": 0.5}, "multi_hop": "high"}, "multi_hop"),
    ({"accuracy": {"default": 0.5}, "latency": {"median": 1}}, "latency"),
    ({"accuracy": {"default": 0.5}, "charm": 1}, "charm"),
    ({}, "sim"),
])
def test_bad_sim_profile_names_file_model_and_field(tmp_path, sim, field):
    path = _write_pool(tmp_path, sim)
    with pytest.raises(SimProfileError) as e:
        SimBackend.from_pool_yaml(path)
    assert str(path) in str(e.value) and "'M'" in str(e.value) and field in str(e.value)


def test_world_size_reaches_the_data_the_oracle_and_the_pool_server(tmp_path):
    """--world-entities: a bigger world holds more train questions, and data, oracle and pool agree on it."""
    import pandas as pd

    from sim.warm_start.build import run
    from sim.warm_start.recipe import make_recipe
    from sim.qa import SimConfig, draw_questions
    from router_r1.pool.server import _build_backend, _parse_args

    small, big = SimWorld(seed=0, n_entities_per_type=8), SimWorld(seed=0, n_entities_per_type=16)
    with pytest.raises(ValueError, match="n_entities_per_type=8"):
        small.questions(150, split="train", two_hop_frac=0.0)
    assert len(big.questions(150, split="train", two_hop_frac=0.0)) == 150

    server_world = _build_backend(_parse_args(["--latency-scale", "0", "--world-entities", "16"])).world
    assert set(server_world.entities) == set(big.entities) != set(small.entities)
    data = draw_questions(SimConfig(out_dir=tmp_path, world_entities=16, train_size=150, val_size=5, test_size=10,
                                    two_hop_frac=0.0))
    assert len(data["train"]) == 150
    written = run(make_recipe(out_dir=tmp_path / "oracle", n=150, noise=0.0, world_entities=16, two_hop_frac=0.0,
                               tokenizer=False))
    oracle = pd.read_parquet(written["oracle"])
    # its experts know the 16-entity world's facts (in another world they could not tell: EM ~0)
    assert len(oracle) == 150 and oracle["em"].mean() > 0.9
