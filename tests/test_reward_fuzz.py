"""Seeded, bounded fuzz of the protocol, observation building and reward against hostile pool replies.

Random policy trajectories (valid and broken, with text past their stop tags) are played
through TurnRules with a real tokenizer twice: once with a plain pool reply, once with a
hostile one (our tags in every spelling, partial tags, lone surrogates, control and
bidirectional characters, huge text). Nothing may raise, and the pool text may change
neither the format verdict (either rule set) nor the extracted answer. The reference
rule set is also checked against an oracle written from a description in words of the
reference's check (router_r1/reward/format.py's docstring) with plain regular expressions.
"""
import random
import re
from pathlib import Path

import pytest

from router_r1.pool.client import PoolResult
from router_r1.pool.registry import ModelRegistry
from router_r1.actions import TAGS, format_observation, parse_action, truncate_at_first_action
from router_r1.reward.cost import CostNormalizer
from router_r1.reward.format import check_format, closed_blocks
from router_r1.reward.qa_em import extract_answer
from router_r1.reward.score import RewardConfig, compute_score
from router_r1.episodes.episode import Episode, TurnRules

POOL = Path(__file__).resolve().parents[1] / "configs" / "pool" / "paper.yaml"
N_CASES = 150
ALL_TAGS = [f"<{t}>" for t in TAGS] + [f"</{t}>" for t in TAGS]
HOSTILE_PIECES = ALL_TAGS + [
    "< /Answer >", "<ANSWER>", "<\tthink\n>", "</ information>", "<Search >", "＜answer＞", "<answer", "answer>",
    "</", "<information", "</information", "<", ">", "\ud800", "\udfff", "\ud83d\ude00", "\ud83d", "😀", "東京",
    "e\u0301", "\u202e", "\u200b", "\ufeff", "\x00", "\r\n", "\n\n", "...", ":", "Qwen2.5-7B-Instruct: who?",
    "The answer is Paris.", "<|im_end|>", "<|endoftext|>", "\\u003canswer\\u003e", " ", "ſearch",
]
THINKS = ["I should ask.", "plan", "", "...", " ... ", "a\nb"]
ROUTES = ["Qwen2.5-7B-Instruct: Who wrote Hamlet?", "qwen2.5 7b instruct: when, at 10:30?", "Mistral-7B: born where?",
          "Qwen: who?", "Mixtral-8x7B: who?", "Model-Name: sub-question", "Qwen-7B: is Qwen-7B good?",
          "LLaMA-3.1-70B-Instruct:", "no colon here", "GPT-9: who?"]
TAG = re.compile(r"</?(?:think|search|answer|information)>")
TAILS = ["", "", ".", ",", '"', "<", " then more text", "\n"]


@pytest.fixture(scope="module")
def registry():
    return ModelRegistry.from_yaml(POOL).seen()


def hostile_reply(rng: random.Random, huge: bool = False) -> str:
    if huge:  # tags and text far past any observation budget
        return "<answer>x</answer> " * 5_000 + "".join(rng.choice(HOSTILE_PIECES) for _ in range(2_000))
    return "".join(rng.choice(HOSTILE_PIECES) for _ in range(rng.randint(0, 40)))


def policy_turns(rng: random.Random) -> list[str]:
    """A random trajectory's generated turns, each possibly running past its stop tag."""
    turns = []
    for _ in range(rng.randint(0, 3)):
        free = rng.choice(["", "", "Let me ask. "])
        turns.append(f"<think>{rng.choice(THINKS)}</think>{free}<search>{rng.choice(ROUTES)}</search>"
                     + rng.choice(TAILS))
    last = rng.random()
    if last < 0.1:
        turns.append(rng.choice(["no tags at all", "<think>open", "<answer>x"]))
    else:
        answer = rng.choice(["Paris", "William Shakespeare", "", "a <think>b</think> c"])
        lead = rng.choice(["", "", "Sure! ", "<think>x</think>"])
        turns.append(f"{lead}<think>{rng.choice(THINKS)}</think><answer>{answer}</answer>" + rng.choice(TAILS))
    return turns


def play(tok, registry, turns: list[str], replies: list[PoolResult | None]) -> Episode:
    """Run the turns through TurnRules; each route gets the next reply (None: the call failed)."""
    rules = TurnRules(tok, registry, max_turns=4, max_obs_length=48, max_response_length=10**7)
    ep = Episode(prompt_ids=[1, 2, 3])
    replies = list(replies)
    for text in turns:
        if ep.done:
            break
        action = rules.after_generation(ep, tok(text, add_special_tokens=False)["input_ids"])
        if action is not None:
            rules.after_pool(ep, replies.pop(0) or PoolResult.failure("timeout", model=action.model, attempts=1,
                                                                      latency_s=0.0))
    return ep


def ok_reply(text: str) -> PoolResult:
    return PoolResult(ok=True, text=text, prompt_tokens=5, completion_tokens=5, cost_usd=1e-6, latency_s=0.0,
                      error=None, attempts=1, cached=False, model="Qwen2.5-7B-Instruct")


def reference_oracle(text: str, registry) -> bool:
    """The reference's check as format.py's docstring states it, written plainly (with our kept fixes for routes)."""
    blocks = re.findall(r"<(think|search|answer|information)>(.*?)</\1>", text, re.DOTALL)
    if not blocks or any(text.count(f"<{t}>") != text.count(f"</{t}>") for t in TAGS):
        return False
    if any(tag in content for _, content in blocks for tag in ALL_TAGS):
        return False
    kinds = [k for k, _ in blocks]
    if any(k == "think" and c.strip() in ("", "...") for k, c in blocks):
        return False
    if kinds.count("answer") != 1 or "think" not in kinds or kinds.count("search") != kinds.count("information"):
        return False
    if not text.strip().startswith("<think>") or not text.strip().endswith("</answer>"):
        return False
    for k, content in blocks:
        if k == "search":
            model, colon, query = content.partition(":")
            if (parse_action(f"<search>{content}</search>", registry).kind != "route"
                    or model.strip().lower() in query.strip().lower()):
                return False
    return True


def test_pool_text_never_changes_the_verdict_or_the_answer(tok, registry):
    rng = random.Random(20260512)
    seen = {"reference": set(), "strict": set()}
    for case in range(N_CASES):
        turns = policy_turns(rng)
        hostile = [None if rng.random() < 0.1 else ok_reply(hostile_reply(rng, huge=case % 50 == 7)) for _ in turns]
        plain = [None if r is None else ok_reply("The reply.") for r in hostile]
        ep_h, ep_p = play(tok, registry, turns, hostile), play(tok, registry, turns, plain)
        assert TAG.findall(ep_h.text) == TAG.findall(ep_p.text), case  # the same tags in the same order
        assert extract_answer(ep_h.text) == extract_answer(ep_p.text), case
        assert ep_h.route_count == ep_p.route_count and ep_h.done == ep_p.done, case
        for rules in ("reference", "strict"):
            verdict = check_format(ep_h.text, registry, rules)
            assert verdict == check_format(ep_p.text, registry, rules), (case, rules)
            seen[rules].add(verdict[0])
            s, m = compute_score(ep_h.text, ["Paris"], ep_h.cost_usd, ep_h.route_count, registry, CostNormalizer(),
                                 RewardConfig(alpha=0.5, format_rules=rules))
            assert -1.0 <= s <= 1.0 and m["format_ok"] == verdict[0]
        assert check_format(ep_p.text, registry)[0] == reference_oracle(ep_p.text, registry), (case, ep_p.text)
    assert seen == {"reference": {True, False}, "strict": {True, False}}  # the cases reach both verdicts


def test_hostile_text_anywhere_never_raises(registry):
    """Hostile text as a policy turn, a whole response or an observation: answers, never exceptions."""
    rng = random.Random(7)
    finditer = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
    for case in range(300):
        text = hostile_reply(rng, huge=case % 100 == 1) if case % 50 else "<answer>" * 3_000 + "</think>" * 3_000
        cut = truncate_at_first_action(text)
        assert text.startswith(cut) and truncate_at_first_action(cut) == cut
        assert parse_action(text, registry).kind in ("route", "answer", "invalid", "none")
        for rules in ("reference", "strict"):
            ok, reason = check_format(text, registry, rules)
            assert isinstance(ok, bool) and reason
        if len(text) < 5_000:  # the regex is quadratic on unclosed tags: compare on small inputs only
            found = finditer.findall(text)
            assert extract_answer(text) == (found[-1].strip() if found else None), case
            assert closed_blocks(text) == re.findall(r"<(think|search|answer|information)>(.*?)</\1>", text, re.DOTALL)
        obs = format_observation(text, 32)
        assert obs.count("<information>") == obs.count("</information>") == 1 and obs.rstrip().endswith("</information>")
        obs.encode("utf-8")  # lone surrogates cleaned: the tokenizer and the JSONL dumps can take it
