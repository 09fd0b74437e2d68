"""HFRollout against a naive no-cache reference loop, the model's own distribution, and its contract."""
import math
from types import SimpleNamespace

import pytest
import torch

from tiny import tiny_model
from verl.workers.rollout import RolloutBackend, SamplingParams, build_rollout
from verl.workers.rollout.hf_rollout import HFRollout, StopChecker, filter_logits

TEXTS = ["a", "The quick brown fox", "<think>Ask a bigger model.</think>",
         "Question: which river is the longest in Europe? Answer:", "10:30"]


pytestmark = pytest.mark.usefixtures("one_thread")


def prompts_of(tok, texts=TEXTS):
    return [tok.encode(t, add_special_tokens=False) for t in texts]


def eos_and_stop(model, tok, prompts, n: int) -> tuple[int, SamplingParams]:
    """An eos token from row 3's free greedy output, and greedy sampling of `n` tokens that stops at a string
    from the middle of row 1's: rows then finish at different steps and for different reasons."""
    free = HFRollout(model, tok, eos_token_ids=[]).generate(prompts, SamplingParams(greedy=True, max_new_tokens=n))
    stop = tok.decode(free[1].token_ids[5:7])
    return free[3].token_ids[4], SamplingParams(greedy=True, max_new_tokens=n, stop=(stop,))


@torch.no_grad()
def naive_greedy(model, prompt, n):
    """Recompute the whole unpadded sequence every step: no cache, no mask, no padding."""
    seq, out, lps = list(prompt), [], []
    for _ in range(n):
        logits = model(torch.tensor([seq])).logits[0, -1].float()
        t = int(logits.argmax())
        out.append(t)
        lps.append(float(torch.log_softmax(logits, -1)[t]))
        seq.append(t)
    return out, lps


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_greedy_matches_naive_loop_with_left_padding(tok, kind):
    model = tiny_model(len(tok), kind=kind)
    prompts = prompts_of(tok)
    assert len({len(p) for p in prompts}) == len(prompts)  # really ragged: left padding is exercised
    roll = HFRollout(model, tok, eos_token_ids=[])  # no eos: every row runs the full length
    outs = roll.generate(prompts, SamplingParams(greedy=True, max_new_tokens=12, return_logprobs=True))
    for p, o in zip(prompts, outs):
        ref, ref_lps = naive_greedy(model, p, 12)
        assert o.token_ids == ref
        assert o.finish_reason == "length"
        assert o.logprobs == pytest.approx(ref_lps, abs=1e-4)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_a_shared_prompt_prefix_runs_once_and_decodes_as_the_naive_loop(tok, kind):
    """Prompts that open on the same instruction (as every router prompt does): the prefix is run once, batch 1,
    and broadcast; each row must still decode as the no-cache loop on its own whole prompt."""
    model = tiny_model(len(tok), kind=kind)
    head = tok.encode("Models: Qwen $0.30, LLaMA $0.18. Question:", add_special_tokens=False)
    tails = [" a", " The quick brown fox", " which river is the longest in Europe?"]
    prompts = [head + tok.encode(t, add_special_tokens=False) for t in tails] + [head[:3]]
    roll = HFRollout(model, tok, eos_token_ids=[])
    assert roll._shared_prefix(prompts) == 2  # the short row keeps one token of its own
    assert roll._shared_prefix(prompts[:3]) >= len(head)
    assert roll._shared_prefix(prompts[:1]) == 0
    roll.device = torch.device("cuda")  # off the CPU it stays off (the small policy is launch-bound there)
    assert roll._shared_prefix(prompts) == 0
    roll.device = torch.device("cpu")
    for batch in (prompts, prompts[:3]):
        outs = roll.generate(batch, SamplingParams(greedy=True, max_new_tokens=10, return_logprobs=True))
        for p, o in zip(batch, outs):
            ref, ref_lps = naive_greedy(model, p, 10)
            assert o.token_ids == ref
            assert o.logprobs == pytest.approx(ref_lps, abs=1e-4)


def test_a_sliding_window_model_shares_no_prefix(tok):
    model = tiny_model(len(tok), kind="qwen2")
    model.config.layer_types = ["sliding_attention"] * model.config.num_hidden_layers
    prompts = prompts_of(tok, ["The quick brown fox", "The quick brown cat"])
    assert HFRollout(model, tok, eos_token_ids=[])._shared_prefix(prompts) == 0


def test_batch_equals_one_by_one_with_rows_finishing_at_different_steps(tok):
    model = tiny_model(len(tok), seed=1)
    prompts = prompts_of(tok)
    eos, sp = eos_and_stop(model, tok, prompts, 16)
    roll = HFRollout(model, tok, eos_token_ids=[eos], max_batch_size=2)  # 3 chunks, sorted by length
    batch = roll.generate(prompts, sp)
    single = [roll.generate([p], sp)[0] for p in prompts]
    assert batch == single
    reasons = {o.finish_reason for o in batch}
    assert {"stop", "eos"} <= reasons
    assert min(len(o.token_ids) for o in batch) < max(len(o.token_ids) for o in batch)


def test_stop_string_stops_and_is_included(tok):
    model = tiny_model(len(tok), seed=2)
    prompt = prompts_of(tok)[1]
    free = HFRollout(model, tok, eos_token_ids=[]).generate([prompt], SamplingParams(greedy=True, max_new_tokens=30))[0]
    stop = tok.decode(free.token_ids[6:9])  # spans several tokens
    out = HFRollout(model, tok, eos_token_ids=[]).generate(
        [prompt], SamplingParams(greedy=True, max_new_tokens=30, stop=("never-appears", stop)))[0]
    assert out.finish_reason == "stop"
    assert out.token_ids == free.token_ids[:len(out.token_ids)]  # same path, cut early
    assert stop in tok.decode(out.token_ids)
    assert stop not in tok.decode(out.token_ids[:-1])  # stopped at the first token that completes it


def test_stop_checker_finds_tags_whole_split_and_inside_a_token(tok):
    tag = tok.convert_tokens_to_ids("</search>")
    body = tok.encode("Qwen2.5-7B-Instruct: when at 10:30?", add_special_tokens=False)
    checker = StopChecker(tok, ("</search>", "</answer>"))
    assert not any(checker.hit(body[:i]) for i in range(1, len(body) + 1))
    assert checker.hit(body + [tag])  # the added token
    pieces = [i for s in ("</", "search", ">") for i in tok.encode(s, add_special_tokens=False)]
    assert tag not in pieces
    seq = body + pieces
    hits = [checker.hit(seq[:i]) for i in range(len(body) + 1, len(seq) + 1)]
    assert hits == [False] * (len(pieces) - 1) + [True]  # spelled in pieces: found at the last piece
    # a stop string that ends inside a token: the whole token is kept and the hit is found
    assert StopChecker(tok, ("</sea",)).hit(body + [tag])
    # multi-byte characters split across byte-level tokens
    jp = tok.encode("東京 and more", add_special_tokens=False)
    hits = [StopChecker(tok, ("東京",)).hit(jp[:i]) for i in range(1, len(jp) + 1)]
    first = hits.index(True)
    assert "東京" in tok.decode(jp[:first + 1]) and "東京" not in tok.decode(jp[:first])


def test_max_new_tokens_and_eos(tok):
    model = tiny_model(len(tok), seed=3)
    prompts = prompts_of(tok)
    roll = HFRollout(model, tok, eos_token_ids=[])
    outs = roll.generate(prompts, SamplingParams(max_new_tokens=7, seed=0))
    assert [len(o.token_ids) for o in outs] == [7] * len(prompts)
    assert {o.finish_reason for o in outs} == {"length"}
    # eos: a token the greedy path writes at step 4 (and maybe earlier) ends the row there, kept
    free = HFRollout(model, tok, eos_token_ids=[]).generate(prompts[:1], SamplingParams(greedy=True, max_new_tokens=10))[0]
    eos = free.token_ids[4]
    first = free.token_ids.index(eos)
    out = HFRollout(model, tok, eos_token_ids=[eos]).generate(prompts[:1], SamplingParams(greedy=True, max_new_tokens=10))[0]
    assert out.token_ids == free.token_ids[:first + 1]
    assert out.finish_reason == "eos"
    # by default the tokenizer's and the model config's eos ids are used
    assert tok.eos_token_id in HFRollout(tiny_model(len(tok)), tok).eos_ids


def test_seeded_sampling_is_reproducible(tok):
    model = tiny_model(len(tok), seed=4)
    roll = HFRollout(model, tok, eos_token_ids=[], max_batch_size=3)
    prompts = prompts_of(tok) + [prompts_of(tok)[0]] * 3
    sp = SamplingParams(temperature=1.0, max_new_tokens=12, seed=123)
    a, b = roll.generate(prompts, sp), roll.generate(prompts, sp)
    assert a == b
    c = roll.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=12, seed=124))
    assert a != c
    # identical prompts in one call are independent samples, not copies
    assert len({tuple(o.token_ids) for o in a[-4:]}) > 1


def _chi_square_ok(counts: torch.Tensor, probs: torch.Tensor, n: int) -> tuple[float, float]:
    """Chi-square statistic over bins with expected >= 5 (the rest pooled) and a p=1e-4 critical value."""
    expected = probs * n
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum(0, keepdim=True)])
    exp = torch.cat([expected[big], expected[~big].sum(0, keepdim=True)])
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    df = int(keep.sum()) - 1
    z = 3.719  # upper 1e-4 quantile of N(0, 1); Wilson-Hilferty approximation of chi-square
    crit = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return stat, crit


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, -1, 1.0), (0.7, -1, 1.0), (1.0, 5, 1.0), (1.0, -1, 0.6)])
def test_sampled_frequencies_match_model_distribution(tok, temperature, top_k, top_p):
    model = tiny_model(len(tok), seed=5)
    with torch.no_grad():
        model.lm_head.weight.mul_(8)  # a spread-out but non-uniform next-token distribution
        prompt = prompts_of(tok)[1]
        logits = model(torch.tensor([prompt])).logits[0, -1].float() / temperature
    probs = logits.softmax(-1)
    allowed = torch.ones_like(probs, dtype=torch.bool)
    if top_k > 0:
        allowed &= logits >= logits.topk(top_k).values[-1]
    if top_p < 1:
        order = probs.argsort(descending=True)
        before = probs[order].cumsum(0) - probs[order]
        allowed[order[before >= top_p]] = False
    target = torch.where(allowed, probs, 0.0)
    target = target / target.sum()
    n = 4000
    roll = HFRollout(model, tok, eos_token_ids=[], max_batch_size=n)
    outs = roll.generate([prompt] * n, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p,
                                                      max_new_tokens=1, seed=7))
    sampled = torch.tensor([o.token_ids[0] for o in outs])
    assert allowed[sampled].all(), "sampled a token outside the top-k / nucleus set"
    counts = torch.bincount(sampled, minlength=len(probs)).float()
    stat, crit = _chi_square_ok(counts, target, n)
    assert stat < crit, f"chi-square {stat:.1f} >= {crit:.1f}"
    if top_k > 0:
        assert len(set(sampled.tolist())) == top_k  # all of the top-k are reachable, nothing else


def test_filter_logits_boundaries():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    kept = lambda **kw: torch.isfinite(filter_logits(logits, **kw))[0].nonzero().flatten().tolist()
    assert kept(top_k=-1, top_p=1.0) == [0, 1, 2, 3]
    assert kept(top_k=2, top_p=1.0) == [0, 1]
    assert kept(top_k=-1, top_p=0.7) == [0, 1]  # the token that crosses top_p stays in
    assert kept(top_k=-1, top_p=0.5) == [0]     # 0.5 is reached exactly by the first token
    assert kept(top_k=-1, top_p=0.81) == [0, 1, 2]
    assert kept(top_k=3, top_p=0.7) == [0, 1]


def test_prefill_once_then_one_token_per_step_and_early_end(tok):
    model = tiny_model(len(tok), seed=7)
    prompts = prompts_of(tok)
    free = HFRollout(model, tok, eos_token_ids=[]).generate(prompts, SamplingParams(greedy=True, max_new_tokens=6))
    widths = []
    model.register_forward_pre_hook(lambda m, args, kw: widths.append(kw["input_ids"].shape), with_kwargs=True)
    # every row's 3rd token is an eos: all rows end after 3 steps although 50 are allowed
    roll = HFRollout(model, tok, eos_token_ids=[o.token_ids[2] for o in free])
    outs = roll.generate(prompts, SamplingParams(greedy=True, max_new_tokens=50))
    assert all(o.finish_reason == "eos" and len(o.token_ids) <= 3 for o in outs)
    longest = max(len(p) for p in prompts)
    assert widths[0] == (len(prompts), longest)  # the prompt is run once ...
    assert widths[1:] == [(len(prompts), 1)] * (len(widths) - 1)  # ... then one token per step
    assert len(widths) == max(len(o.token_ids) for o in outs)  # no step after the last row ended


def test_update_weights_changes_outputs_and_checks_names(tok):
    a, b = tiny_model(len(tok), seed=10), tiny_model(len(tok), seed=11)
    prompts = prompts_of(tok)
    sp = SamplingParams(greedy=True, max_new_tokens=8)
    want = HFRollout(tiny_model(len(tok), seed=11), tok, eos_token_ids=[]).generate(prompts, sp)
    roll = HFRollout(a, tok, eos_token_ids=[])
    before = roll.generate(prompts, sp)
    assert before != want
    # names as a compiled FSDP module would give them
    wrapped = {"_orig_mod._fsdp_wrapped_module." + k: v.clone() for k, v in b.state_dict().items()}
    roll.update_weights(wrapped)
    assert roll.generate(prompts, sp) == want
    sd = b.state_dict()
    missing = {k: v for k, v in sd.items() if k != "model.norm.weight"}
    with pytest.raises(KeyError, match="model.norm.weight"):
        roll.update_weights(missing)
    with pytest.raises(KeyError, match="extra.bias"):
        roll.update_weights({**sd, "extra.bias": torch.zeros(1)})


def test_sleep_wake_and_input_errors(tok):
    roll = HFRollout(tiny_model(len(tok)), tok)
    p = prompts_of(tok)[:2]
    roll.sleep()
    with pytest.raises(RuntimeError, match="wake"):
        roll.generate(p, SamplingParams(max_new_tokens=2))
    roll.wake()
    assert len(roll.generate(p, SamplingParams(max_new_tokens=2, seed=0))) == 2
    with pytest.raises(ValueError, match=r"prompts\[1\]"):
        roll.generate([p[0], []], SamplingParams(max_new_tokens=2))
    with pytest.raises(ValueError, match=r"prompts\[0\].*10000"):
        roll.generate([[1, 10000]], SamplingParams(max_new_tokens=2))
    with pytest.raises(ValueError, match="top_p"):
        roll.generate(p, SamplingParams(top_p=0.0))
    with pytest.raises(ValueError, match="max_new_tokens"):
        roll.generate(p, SamplingParams(max_new_tokens=0))


def test_temperature_zero_is_greedy_and_greedy_ignores_sampling_knobs(tok):
    model = tiny_model(len(tok), seed=6)
    roll = HFRollout(model, tok, eos_token_ids=[])
    prompts = prompts_of(tok)
    ref = roll.generate(prompts, SamplingParams(greedy=True, max_new_tokens=10))
    # the reference implementation lost the greedy flag and sampled at T=1 during validation
    assert roll.generate(prompts, SamplingParams(greedy=True, temperature=1.0, top_k=50, max_new_tokens=10, seed=1)) == ref
    assert roll.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=10)) == ref


def test_build_rollout_hf(tok):
    model = tiny_model(len(tok))
    roll = build_rollout({"name": "hf", "dtype": "float32", "max_batch_size": 2}, model=model, tokenizer=tok)
    assert isinstance(roll, HFRollout) and isinstance(roll, RolloutBackend) and roll.max_batch_size == 2
    out = roll.generate(prompts_of(tok)[:3], SamplingParams(greedy=True, max_new_tokens=3))
    assert [len(o.token_ids) for o in out] == [3, 3, 3] or any(o.finish_reason == "eos" for o in out)
    with pytest.raises(ValueError, match="rollout.name"):
        build_rollout(SimpleNamespace(name="sglang"))
    with pytest.raises(ValueError, match="model_path"):
        build_rollout({"name": "hf"})
    with pytest.raises(ValueError, match="rollout.dtype"):
        build_rollout({"name": "hf", "dtype": "float8"}, model=model, tokenizer=tok)
