"""Route one question with a trained router and show its trajectory, turn by turn.

    python infer.py --question "Who founded Mebrolond Systems?"   # embedded checkpoint, simulated pool
    python infer.py --question "..." --checkpoint DIR --pool configs/pool/paper.yaml [--pool-url URL]
    python infer.py --question "..." --json --gold "Tekrel Ratis"  # one JSON object, with EM/F1
    python infer.py --question "..." --budget 1 --budget-mode forced  # a turn budget (AdaTurn)

Each turn shows the policy's thinking, its route (model and sub-question) or answer, the
pool's reply with the call's cost and latency, and the generation time. Colour only on a
terminal. Without --pool the simulated pool is served in-process, with its simulated
latencies (--sim-latency 0 answers at once). The prompt is the checkpoint's
prompt_template.txt when it has one (--prompt-template overrides), else the default.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from router_r1.eval.evaluate import (USER_ERRORS, EvalError, Policy, Pool, check_checkpoint, fit_context, load_policy,
                                     open_pool, quiet_transformers, seeded, tokenize_prompt)
from router_r1.prompts import BUDGET_EXHAUSTED_TEXT, build_router_prompt
from router_r1.reward.format import check_format
from router_r1.reward.qa_em import em_score, extract_answer, f1_score

DEFAULT_CHECKPOINT = Path(__file__).resolve().parent / "outputs" / "embedded" / "hf"
_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
STYLE = {"think": "2", "route": "36", "info": "33", "answer": "1;32", "bad": "31", "head": "1"}


def run_question(question: str, policy: Policy, pool: Pool, rcfg, sampling, gold: list[str] | None = None,
                 budget: int | None = None) -> dict:
    """One episode of the training rollout (validation mode) for `question`, as a plain record.

    With `budget`, the prompt states it (when the template has {budget}) and rcfg should carry it as its budgets.
    """
    from router_r1.reward.score import RewardConfig
    from router_r1.router_env import RouterEnv
    from verl.trainer.dataset import PromptRow

    template = policy.template
    with_budget = budget is not None and (template is None or "{budget}" in template)
    prompt = tokenize_prompt(policy.tokenizer, build_router_prompt(question, pool.registry, template,
                                                                   turn_budget=budget if with_budget else None))
    rcfg = fit_context([prompt], ["--question"], policy, rcfg, log=lambda msg: print(msg, file=sys.stderr))
    gen_s: list[float] = []

    def timed(prompts, sampling):  # one prompt, so one call per turn
        t0 = time.perf_counter()
        out = policy.generate(prompts, sampling)
        gen_s.append(time.perf_counter() - t0)
        return out

    env = RouterEnv(rcfg, policy.tokenizer, pool.registry, pool.client, RewardConfig())
    result = env.rollout([PromptRow(prompt, "q", {})], seeded(timed), sampling, validate=True)
    text, info = result.info["text"][0], {k: v[0] for k, v in result.info.items()}
    turns = []
    for k, t in enumerate(info["turns"]):
        think = _THINK.search(t["generated"] or "")
        turns.append({"turn": k + 1, "think": think.group(1).strip() if think else None,
                      "generation_s": gen_s[k] if k < len(gen_s) else None,
                      **{key: t.get(key) for key in ("action", "model", "query", "answer", "reason", "ok", "error",
                                                     "cost_usd", "latency_s", "information", "generated", "refused")}})
    ok, reason = check_format(text, pool.registry)
    record = {"question": question, "prompt_tokens": len(prompt), "answer": extract_answer(text),
              "format_ok": ok, "format_reason": reason, "cost_usd": info["cost_usd"], "calls": info["route_count"],
              "pool_failures": info["pool_failures"], "hit_budget": info["hit_budget"], "truncated": info["truncated"],
              "turn_budget": budget, "forced": info["forced"],
              "turns": turns,
              "latencies": {"generation_s": gen_s, "pool_s": [t["latency_s"] for t in turns if t["ok"] is not None]},
              "response": text}
    if gold:
        record.update(gold=gold, em=em_score(record["answer"], gold), f1=f1_score(record["answer"], gold))
    return record


def _clip(text: str, n: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def render(record: dict, color: bool) -> str:
    """The trajectory as readable lines; ANSI colour when `color`."""
    def c(style: str, text: str) -> str:
        return f"\x1b[{STYLE[style]}m{text}\x1b[0m" if color else text

    lines = [c("head", "Question: ") + record["question"]]
    for t in record["turns"]:
        gen = f" (generation {t['generation_s']:.2f} s)" if t["generation_s"] is not None else ""
        lines.append(c("head", f"Turn {t['turn']}") + gen)
        if t["think"]:
            lines.append("  think   " + c("think", _clip(t["think"])))
        if t["action"] == "route":
            lines.append("  route   " + c("route", f"{t['model']}: {t['query']}"))
            if t.get("refused"):
                lines.append("  info    " + c("bad", "refused, the turn budget is spent: ") + c("info", BUDGET_EXHAUSTED_TEXT))
            elif t["ok"] is None:
                lines.append("  info    " + c("bad", "not called: the turn or length budget was spent"))
            elif t["ok"]:
                lines.append("  info    " + c("info", _clip(t["information"] or ""))
                             + f"  [${t['cost_usd']:.6f}, {t['latency_s']:.2f} s]")
            else:
                lines.append("  info    " + c("bad", f"call failed ({t['error']})") + f"  [{t['latency_s']:.2f} s]")
        elif t["action"] == "answer":
            lines.append("  answer  " + c("answer", t["answer"] or ""))
        else:
            why = t["reason"] or "no action tag"
            lines.append("  " + c("bad", f"invalid ({why}): ") + repr(_clip(t["generated"] or "", 200)))
    answer = record["answer"] if record["answer"] is not None else "(none)"
    fmt = "format ok" if record["format_ok"] else f"format broken: {record['format_reason']}"
    verdict = f"  EM {record['em']:.0f}  F1 {record['f1']:.2f}  (gold: {' | '.join(record['gold'])})" \
        if "em" in record else ""
    lines.append(c("head", "Answer: ") + c("answer", answer) + f"  [{fmt}]" + verdict)
    lat = record["latencies"]
    lines.append(f"Cost: ${record['cost_usd']:.6f} ({record['cost_usd'] * 1e6:.2f} x 1e-6 USD) over "
                 f"{record['calls']} call(s); pool {sum(lat['pool_s']):.2f} s, "
                 f"generation {sum(lat['generation_s']):.2f} s")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python infer.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--question", required=True)
    p.add_argument("--checkpoint", default=str(DEFAULT_CHECKPOINT), help="HF model dir (default: the embedded one)")
    p.add_argument("--pool", default=None, help="pool yaml (default: the simulated pool, served in-process)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--pool-url", default=None, help="endpoint for every model of the yaml")
    src.add_argument("--sim", action="store_true", help="serve the pool yaml's sim profiles in-process")
    p.add_argument("--sim-seed", type=int, default=0)
    p.add_argument("--sim-latency", type=float, default=1.0, help="sim latency scale (0: answer at once)")
    p.add_argument("--include-unseen", action="store_true", help="the router may call models marked unseen")
    p.add_argument("--temperature", type=float, default=None, help="sample at this temperature (default greedy)")
    p.add_argument("--seed", type=int, default=0)
    trained = " (default: the checkpoint's training run's, from its run_config.yaml)"
    p.add_argument("--max-turns", type=int, default=None, help="routing turns" + trained)
    p.add_argument("--max-obs-length", type=int, default=None, help="tokens per <information> block" + trained)
    p.add_argument("--response-length", type=int, default=None, help="tokens per generated turn" + trained)
    p.add_argument("--max-response-length", type=int, default=None,
                   help="tokens of all turns and observations" + trained)
    p.add_argument("--prompt-template", default=None)
    p.add_argument("--budget", type=int, default=None, metavar="N",
                   help="turn budget: at most N routing turns, stated in the prompt (replaces --max-turns)")
    p.add_argument("--budget-mode", choices=("end", "forced"), default="forced",
                   help="a route past the budget: refuse it and ask for the answer (default) or end there")
    p.add_argument("--gold", nargs="+", default=None, help="gold answer(s): adds EM and F1")
    p.add_argument("--device", default=None)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    try:
        if not a.question.strip():
            raise EvalError("--question is empty")
        check_checkpoint(a.checkpoint)  # before the model imports and the pool start
        if a.budget is not None and a.budget < 0:
            raise EvalError(f"--budget must be >= 0, got {a.budget}")
        if a.temperature is not None and not a.temperature > 0:
            raise EvalError(f"--temperature must be > 0, got {a.temperature} (leave it out for greedy)")
        with open_pool(a.pool, pool_url=a.pool_url, sim=a.sim, sim_seed=a.sim_seed, sim_latency=a.sim_latency,
                       include_unseen=a.include_unseen) as pool:
            quiet_transformers()
            policy = load_policy(a.checkpoint, a.device, a.prompt_template)
            from router_r1.router_env import paper_env_config, trained_env_config
            from router_r1.router_env import RouterConfig
            from verl.workers.rollout.base import SamplingParams

            trained = trained_env_config(a.checkpoint) or paper_env_config()  # a flag overrides
            shape = {k: getattr(a, k) if getattr(a, k) is not None else getattr(trained, k)
                     for k in ("max_turns", "max_obs_length", "response_length", "max_response_length")}
            rcfg = RouterConfig(**shape,
                                schedule="sync", budgets=() if a.budget is None else (a.budget,),
                                budget_in_prompt=False, budget_mode=a.budget_mode if a.budget is not None else "end")
            sampling = SamplingParams(greedy=True, temperature=0.0) if a.temperature is None else \
                SamplingParams(temperature=a.temperature, seed=a.seed)
            record = run_question(a.question, policy, pool, rcfg, sampling, a.gold, a.budget)
            record.update(checkpoint=a.checkpoint, pool=pool.where)
    except USER_ERRORS as e:
        print(f"error: {str(e).replace(chr(10), ' ')}", file=sys.stderr)
        return 2
    print(json.dumps(record, ensure_ascii=False) if a.json else render(record, color=sys.stdout.isatty()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
