"""After each weight sync, does vLLM decode what the actor would? (one GPU, a real small policy)

The actor is the HF model (bf16) on the GPU; between syncs it takes real AdamW steps on a fixed text,
so its weights move. Each round: vLLM sleeps (free GPU memory read before and after), the actor trains,
`VLLMRollout.update_weights(actor.state_dict())`, then greedy decoding of a fixed prompt set by vLLM and
by the actor (transformers `generate`, greedy): rows identical, tokens equal, and the actor's
teacher-forced argmax on vLLM's tokens (bf16 near-ties can part two correct decoders; the argmax
agreement and log-prob gap say whether the weights are the same). The last round's vLLM tokens
against the new actor show what a sync that did nothing would read.

    python -m tools.check.check_vllm_sync --model /tmp/smol --rounds 3 --out sync.json
"""
from __future__ import annotations

import argparse
import json

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.vllm_rollout import VLLMRollout

GIB = 1 << 30
QUESTIONS = ["What is the capital of France?", "Name three primary colors.", "Who wrote Hamlet?",
             "What is 12 times 7?", "Describe a cat in one sentence.", "What does a router do?",
             "Translate 'good morning' to Spanish.", "Why is the sky blue?", "List two prime numbers.",
             "What is the boiling point of water?", "Give a synonym for happy.", "Who painted the Mona Lisa?",
             "What is photosynthesis?", "How many legs does a spider have?", "What is the largest ocean?",
             "Write a haiku about rain."]
TRAIN_TEXT = ("<think>The question asks for a capital.</think> <search>Qwen2.5-7B-Instruct: capital of "
              "France</search> <information>Paris</information> <answer>Paris</answer>")


def free_gib() -> float:
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0] / GIB


@torch.no_grad()
def actor_greedy(model, prompts, new: int) -> list[list[int]]:
    outs = []
    for p in prompts:  # one row at a time: no padding, the plainest reference
        ids = torch.tensor([p], device=model.device)
        g = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new)
        outs.append(g[0, len(p):].tolist())
    return outs


@torch.no_grad()
def teacher_forced(model, prompt, gen) -> tuple[float, float]:
    """(fraction of gen's tokens that are the actor's argmax, the actor's log-prob of each of them)."""
    ids = torch.tensor([prompt + gen], device=model.device)
    logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()  # (len(gen), vocab)
    argmax_eq = (logits.argmax(-1) == torch.tensor(gen, device=model.device)).float().mean()
    lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(gen, device=model.device)[:, None])[:, 0]
    return float(argmax_eq), lp


def compare(model, prompts, vouts, new: int) -> dict:
    ref = actor_greedy(model, prompts, new)
    v = [o.token_ids for o in vouts]
    rows_equal = sum(a == b for a, b in zip(v, ref)) / len(v)
    tok_equal = sum(x == y for a, b in zip(v, ref) for x, y in zip(a, b)) / sum(max(len(a), len(b)) for a, b in zip(v, ref))
    argmax, gaps = [], []
    for p, o in zip(prompts, vouts):
        if not o.token_ids:
            continue
        eq, lp = teacher_forced(model, p, o.token_ids)
        argmax.append(eq)
        if o.logprobs is not None:
            gaps.append((torch.tensor(o.logprobs, device=lp.device) - lp).abs())
    out = {"rows_identical": rows_equal, "tokens_equal": tok_equal,
           "teacher_forced_argmax_agreement": sum(argmax) / len(argmax)}
    if gaps:
        g = torch.cat(gaps)
        out.update(logprob_gap_mean=float(g.mean()), logprob_gap_max=float(g.max()))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="HF directory of the policy (vLLM starts from it)")
    p.add_argument("--rounds", type=int, default=3, help="weight-sync rounds")
    p.add_argument("--steps-per-round", type=int, default=3, help="optimizer steps between syncs")
    p.add_argument("--lr", type=float, default=1e-5, help="learning rate of those steps")
    p.add_argument("--new-tokens", type=int, default=48, help="tokens generated per check")
    p.add_argument("--sleep-level", type=int, default=1, help="vLLM sleep level between rounds (1 or 2)")
    p.add_argument("--out", default=None, help="write the record as JSON here")
    args = p.parse_args()
    tok = AutoTokenizer.from_pretrained(args.model)
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
               for q in QUESTIONS]
    prompts = [list(x["input_ids"]) if isinstance(x, dict) or hasattr(x, "keys") else list(x) for x in prompts]
    free0 = free_gib()
    engine = VLLMRollout(args.model, device="cuda:0", gpu_memory_utilization=0.3, sleep_level=args.sleep_level,
                         max_model_len=1024)
    actor = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).cuda()
    opt = torch.optim.AdamW(actor.parameters(), lr=args.lr)
    train_ids = torch.tensor([tok(TRAIN_TEXT)["input_ids"]], device="cuda")
    greedy = SamplingParams(greedy=True, max_new_tokens=args.new_tokens, return_logprobs=True)
    report = {"free_gib_before_engine": free0, "rounds": []}
    vouts = engine.generate(prompts, greedy)
    report["round0_start_weights"] = compare(actor, prompts, vouts, args.new_tokens)
    print("start weights:", report["round0_start_weights"], flush=True)
    for r in range(1, args.rounds + 1):
        rec = {"round": r, "free_gib_awake": free_gib()}
        engine.sleep()
        rec["free_gib_asleep"] = free_gib()
        actor.train()
        for _ in range(args.steps_per_round):  # real updates: the weights move
            loss = actor(input_ids=train_ids, labels=train_ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        actor.eval()
        rec["loss"] = float(loss)
        rec["stale_engine_vs_new_actor"] = compare(actor, prompts, vouts, args.new_tokens)  # the no-sync reading
        t0 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0[0].record()
        engine.update_weights(actor.state_dict())
        t0[1].record()
        torch.cuda.synchronize()
        rec["sync_ms"] = t0[0].elapsed_time(t0[1])
        rec["free_gib_after_sync"] = free_gib()
        vouts = engine.generate(prompts, greedy)
        rec["after_sync"] = compare(actor, prompts, vouts, args.new_tokens)
        report["rounds"].append(rec)
        print(json.dumps(rec), flush=True)
    engine.shutdown()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
