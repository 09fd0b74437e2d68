"""The embedded default before RL: compact prompt, oracle trajectories, tokenizer, model config.

The oracle's trajectories must be exactly what the RL rollout would build for the same
actions: the test replays their policy turns through the real RouterEnv against the real
simulated pool server and compares token ids and masks one for one.
"""
import json
import re
from pathlib import Path

import pandas as pd
import pytest
import torch
from transformers import AutoTokenizer

from sim.warm_start.build import report
from sim.warm_start.cli import main as oracle_main
from sim.warm_start.oracle import NO_ANSWER, reply_answer
from sim.embedded import (EMBEDDED_MODEL, compact_pool_text, model_topics, render_compact_template,
                                world_words)
from router_r1.pool.client import PoolClient, RouteRequest
from router_r1.pool.registry import ModelRegistry
from router_r1.pool.server import ServerThread
from sim.backend import SimBackend
from sim.world import SimWorld
from router_r1.prompts import build_router_prompt, pool_descriptors, with_pool
from router_r1.actions import TAGS, format_observation, parse_action
from router_r1.reward.format import check_format
from router_r1.reward.qa_em import em_score, extract_answer, normalize_answer
from router_r1.router_env import RouterEnv, RouterEnvConfig
from verl.trainer.dataset import PromptRow
from verl.trainer.sft_data import load_rows, prompt_ids, tokenize_example
from verl.workers.model_loader import load_model
from verl.workers.rollout.base import GenOutput, SamplingParams

SIM = Path(__file__).resolve().parents[1] / "configs" / "pool" / "sim.yaml"
N, SEED = 60, 5
TAGS_FULL = tuple(t for tag in TAGS for t in (f"<{tag}>", f"</{tag}>"))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("embedded")
    assert oracle_main(["--out-dir", str(out), "--n", str(N), "--noise", "0.5", "--seed", str(SEED),
                        "--report", "--vocab-size", "600"]) == 0
    return out


@pytest.fixture(scope="module")
def rows(built):
    return load_rows(built / "oracle.parquet")


@pytest.fixture(scope="module")
def tok(built):
    return AutoTokenizer.from_pretrained(built / "tokenizer")


@pytest.fixture(scope="module")
def registry():
    return ModelRegistry.from_yaml(SIM).seen()


def info_blocks(text):
    return [b.split("</information>")[0] for b in text.split("<information>")[1:]]


# ---------------------------------------------------------------- compact prompt

def test_compact_pool_text_derives_topics_from_sim_profiles(registry):
    lines = compact_pool_text(registry).splitlines()
    assert len(lines) == len(registry)
    by_name = {line.split(" $")[0]: line for line in lines}
    assert by_name["Qwen2.5-7B-Instruct"] == "Qwen2.5-7B-Instruct $0.30: science, business"
    assert by_name["LLaMA-3.1-8B-Instruct"].endswith(": geography, sports")
    assert by_name["Mistral-7B-Instruct"].endswith(": people, arts")
    for name in ("Mixtral-8x22B-Instruct", "LLaMA-3.1-70B-Instruct", "Gemma-2-27B-Instruct"):
        assert by_name[name].endswith(": all topics")
    assert len(compact_pool_text(registry)) < len(pool_descriptors(registry)) / 3


def test_model_topics_branches_and_errors():
    reg = ModelRegistry.from_dict({"models": [
        {"name": "A", "api_id": "a", "price_out_per_m": 1, "sim": {"accuracy": {"default": 0.8, "arts": 0.97}}},
        {"name": "B", "api_id": "b", "price_out_per_m": 1, "sim": {"accuracy": {"default": 0.3}}},
        {"name": "C", "api_id": "c", "price_out_per_m": 1},
        {"name": "D", "api_id": "d", "price_out_per_m": 1, "sim": {"accuracy": {"default": 0.2, "arts": 0.65}}},
        {"name": "E", "api_id": "e", "price_out_per_m": 1,
         "sim": {"accuracy": {"default": 0.2, "arts": 0.95, "science": 0.85, "sports": 0.6}}},
    ]})
    assert model_topics(reg["A"]) == "all topics, best at arts"
    assert model_topics(reg["B"]) == "no strong topic"
    assert model_topics(reg["D"]) == "fair on arts"
    assert model_topics(reg["E"]) == "arts; fair on science, sports"
    with pytest.raises(ValueError, match="'C'.*sim.accuracy"):
        model_topics(reg["C"])


def test_rendered_template_gives_short_prompts_with_the_question(registry, built):
    template = render_compact_template(registry)
    assert "{question}" in template and "{pool}" not in template
    content = build_router_prompt("Who founded Festar Labs?", registry, template)[0]["content"]
    assert content.rstrip().endswith("Question: Who founded Festar Labs?")
    assert compact_pool_text(registry) in content
    for tag in ("<think>", "<search>", "<information>", "<answer>"):
        assert tag in content
    kept = (built / "prompt_template.txt").read_text()  # what sim.qa must be given: it keeps the pool's placeholder
    assert "{pool_domains}" in kept and with_pool(kept, registry) == template


# ---------------------------------------------------------------- oracle trajectories

def test_oracle_rows_pass_the_format_and_score_what_their_replies_said(rows, registry):
    assert len(rows) == N
    questions = SimWorld(seed=0).questions(N, SEED, "train", 0.4)
    modes = {r["mode"] for r in rows}
    assert "oracle" in modes and len(modes) >= 3
    right_oracle = 0
    for r, q in zip(rows, questions):
        assert r["question"] == q.question
        ok, why = check_format(r["response_text"], registry)
        assert ok, (why, r["response_text"])
        answer = extract_answer(r["response_text"])
        assert r["em"] == em_score(answer, r["answers"])
        replies = info_blocks(r["response_text"])
        assert len(replies) == r["routes"]
        if r["mode"] == "guess":
            assert r["routes"] == 0 and r["cost_usd"] == 0
            continue
        assert answer == (reply_answer(replies[-1]) or NO_ANSWER)  # the answer is what the last reply said
        if r["mode"] == "oracle" and r["routes"] == len(q.hops):
            # every hop went to its specialist; right replies make a right final answer
            hop_right = [normalize_answer(reply_answer(t) or "") == normalize_answer(h.answer)
                         for t, h in zip(replies, q.hops)]
            if all(hop_right):
                assert r["em"] == 1.0
                right_oracle += 1
    assert right_oracle >= 0.5 * sum(r["mode"] == "oracle" for r in rows)


def test_policy_segments_parse_into_the_intended_actions(rows, registry):
    for r in rows:
        segs = r["segments"]
        assert "".join(s["text"] for s in segs) == r["response_text"]
        policy = [s["text"] for s in segs if s["by_policy"]]
        assert all(s["by_policy"] != t["by_policy"] for s, t in zip(segs, segs[1:]))  # turns alternate
        for k, text in enumerate(policy[:-1]):
            action = parse_action(text, registry)
            assert action.kind == "route" and action.model == r["route_models"][k], text
            assert text.startswith("<think>") and text.endswith("</search>")
        last = parse_action(policy[-1], registry)
        assert last.kind == "answer" and last.answer == extract_answer(r["response_text"])
        for s in segs:
            if not s["by_policy"]:
                assert s["text"].startswith("\n\n<information>") and s["text"].endswith("</information>\n\n")


def test_second_hop_asks_about_the_entity_the_first_reply_gave(rows):
    checked = 0
    for r in rows:
        if r["mode"] == "oracle" and r["data_source"] == "sim_2hop" and r["routes"] == 2:
            first = reply_answer(info_blocks(r["response_text"])[0])
            second_route = [s["text"] for s in r["segments"] if s["by_policy"]][1]
            assert f"Got {first}." in second_route and f" {first}" in second_route.split("<search>")[1]
            checked += 1
    assert checked >= 3


def test_observations_are_the_real_pool_server_replies(rows):
    routed = [r for r in rows if r["routes"] > 0][:6]
    reqs, expected = [], []
    for r in routed:
        policy = [s["text"] for s in r["segments"] if s["by_policy"]]
        info = [s["text"] for s in r["segments"] if not s["by_policy"]]
        for text, obs in zip(policy, info):
            action = parse_action(text, ModelRegistry.from_yaml(SIM))
            reqs.append(RouteRequest(action.model, action.query))
            expected.append(obs)
    with ServerThread(SimBackend.from_pool_yaml(SIM, seed=0, latency_scale=0.0)) as srv:
        with PoolClient(ModelRegistry.from_yaml(SIM, base_url=srv.url)) as client:
            results = client.route(reqs)
    assert all(res.ok for res in results)
    assert [format_observation(res.text, 10**9) for res in results] == expected


def test_rl_rollout_of_the_oracle_turns_gives_the_sft_tokens_and_mask(rows, tok, registry):
    """Replay the oracle's policy turns through RouterEnv (real server): same ids, same mask, same score."""
    picked = [r for r in rows if r["routes"] >= 2][:3] + [r for r in rows if r["routes"] == 1][:2] + \
        [r for r in rows if r["mode"] == "guess"][:1]
    prompt_rows, plans = [], {}
    for i, r in enumerate(picked):
        ids = prompt_ids(tok, r["prompt"])
        prompt_rows.append(PromptRow(ids, f"u{i}", {"reward_model": {"ground_truth": {"target": r["answers"]}}}))
        # response offset at which each policy turn starts -> that turn's ids, tokenized on its own
        plan, offset = {}, 0
        for s in r["segments"]:
            seg_ids = tok(s["text"], add_special_tokens=False)["input_ids"]
            if s["by_policy"]:
                plan[offset] = seg_ids
            offset += len(seg_ids)
        plans[tuple(ids)] = plan

    def generate(prompts, sampling):
        outs = []
        for ctx in prompts:
            p = next(p for p in plans if tuple(ctx[:len(p)]) == p)
            outs.append(GenOutput(plans[p][len(ctx) - len(p)], "stop"))
        return outs

    with ServerThread(SimBackend.from_pool_yaml(SIM, seed=0, latency_scale=0.0)) as srv:
        reg = ModelRegistry.from_yaml(SIM, base_url=srv.url).seen()
        cfg = RouterEnvConfig(max_turns=4, max_obs_length=400, response_length=200, max_response_length=2000,
                              schedule="sync")
        with PoolClient(reg) as client:
            env = RouterEnv(cfg, tok, reg, client)
            result = env.rollout(prompt_rows, generate, SamplingParams(greedy=True), validate=True)
            _, metrics = env.score(result, prompt_rows, validate=True)
    for i, r in enumerate(picked):
        ex = tokenize_example(tok, r["prompt"], r["segments"])
        n_prompt = len(prompt_rows[i].prompt_ids)
        assert result.response_ids[i] == ex.ids[n_prompt:]
        assert result.response_mask[i] == ex.mask[n_prompt:]
        assert result.info["text"][i] == r["response_text"]
        assert metrics["format_ok"][i] == 1.0 and metrics["em"][i] == r["em"]
        assert metrics["cost_usd"][i] == pytest.approx(r["cost_usd"], rel=1e-9, abs=1e-15)
        # the per-part labels (the trainer's part/* metrics): each part's tokens decode to what the turns say
        ids = result.response_ids[i]
        (parts,) = env.token_parts([ids])
        assert len(parts) == len(ids) and not any(p for p, m in zip(parts, result.response_mask[i]) if not m)
        actions = [parse_action(s["text"], registry) for s in r["segments"] if s["by_policy"]]
        want = {2: "".join(a.model for a in actions if a.kind == "route"),
                3: "".join(a.query for a in actions if a.kind == "route"),
                4: extract_answer(r["response_text"]) or "",
                5: "".join(m for t in re.findall(r"<think>(.*?)</think>", r["response_text"])
                           for m in re.findall(r"Ask (\S+?)\.(?=\s|$)", t))}
        for k, text in want.items():
            got = tok.decode([t for t, p in zip(ids, parts) if p == k])
            assert got.replace(" ", "") == text.replace(" ", ""), (k, got, text)


def test_loss_mask_covers_exactly_the_policy_segments(rows, tok):
    for r in rows[:20]:
        ex = tokenize_example(tok, r["prompt"], r["segments"])
        n_prompt = len(prompt_ids(tok, r["prompt"]))
        assert sum(ex.mask[:n_prompt]) == 0
        runs, cur, prev = [], [], 0  # contiguous runs of mask-1 tokens, decoded
        for t, m in zip(ex.ids[n_prompt:], ex.mask[n_prompt:]):
            if m and not prev:
                cur = []
                runs.append(cur)
            if m:
                cur.append(t)
            prev = m
        assert [tok.decode(run) for run in runs] == [s["text"] for s in r["segments"] if s["by_policy"]]
        masked_out = [t for t, m in zip(ex.ids[n_prompt:], ex.mask[n_prompt:]) if not m]
        assert tok.decode(masked_out) == "".join(s["text"] for s in r["segments"] if not s["by_policy"])


# ---------------------------------------------------------------- tokenizer and model

def test_tokenizer_dir_round_trips_and_keeps_tags_and_names_whole(built, tok, rows, registry):
    again = AutoTokenizer.from_pretrained(built / "tokenizer")
    assert again.get_vocab() == tok.get_vocab()
    assert tok.pad_token_id is not None and tok.eos_token_id is not None and tok.pad_token_id != tok.eos_token_id
    for word in (*TAGS_FULL, *registry.names, *world_words(SimWorld(seed=0))[:50]):
        assert len(tok(word, add_special_tokens=False)["input_ids"]) == 1, word
    text = tok.apply_chat_template(rows[0]["prompt"], add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>user\n") and text.endswith("<|im_start|>assistant\n")
    for r in rows:
        ids = tok(r["response_text"], add_special_tokens=False)["input_ids"]
        assert tok.decode(ids, skip_special_tokens=True) == r["response_text"]
    # a name inside a longer word is not a token match: single-word tokens only
    name = next(w for w in world_words(SimWorld(seed=0)) if len(w) > 4)
    assert len(tok(name + "zq", add_special_tokens=False)["input_ids"]) > 1



def test_model_config_fits_the_tokenizer_and_the_longest_trajectory(built, tok, rows):
    spec = json.loads((built / "model.json").read_text())
    assert spec["vocab_size"] == len(tok) and spec["hidden_size"] == EMBEDDED_MODEL["hidden_size"]
    longest = max(len(tokenize_example(tok, r["prompt"], r["segments"]).ids) for r in rows)
    assert spec["max_position_embeddings"] >= 2 * longest
    model = load_model(spec)
    ex = tokenize_example(tok, rows[0]["prompt"], rows[0]["segments"])
    logits = model(input_ids=torch.tensor([ex.ids])).logits  # (1, seq, vocab)
    assert logits.shape == (1, len(ex.ids), len(tok)) and torch.isfinite(logits).all()


def test_report_and_outputs(built, rows, tok):
    frame = pd.read_parquet(built / "oracle.parquet")
    for col in ("prompt", "response_text", "segments", "data_source", "uid", "answers"):
        assert col in frame.columns
    assert frame["uid"].is_unique
    text = report(rows, tok)
    oracle = [r for r in rows if r["mode"] == "oracle"]
    em = sum(r["em"] for r in oracle) / len(oracle)
    assert f"oracle       n={len(oracle):<5} em={em:.3f}" in text
    assert "tokens: prompt mean" in text and f"vocab {len(tok)}" in text


# ---------------------------------------------------------------- the cautious annotator (prefer_big)

def test_prefer_big_sends_everything_to_the_strongest_generalist(tmp_path, registry):
    """prefer_big=1: every hop of a one-hop question and every two-hop question whole go to the
    generalist with the best worst-domain accuracy (Mixtral here), the most expensive seen model."""
    assert oracle_main(["--out-dir", str(tmp_path), "--n", "40", "--noise", "0.0", "--prefer-big", "1.0",
                        "--seed", "3", "--no-tokenizer"]) == 0
    rows = load_rows(tmp_path / "oracle.parquet")
    assert {r["mode"] for r in rows} == {"big"}
    strongest = "Mixtral-8x22B-Instruct"
    assert registry[strongest].price_out_per_m == max(s.price_out_per_m for s in registry.models.values())
    for r in rows:
        first = [s["text"] for s in r["segments"] if s["by_policy"]][0]
        assert parse_action(first, registry).model == strongest, first
        if r["data_source"] == "sim_2hop":  # the whole question in one route
            assert parse_action(first, registry).query == r["question"]
    # a cheap oracle run of the same questions costs several times less
    cheap = tmp_path / "cheap"
    assert oracle_main(["--out-dir", str(cheap), "--n", "40", "--noise", "0.0", "--seed", "3", "--no-tokenizer"]) == 0
    cheap_rows = load_rows(cheap / "oracle.parquet")
    assert {r["mode"] for r in cheap_rows} == {"oracle"}
    assert sum(r["cost_usd"] for r in rows) > 3 * sum(r["cost_usd"] for r in cheap_rows)


def test_prefer_big_mixes_with_the_noise_and_is_checked(tmp_path, capsys):
    assert oracle_main(["--out-dir", str(tmp_path), "--n", "200", "--noise", "0.3", "--prefer-big", "0.5",
                        "--no-tokenizer", "--report"]) == 0
    modes = [r["mode"] for r in load_rows(tmp_path / "oracle.parquet")]
    assert 0.35 < modes.count("big") / len(modes) < 0.65 and "oracle" in modes and "guess" in modes
    assert "big          n=" in capsys.readouterr().out
    assert oracle_main(["--out-dir", str(tmp_path), "--n", "5", "--prefer-big", "1.5", "--no-tokenizer"]) == 1
    assert "--prefer-big must be in [0, 1], got 1.5" in capsys.readouterr().err
