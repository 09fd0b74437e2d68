"""GraphEnv: rollouts driven by a scripted `generate` that replays oracle turns, masks, rewards."""
import random
from pathlib import Path

import pytest

from data_process.kg_oracle import play
from data_process.kg_synth import question_row, questions_for
from gramma.graph_env import GraphEnv, GraphEnvConfig
from gramma.graph import KnowledgeGraph
from gramma.session import Session
from verl.trainer.dataset import PromptRow
from verl.workers.rollout.base import GenOutput, SamplingParams

KG = Path(__file__).resolve().parent / "data" / "kg"


@pytest.fixture(scope="module")
def graph():
    return KnowledgeGraph.load(KG)


def make_rows(tok, graph, kinds=("kg_1hop", "kg_2hop", "kg_visual"), n=None):
    rows = []
    for p in sorted(e for e in graph.entities if graph.entities[e].type == "person"):
        for q in questions_for(graph, p):
            if q.kind in kinds:
                fields = question_row(graph, q, "test", len(rows))
                text = tok.apply_chat_template(fields["prompt"], add_generation_prompt=True, tokenize=False)
                rows.append(PromptRow(tok(text, add_special_tokens=False)["input_ids"], f"u{len(rows)}", fields))
    return rows[:n]


def oracle_segments(env, row, mode="oracle", point=False):
    info, gt = row.fields["extra_info"], row.fields["reward_model"]["ground_truth"]
    s = Session(env.graph, env.ranker, info["question"], info["start"], env.cfg.max_turns)
    return play(s, gt, mode, random.Random(0), point)


def replay(tok, scripts, calls=None):
    """generate() that writes a prompt's scripted turns in order (the last one repeats)."""
    done = {p: 0 for p in scripts}

    def generate(prompts, sampling):
        assert sampling.stop == ("</action>",)
        outs = []
        for ids in prompts:
            if calls is not None:
                calls.append(list(ids))
            p = next(p for p in scripts if tuple(ids[: len(p)]) == p)
            turns, k = scripts[p], done[p]
            done[p] += 1
            text = turns[min(k, len(turns) - 1)]
            outs.append(GenOutput(tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id], "stop"))
        return outs
    return generate


def env_for(tok, graph, **kw):
    kw.setdefault("max_obs_tokens", 1000)  # the tiny test tokenizer spends many tokens on names
    kw.setdefault("max_response_length", 4096)
    return GraphEnv(GraphEnvConfig(graph_dir=str(KG), **kw), tok, graph)


def test_oracle_replay_is_correct_with_exact_masks(tok, graph):
    env = env_for(tok, graph)
    rows = make_rows(tok, graph)
    assert {r.fields["data_source"] for r in rows} == {"kg_1hop", "kg_2hop", "kg_visual"}
    segs = {tuple(r.prompt_ids): oracle_segments(env, r) for r in rows}
    scripts = {p: [s["text"] for s in ss if s["by_policy"]] for p, ss in segs.items()}
    res = env.rollout(rows, replay(tok, scripts), SamplingParams(), validate=False)
    scores, m = env.score(res, rows, validate=False)
    assert scores.tolist() == [1.0] * len(rows)
    assert m["em"] == [1.0] * len(rows) and m["format_ok"] == [1.0] * len(rows)
    assert m["evidence_ok"] == [1.0] * len(rows) and m["gold_visited"] == [1.0] * len(rows)
    for r, ids, mask, text in zip(rows, res.response_ids, res.response_mask, res.info["text"]):
        ss = segs[tuple(r.prompt_ids)]
        assert text == "".join(s["text"] for s in ss)  # the rollout sees exactly the oracle's observations
        policy = tok.decode([i for i, k in zip(ids, mask) if k], skip_special_tokens=True)
        environment = tok.decode([i for i, k in zip(ids, mask) if not k])
        assert policy == "".join(s["text"] for s in ss if s["by_policy"])
        assert environment == "".join(s["text"] for s in ss if not s["by_policy"])
        assert ids[-1] == tok.eos_token_id and mask[-1] == 1  # the last token is the policy's
    visual = [i for i, r in enumerate(rows) if r.fields["data_source"] == "kg_visual"]
    assert all(m["cross_modal"][i] >= 1 for i in visual)


def test_answer_by_candidate_number(tok, graph):
    env = env_for(tok, graph)
    rows = make_rows(tok, graph)
    scripts = {tuple(r.prompt_ids): [s["text"] for s in oracle_segments(env, r, point=True) if s["by_policy"]]
               for r in rows}
    assert all("STOP([" in turns[-1] for turns in scripts.values())
    res = env.rollout(rows, replay(tok, scripts), SamplingParams(), validate=False)
    scores, m = env.score(res, rows, validate=False)
    assert m["em"] == [1.0] * len(rows)
    assert res.info["answer"] == [r.fields["reward_model"]["ground_truth"]["target"][0] for r in rows]
    # Out of range or without brackets, the text is the answer as written.
    r = rows[0]
    for text, answer in (("<action>STOP([99])</action>", "[99]"), ("<action>STOP(1)</action>", "1")):
        res = env.rollout([r], replay(tok, {tuple(r.prompt_ids): [text]}), SamplingParams(), False)
        assert res.info["answer"] == [answer] and env.score(res, [r], False)[1]["em"] == [0.0]


def test_wrong_answer_malformed_turn_and_turn_budget(tok, graph):
    env = env_for(tok, graph, max_turns=3)
    rows = make_rows(tok, graph, kinds=("kg_1hop",), n=3)
    start = [r.fields["extra_info"]["start_name"] for r in rows]
    scripts = {
        tuple(rows[0].prompt_ids): [f"<action>EXPAND({start[0]})</action>", "<action>STOP(Nowhere)</action>"],
        tuple(rows[1].prompt_ids): ["I think it is <action>EXPAND(1)</action>", "<action>STOP(x)</action>"],
        tuple(rows[2].prompt_ids): ["<action>FOCUS(99)</action>"],  # never stops; 99 is not listed either
    }
    res = env.rollout(rows, replay(tok, scripts), SamplingParams(), validate=True)
    scores, m = env.score(res, rows, validate=True)
    assert scores.tolist() == [0.0, -1.0, -1.0]
    assert m["format_ok"] == [1.0, 0.0, 0.0] and m["hit_budget"] == [0.0, 0.0, 1.0]
    assert m["turns"] == [2.0, 2.0, 3.0] and m["invalid_actions"] == [0.0, 1.0, 3.0]
    assert "Invalid action: text outside the think and action blocks." in res.info["text"][1]
    assert "no candidate [99] in the latest list (1-" in res.info["text"][2]
    assert res.response_mask[2][0] == 0 and res.info["text"][2].startswith("<information>At ")  # opens on the start
    assert res.info["text"][2].count("Last turn: STOP now.") == 1


def test_f1_metric_and_evidence_weight(tok, graph):
    rows = make_rows(tok, graph, kinds=("kg_2hop",), n=2)
    env = env_for(tok, graph, evidence_weight=0.5)
    good = [s["text"] for s in oracle_segments(env, rows[0]) if s["by_policy"]]
    bare = [s["text"] for s in oracle_segments(env, rows[1], mode="bare") if s["by_policy"]]
    scripts = {tuple(rows[0].prompt_ids): good, tuple(rows[1].prompt_ids): bare}
    res = env.rollout(rows, replay(tok, scripts), SamplingParams(), validate=False)
    scores, m = env.score(res, rows, validate=False)
    assert m["em"] == [1.0, 1.0] and m["evidence_ok"] == [1.0, 0.0]
    assert scores.tolist() == [1.0, 0.5]


def test_evidence_check_follows_the_graph(tok, graph):
    env = env_for(tok, graph)
    row = make_rows(tok, graph, kinds=("kg_2hop",), n=1)[0]
    path = row.fields["reward_model"]["ground_truth"]["path"]
    names = [graph.name(p) for p in path]
    assert env.evidence_ok(row.fields, names[-1], names, [])
    assert not env.evidence_ok(row.fields, names[-1], [names[0], names[-1]], [])  # skips the middle hop
    assert not env.evidence_ok(row.fields, names[-1], names[1:], [])  # does not start at the start
    assert not env.evidence_ok(row.fields, names[1], names, [])  # does not end at the answer
    vis = make_rows(tok, graph, kinds=("kg_visual",), n=1)[0]
    vp = vis.fields["reward_model"]["ground_truth"]["path"]
    vnames = [graph.name(p) for p in vp]
    assert not env.evidence_ok(vis.fields, vnames[-1], vnames, [])  # right path, image never read
    assert env.evidence_ok(vis.fields, vnames[-1], vnames, [vp[-1]])


def test_response_budget_truncates_and_keeps_masks_aligned(tok, graph):
    rows = make_rows(tok, graph, kinds=("kg_2hop",), n=2)
    env = env_for(tok, graph)
    first = max(len(tok(env.new_session(r.fields).begin())["input_ids"]) for r in rows)
    with pytest.raises(ValueError, match="no room to act after the first observation"):
        env_for(tok, graph, max_response_length=first).rollout(rows, replay(tok, {}), SamplingParams(), False)
    env = env_for(tok, graph, max_response_length=first + 60)
    scripts = {tuple(r.prompt_ids): [f"<action>EXPAND({r.fields['extra_info']['start_name']})</action>"] * 6
               for r in rows}
    res = env.rollout(rows, replay(tok, scripts), SamplingParams(), validate=False)
    _, m = env.score(res, rows, validate=False)
    assert m["truncated"] == [1.0, 1.0]
    for ids, mask in zip(res.response_ids, res.response_mask):
        assert len(ids) == len(mask) <= first + 60 and sum(mask) > 0


def test_compressed_context_keeps_question_and_summary(tok, graph):
    rows = make_rows(tok, graph, kinds=("kg_visual",), n=1)
    env = env_for(tok, graph)
    segs = oracle_segments(env, rows[0])
    turns = [s["text"] for s in segs if s["by_policy"]]
    assert len(turns) >= 2
    budget = len(rows[0].prompt_ids) + 200
    env = env_for(tok, graph, max_context_tokens=budget, summary_tokens=60)
    calls = []
    res = env.rollout(rows, replay(tok, {tuple(rows[0].prompt_ids): turns}, calls), SamplingParams(), False)
    _, m = env.score(res, rows, validate=False)
    assert m["em"] == [1.0] and m["compressed"] == [1.0]
    prompt = rows[0].prompt_ids
    squeezed = [c for c in calls if len(c) < len(prompt) + len(res.response_ids[0]) and "Memory:" in tok.decode(c)]
    assert squeezed, "no generation saw a compressed context"
    for c in calls:
        assert c[: len(prompt)] == prompt and len(c) + env.cfg.response_length <= budget
    assert "At " in tok.decode(squeezed[-1][len(prompt):])  # the summary says where the episode stands
    # The trained trajectory is the full one.
    assert tok.decode(res.response_ids[0], skip_special_tokens=True) == "".join(s["text"] for s in segs)


def test_rows_without_start_are_named(tok, graph):
    env = env_for(tok, graph)
    bad = PromptRow([1, 2], "bad-uid", {"extra_info": {"question": "q"}})
    with pytest.raises(ValueError, match=r"row 0 \(bad-uid\): extra_info needs 'start'"):
        env.rollout([bad], replay(tok, {}), SamplingParams(), False)
