"""A turn's text is cut at the end of its first action; its token ids stay exactly as sampled.

Byte-level BPE (GPT-2 style: SmolLM2, Qwen, Llama 3) merges the characters after a closing
tag into the tag's last token (`>.`, `>,`). The backends stop on the token that completes
`</search>` or `</answer>` and keep it whole, so a turn decodes to `...</answer>.`; read
whole, a right answer scored -1 (text after the last `</answer>`). Here a real byte-level
BPE tokenizer with such merges is trained, a tiny real model is fitted to write those
tokens, the real hf and hf_static backends generate with their own stop handling, and a
real pool server on loopback answers the route.
"""
from pathlib import Path

import pytest
import torch

from router_r1.pool.client import PoolClient
from router_r1.pool.registry import ModelRegistry
from router_r1.pool.server import ServerThread
from router_r1.actions import wrap_information
from router_r1.reward.format import check_format
from router_r1.router_env import RouterEnv, RouterEnvConfig
from tiny import tiny_model
from verl.trainer.dataset import PromptRow
from verl.utils.tiny import train_bpe_json, wrap_tokenizer
from verl.workers.rollout import SamplingParams, build_rollout

SIM = Path(__file__).resolve().parents[1] / "configs" / "pool" / "sim.yaml"
MODEL = "Qwen2.5-7B-Instruct"
TURN1 = f"<think>I should ask.</think><search>{MODEL}: capital of France?</search>,"
TURN2 = "<think>It says Paris.</think><answer>Paris</answer>."
REPLY = "Paris is the capital."


class FixedReply:
    """A pool backend that answers every request with REPLY."""

    def __init__(self, registry: ModelRegistry):
        self.ids = [registry[n].api_id for n in registry.names]

    async def complete(self, api_id, messages, temperature, max_tokens, seed):
        return REPLY, 10, 5

    def model_ids(self):
        return self.ids


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tok():
    # The tags are NOT added tokens here (unlike tiny_tokenizer): BPE merges decide how they split.
    corpus = [TURN1 + " then", TURN2, "<answer>x</answer>. <answer>y</answer>.", f"</search>, {REPLY}"] * 8
    return wrap_tokenizer(train_bpe_json(corpus, vocab_size=300, tags=()))


def ids_of(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def fitted(tok):
    """(model, prompt ids, the ids of turn 1, observation, turn 2): the model writes the turns greedily."""
    prompt = ids_of(tok, tok.apply_chat_template([{"role": "user", "content": "Capital of France?"}],
                                                 add_generation_prompt=True, tokenize=False))
    t1, obs, t2 = ids_of(tok, TURN1), ids_of(tok, wrap_information(REPLY)), ids_of(tok, TURN2)
    seq = torch.tensor([prompt + t1 + obs + t2 + [tok.eos_token_id]])
    model = tiny_model(len(tok), seed=0)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    torch.manual_seed(0)
    for _ in range(300):
        logits = model(seq[:, :-1]).logits
        if bool((logits.argmax(-1) == seq[:, 1:]).all()) and _ > 30:
            break
        loss = torch.nn.functional.cross_entropy(logits[0], seq[0, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return model, prompt, t1, obs, t2


def test_the_tokenizer_merges_characters_past_the_tags(tok):
    for text, tag, tail in ((TURN1, "</search>", ","), (TURN2, "</answer>", ".")):
        ids = ids_of(tok, text)
        assert tok.decode(ids[-1:]) == ">" + tail  # one token holds the tag's end and the next character
        assert tag not in tok.decode(ids[:-1])


@pytest.mark.parametrize("backend", ["hf", "hf_static"])
def test_reward_reads_each_turn_cut_at_its_action_and_ids_stay_as_sampled(tok, fitted, backend):
    model, prompt, t1, obs, t2 = fitted
    rollout = build_rollout({"name": backend, "max_model_len": 256, "cuda_graph": False}, model, tok)
    registry = ModelRegistry.from_yaml(SIM).seen()
    with ServerThread(FixedReply(registry)) as srv:
        registry = ModelRegistry.from_yaml(SIM, base_url=srv.url).seen()
        client = PoolClient(registry)
        cfg = RouterEnvConfig(max_turns=4, max_obs_length=64, response_length=64, max_response_length=512,
                              schedule="sync")
        env = RouterEnv(cfg, tok, registry, client)
        rows = [PromptRow(prompt, "q0", {"reward_model": {"ground_truth": {"target": ["Paris"]}}})]
        result = env.rollout(rows, rollout.generate, SamplingParams(greedy=True), validate=False)
        scores, metrics = env.score(result, rows, validate=False)
        client.close()

    # token ids exactly as sampled: the `>,` and `>.` tokens are kept, nothing re-tokenised
    assert result.response_ids[0] == t1 + obs + t2
    assert result.response_mask[0] == [1] * len(t1) + [0] * len(obs) + [1] * len(t2)
    # the text the reward and the parser read ends each turn at its tag
    text = result.info["text"][0]
    assert text == TURN1[:-1] + wrap_information(REPLY) + TURN2[:-1]
    turns = result.info["turns"][0]
    assert [t["action"] for t in turns] == ["route", "answer"] and turns[0]["model"] == MODEL
    assert [t["past_action"] for t in turns] == [",", "."]
    assert metrics["format_ok"] == [1.0] and metrics["em"] == [1.0] and list(scores) == [1.0]
    assert check_format(text, registry, "strict") == (True, "ok")
    # read whole, the same tokens break the format: what the cut fixes
    whole = tok.decode(result.response_ids[0], skip_special_tokens=True)
    assert whole.endswith("</answer>.")
    for rules in ("reference", "strict"):
        assert not check_format(whole, registry, rules)[0]
