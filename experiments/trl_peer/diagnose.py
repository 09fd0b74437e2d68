"""Where a gap between our GRPO and TRL's could come from, measured at the warm start on one seed's rows:

1. sampling: the warm start's reward under each trainer's sampler on the same prompts (our hf engine with the env's
   stop strings; TRL's own `_generate_single_turn`), paired by prompt, and whether each sampler draws from the
   policy's softmax at T;
2. the update: TRL's gradient (`GRPOTrainer._compute_loss`) on one fixed batch against the objective written out
   (token-mean clipped surrogate with GRPO advantages, plus beta x k3 KL), the one our actor's gradient is checked
   against in tests/test_ppo_update_exact.py.

    python -m experiments.trl_peer.diagnose --data ROWS.parquet --sft SFT_DIR --prompts 256 --out diag.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from router_r1.actions import STOP_STRINGS
from experiments.trl_peer.settings import PeerSettings
from experiments.trl_peer.task import golds_of, route_reward


def fresh_copy(trainer):
    """The trainer's policy as a new model (a deepcopy would keep the forward accelerate wrapped around the original)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(trainer.model.config)
    model.load_state_dict(trainer.model.state_dict())
    return model.float()


def sample_ours(model, tok, prompts: list[list[int]], s: PeerSettings, seed: int) -> list[str]:
    from verl.workers.rollout.base import SamplingParams
    from verl.workers.rollout.hf_rollout import HFRollout

    engine = HFRollout(model, tok, max_batch_size=s.samples_per_step)
    outs = []
    for k, i in enumerate(range(0, len(prompts), s.samples_per_step)):  # a step's batch per call, seeded seed + k as
        sp = SamplingParams(temperature=s.temperature, max_new_tokens=s.max_completion_length,  # training seeds a step
                            stop=STOP_STRINGS, seed=seed + k)
        outs += engine.generate(prompts[i:i + s.samples_per_step], sp)
    return tok.batch_decode([o.token_ids for o in outs], skip_special_tokens=True)


def sample_trl(trainer, prompts: list[list[int]], s: PeerSettings, seed: int) -> list[str]:
    torch.manual_seed(seed)
    ids = []
    for i in range(0, len(prompts), s.samples_per_step):
        got, _ = trainer._generate_single_turn(prompts[i:i + s.samples_per_step], None, {}, s.group_size)
        ids += got
    return trainer.processing_class.batch_decode(ids, skip_special_tokens=True)


def paired_ci(diff: np.ndarray, boot: int = 2000) -> list[float]:
    rng = np.random.default_rng(0)
    means = diff[rng.integers(0, len(diff), size=(boot, len(diff)))].mean(1)
    return [round(float(np.quantile(means, 0.025)), 4), round(float(np.quantile(means, 0.975)), 4)]


def sampling_check(trainer, rows, s: PeerSettings, seed: int) -> dict:
    """Each prompt group_size times under both samplers; reward means and ours - TRL paired by prompt."""
    tok = trainer.processing_class
    prompt_ids, _, _ = trainer._tokenize_prompts([r["prompt"] for r in rows])
    repeated = [list(p) for p in prompt_ids for _ in range(s.group_size)]
    fields = [{"reward_model": r["reward_model"]} for r in rows for _ in range(s.group_size)]
    texts = {"ours": sample_ours(fresh_copy(trainer), tok, repeated, s, seed), "trl": sample_trl(trainer, repeated, s, seed)}
    per_prompt = {k: np.array([route_reward(t, f) for t, f in zip(v, fields)]).reshape(-1, s.group_size).mean(1)
                  for k, v in texts.items()}
    diff = per_prompt["ours"] - per_prompt["trl"]
    lengths = {k: float(np.mean([len(tok(t, add_special_tokens=False)["input_ids"]) for t in v]))
               for k, v in texts.items()}
    return {"prompts": len(rows), "samples_each": len(repeated),
            "reward": {k: round(float(v.mean()), 4) for k, v in per_prompt.items()},
            "ours_minus_trl": round(float(diff.mean()), 4), "ci95": paired_ci(diff),
            "mean_tokens": {k: round(v, 2) for k, v in lengths.items()},
            "routes_closed": {k: round(float(np.mean([t.rstrip().endswith(STOP_STRINGS) for t in v])), 4)
                              for k, v in texts.items()}}


def sampler_check(trainer, rows, s: PeerSettings, seed: int) -> dict:
    """Does each sampler draw from the policy's softmax at T? Ours: the engine's own log-prob of each token it wrote
    against a clean one-row forward. TRL: transformers' logits on a left-padded batch against a clean forward, and its
    processed scores against log_softmax(logits / T) (how many tokens they keep)."""
    from verl.workers.rollout.base import SamplingParams
    from verl.workers.rollout.hf_rollout import HFRollout

    tok = trainer.processing_class
    prompt_ids, _, _ = trainer._tokenize_prompts([r["prompt"] for r in rows[: s.samples_per_step]])
    prompts = [list(p) for p in prompt_ids]
    clean = fresh_copy(trainer).eval()
    engine = HFRollout(fresh_copy(trainer), tok, max_batch_size=s.samples_per_step)
    outs = engine.generate(prompts, SamplingParams(temperature=s.temperature, max_new_tokens=s.max_completion_length,
                                                   stop=STOP_STRINGS, seed=seed, return_logprobs=True))
    worst = 0.0
    with torch.no_grad():
        for p, o in zip(prompts, outs):
            logits = clean(input_ids=torch.tensor([p + o.token_ids])).logits[0, len(p) - 1:-1].float()
            lp = torch.log_softmax(logits / s.temperature, -1).gather(-1, torch.tensor(o.token_ids)[:, None])
            worst = max(worst, float((lp.squeeze(-1) - torch.tensor(o.logprobs)).abs().max()))
        few = prompts[:16]  # left-padded to the longest, as TRL pads a generation batch
        width = max(map(len, few))
        ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in few])
        attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in few])
        torch.manual_seed(seed)
        gen = trainer.model.generate(input_ids=ids, attention_mask=attn, generation_config=trainer.generation_config,
                                     output_scores=True, output_logits=True, return_dict_in_generate=True)
        logits = torch.stack(gen.logits, 1).float()  # (rows, steps, vocab)
        trl_worst = 0.0
        for r, p in enumerate(few):
            comp = gen.sequences[r, width:].tolist()
            n = next((i + 1 for i, t in enumerate(comp) if t in trainer.eos_token_ids), len(comp))
            ref = clean(input_ids=torch.tensor([p + comp[:n]])).logits[0, len(p) - 1:len(p) - 1 + n].float()
            d = torch.log_softmax(ref / s.temperature, -1) - torch.log_softmax(logits[r, :n] / s.temperature, -1)
            trl_worst = max(trl_worst, float(d.abs().max()))
    kept = torch.isfinite(gen.scores[0])
    same = all(torch.allclose(torch.log_softmax(sc, -1), torch.log_softmax(lg / s.temperature, -1), atol=1e-5)
               for sc, lg in zip(gen.scores, gen.logits))
    return {"ours_engine_vs_clean_logprob_max_abs": worst, "rows": len(prompts),
            "trl_generate_vs_clean_logprob_max_abs": trl_worst, "trl_rows": len(few),
            "trl_scores_equal_raw_softmax_at_T": bool(same), "trl_tokens_kept_of_vocab": [int(kept.sum(-1).min()),
                                                                                         int(kept.shape[-1])]}


def objective(model, prompt_ids, prompt_mask, completion_ids, completion_mask, adv, ref, s: PeerSettings):
    """The GRPO loss written out: token-mean of -min(r A, clip(r) A) + beta k3(ref - logp), r = 1 (on-policy)."""
    ids = torch.cat([prompt_ids, completion_ids], 1)
    attn = torch.cat([prompt_mask, completion_mask], 1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    c = completion_ids.shape[1]
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, -c - 1:-1] / s.temperature
    logp = torch.log_softmax(logits.float(), -1).gather(-1, completion_ids[..., None]).squeeze(-1)
    mask = completion_mask.bool()
    ratio = torch.exp(logp - logp.detach())
    a = adv[:, None]
    surrogate = torch.minimum(ratio * a, ratio.clamp(1 - s.clip, 1 + s.clip) * a)
    d = ref - logp
    return (-surrogate + s.beta * (torch.exp(d) - d - 1))[mask].mean()


def gradient_check(trainer, rows, s: PeerSettings, seed: int) -> dict:
    """One step's batch (sampled by TRL at the warm start, scored, GRPO advantages): TRL's gradient against the
    objective's; the reference log-probs are the policy's plus noise, so the KL term is not zero."""
    from verl.algos.advantages import compute_grpo_advantages

    rows = rows[: s.prompts_per_step]
    tok = trainer.processing_class
    prompt_ids, _, _ = trainer._tokenize_prompts([r["prompt"] for r in rows])
    repeated = [list(p) for p in prompt_ids for _ in range(s.group_size)]
    torch.manual_seed(seed)
    comp, _ = trainer._generate_single_turn(repeated, None, {}, s.group_size)
    texts = tok.batch_decode(comp, skip_special_tokens=True)
    scores = torch.tensor([route_reward(t, {"reward_model": r["reward_model"]})
                           for t, r in zip(texts, [r for r in rows for _ in range(s.group_size)])])
    width_p, width_c = max(map(len, repeated)), max(map(len, comp))
    pad = tok.pad_token_id
    p_ids = torch.tensor([[pad] * (width_p - len(p)) + p for p in repeated])
    p_mask = torch.tensor([[0] * (width_p - len(p)) + [1] * len(p) for p in repeated])
    c_ids = torch.tensor([list(c) + [pad] * (width_c - len(c)) for c in comp])
    c_mask = torch.tensor([[1] * len(c) + [0] * (width_c - len(c)) for c in comp])
    groups = [i // s.group_size for i in range(len(comp))]
    adv = compute_grpo_advantages(scores, groups, c_mask)[0][:, 0]  # ours' advantages; TRL's own differ by eps only
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model = fresh_copy(trainer).train()
        ids = torch.cat([p_ids, c_ids], 1)
        attn = torch.cat([p_mask, c_mask], 1)
        logits = model(input_ids=ids, attention_mask=attn,
                       position_ids=(attn.cumsum(-1) - 1).clamp(min=0)).logits[:, -width_c - 1:-1] / s.temperature
        logp = torch.log_softmax(logits.float(), -1).gather(-1, c_ids[..., None]).squeeze(-1)
        ref = (logp + 0.3 * torch.randn(logp.shape, generator=g)) * c_mask
    model.zero_grad(set_to_none=True)
    objective(model, p_ids, p_mask, c_ids, c_mask, adv, ref, s).backward()
    grad = lambda m: {n: torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()  # noqa: E731
                      for n, p in m.named_parameters()}
    want = grad(model)
    trl_model = trainer.model.train()
    trl_model.zero_grad(set_to_none=True)
    if not hasattr(trainer, "current_gradient_accumulation_steps"):
        trainer.current_gradient_accumulation_steps = 1
    inputs = {"prompt_ids": p_ids, "prompt_mask": p_mask, "completion_ids": c_ids, "completion_mask": c_mask,
              "advantages": adv, "ref_per_token_logps": ref, "num_items_in_batch": c_mask.sum()}
    trainer._compute_loss(trl_model, inputs).backward()
    got = grad(trl_model)
    a = torch.cat([want[n].flatten() for n in sorted(want)])
    b = torch.cat([got[n].flatten() for n in sorted(want)])
    return {"samples": len(comp), "reward": round(float(scores.mean()), 4),
            "grad_norm": {"objective": round(float(a.norm()), 6), "trl": round(float(b.norm()), 6)},
            "cosine": round(float(torch.nn.functional.cosine_similarity(a, b, 0)), 8),
            "max_abs_diff_over_max_abs": float((a - b).abs().max() / a.abs().max())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="a seed's rows (python -m experiments.trl_peer.task)")
    p.add_argument("--sft", required=True, help="the warm start")
    p.add_argument("--prompts", type=int, default=256, help="prompts of the sampling check (first N rows)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--out", default=None, help="write the result as JSON here")
    a = p.parse_args(argv)
    from experiments.trl_peer.peer import build_trainer, dataset

    s = PeerSettings()
    trainer = build_trainer(s, a.data, a.sft, "/tmp/trl_peer_diagnose", a.seed, 1)
    rows = list(dataset(a.data))[: a.prompts]
    golds_of(rows[0])  # a row without golds fails here, naming it
    result = {"settings": {"temperature": s.temperature, "group_size": s.group_size, "beta": s.beta},
              "gradient": gradient_check(trainer, rows, s, a.seed), "samplers": sampler_check(trainer, rows, s, a.seed),
              "sampling": sampling_check(trainer, rows, s, a.seed)}
    text = json.dumps(result, indent=1)
    if a.out:
        Path(a.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
