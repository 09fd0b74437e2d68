"""Routing protocol: first-action truncation, action parsing, observations."""
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from router_r1.pool.registry import ModelRegistry
from router_r1.actions import (
    INVALID_REASONS, NO_REPLY_TEXT, ROUTE_EXAMPLE, Action, format_observation, invalid_observation,
    neutralize_tags, parse_action, render_route, truncate_at_first_action, whitespace_truncate,
)

POOL = Path(__file__).resolve().parents[1] / "configs" / "pool" / "paper.yaml"


@pytest.fixture(scope="module")
def registry():
    return ModelRegistry.from_yaml(POOL)


# ---- truncate_at_first_action -------------------------------------------------------

def test_truncate_cuts_after_search_and_drops_hallucinated_information():
    turn = "<think>ask</think><search>Qwen2.5-7B-Instruct: who?</search>\n<information>made up</information>"
    assert truncate_at_first_action(turn) == "<think>ask</think><search>Qwen2.5-7B-Instruct: who?</search>"


def test_truncate_cuts_after_answer():
    assert truncate_at_first_action("<think>x</think><answer>Paris</answer> trailing") == \
        "<think>x</think><answer>Paris</answer>"


def test_truncate_answer_before_search_ends_at_answer():
    # the episode is over at the answer; a later route is never executed
    turn = "<think>x</think><answer>Paris</answer><search>Mistral-7B-Instruct: q</search>"
    assert truncate_at_first_action(turn) == "<think>x</think><answer>Paris</answer>"


def test_truncate_search_before_answer_ends_at_search():
    turn = "<think>x</think><search>Mistral-7B-Instruct: q</search><answer>Paris</answer>"
    assert truncate_at_first_action(turn) == "<think>x</think><search>Mistral-7B-Instruct: q</search>"


def test_truncate_without_action_is_identity_and_idempotent():
    assert truncate_at_first_action("<think>still thinking") == "<think>still thinking"
    once = truncate_at_first_action("<search>a: b</search><search>c: d</search>")
    assert once == "<search>a: b</search>" and truncate_at_first_action(once) == once


# ---- parse_action ---------------------------------------------------------------------

def test_route_resolves_to_canonical_name(registry):
    a = parse_action("<think>t</think><search> qwen2.5 7b instruct : capital of France? </search>", registry)
    assert a == Action("route", model="Qwen2.5-7B-Instruct", query="capital of France?")
    alias = parse_action("<search>Llama-3.1-70B-Instruct: x</search>", registry)
    assert alias.kind == "route" and alias.model == "LLaMA-3.1-70B-Instruct"


def test_route_splits_on_first_colon_only(registry):
    # the reference used split(':')[1] and kept only "At 10"
    a = parse_action("<search>Qwen2.5-7B-Instruct: At 10:30, who spoke: the mayor?</search>", registry)
    assert a.kind == "route" and a.query == "At 10:30, who spoke: the mayor?"


def test_unknown_model_is_invalid_not_a_crash(registry):
    a = parse_action("<search>GPT-9-Ultra: who?</search>", registry)
    assert a.kind == "invalid" and a.reason == "unknown_model" and a.model == "GPT-9-Ultra"
    # no substring guessing either
    assert parse_action("<search>Qwen: who?</search>", registry).reason == "unknown_model"


@pytest.mark.parametrize("content,reason", [
    ("Model-Name: sub-question", "placeholder"),
    ("model name: sub question", "placeholder"),
    ("Model-Name: who wrote Hamlet?", "placeholder"),
    ("Qwen2.5-7B-Instruct: sub-question", "placeholder"),
    ("Qwen2.5-7B-Instruct who wrote Hamlet?", "no_colon"),
    (": who wrote Hamlet?", "empty_model"),
    ("Qwen2.5-7B-Instruct:   ", "empty_query"),
    ("Qwen2.5-7B-Instruct: a <think>b</think>", "nested_or_unclosed"),
])
def test_invalid_route_reasons(registry, content, reason):
    a = parse_action(f"<think>t</think><search>{content}</search>", registry)
    assert a.kind == "invalid" and a.reason == reason and reason in INVALID_REASONS


def test_route_inside_open_block_or_unopened_is_invalid(registry):
    assert parse_action("<think>t <search>Mistral-7B: q</search>", registry).reason == "nested_or_unclosed"
    assert parse_action("<search>a <search>Mistral-7B: q</search>", registry).reason == "nested_or_unclosed"
    assert parse_action("Mistral-7B: q</search>", registry).reason == "nested_or_unclosed"


def test_answer_action_and_last_opening_wins(registry):
    assert parse_action("<think>t</think><answer> Paris </answer>", registry) == Action("answer", answer="Paris")
    assert parse_action("<answer>draft <answer>final</answer>", registry).answer == "final"
    assert parse_action("<think>t</think>Paris</answer>", registry).reason == "nested_or_unclosed"


def test_first_action_decides(registry):
    a = parse_action("<answer>Rome</answer><search>Mistral-7B: q</search>", registry)
    assert a == Action("answer", answer="Rome")
    b = parse_action("<search>Mistral-7B: q</search><answer>Rome</answer>", registry)
    assert b.kind == "route" and b.model == "Mistral-7B-Instruct"


def test_no_action(registry):
    assert parse_action("<think>hmm, let me", registry) == Action("none")


def test_render_route_round_trips(registry):
    a = parse_action(render_route("Gemma-2-27B-Instruct", "Who painted the Night Watch?"), registry)
    assert (a.kind, a.model, a.query) == ("route", "Gemma-2-27B-Instruct", "Who painted the Night Watch?")


def test_route_example_is_a_placeholder(registry):
    assert parse_action(ROUTE_EXAMPLE, registry).reason == "placeholder"


# ---- observations ----------------------------------------------------------------------

def test_neutralize_all_tag_spellings():
    text = "<answer>x</answer> < Think >y</THINK> <search>z< /search> <information>w</ information>"
    out = neutralize_tags(text)
    assert "<" not in out and ">" not in out
    assert out == "(answer)x(/answer) (think)y(/think) (search)z(/search) (information)w(/information)"
    assert neutralize_tags("a < b and c > d, <br>") == "a < b and c > d, <br>"  # other text untouched


def test_observation_wraps_and_neutralises():
    obs = format_observation("It is <answer>Paris</answer>.", max_tokens=50)
    assert obs.strip() == "<information>It is (answer)Paris(/answer).</information>"


def test_observation_truncates_inside_block_whitespace():
    reply = " ".join(f"w{i}" for i in range(100))
    obs = format_observation(reply, max_tokens=7)
    body = obs.strip()
    assert body.startswith("<information>") and body.endswith("</information>")
    assert body[len("<information>"):-len("</information>")].split() == [f"w{i}" for i in range(7)]


def test_whitespace_truncate_keeps_spacing():
    assert whitespace_truncate("a  b\nc d", 3) == "a  b\nc"
    assert whitespace_truncate("a b", 0) == ""
    assert whitespace_truncate("a b", 5) == "a b"


@pytest.fixture(scope="module")
def tokenizer():
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["The capital of France is Paris.", "Paris is a city on the Seine river.",
              "answer information think search <answer> </information>"] * 20
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def test_observation_truncates_with_real_tokenizer_and_keeps_closing_tag(tokenizer):
    count = lambda s: len(tokenizer.encode(s).ids)
    cut = lambda s, n: tokenizer.decode(tokenizer.encode(s).ids[:n])
    reply = "Paris is a city on the Seine river. " * 30 + "<answer>Paris</answer>"
    obs = format_observation(reply, max_tokens=20, count_tokens=count, truncate=cut)
    assert obs.rstrip().endswith("</information>") and obs.count("</information>") == 1
    body = obs.strip()[len("<information>"):-len("</information>")]
    assert 0 < count(body) <= 20
    assert reply.startswith(body)
    # the reference's cut of the whole string at the limit loses the closing tag
    whole = "<information>" + reply + "</information>"
    assert not cut(whole, 20 + count("<information>")).endswith("</information>")


def test_observation_short_text_untouched_by_tokenizer(tokenizer):
    count = lambda s: len(tokenizer.encode(s).ids)
    cut = lambda s, n: tokenizer.decode(tokenizer.encode(s).ids[:n])
    assert format_observation("Paris.", 20, count, cut).strip() == "<information>Paris.</information>"


def test_failed_call_and_bad_arguments():
    assert format_observation(None, 100).strip() == f"<information>{NO_REPLY_TEXT}</information>"
    with pytest.raises(ValueError, match="max_tokens"):
        format_observation("x", -1)
    with pytest.raises(ValueError, match="together"):
        format_observation("x", 5, count_tokens=len)


def test_invalid_observation(registry):
    bad = parse_action("<search>GPT-9: q</search>", registry)
    assert invalid_observation(bad, hint=False) == ""
    hint = invalid_observation(bad, hint=True, names=registry.names)
    assert hint.strip().startswith("<information>") and hint.strip().endswith("</information>")
    assert "GPT-9" in hint and "Mistral-7B-Instruct" in hint
    inner = hint.strip()[len("<information>"):-len("</information>")]
    assert "<" not in inner  # the hint itself cannot break the format
    assert "No action" in invalid_observation(Action("none"), hint=True)
    with pytest.raises(ValueError):
        invalid_observation(Action("answer", answer="x"), hint=True)
