"""Route one question with a trained router and show its trajectory, turn by turn.

    python infer.py --question "Who founded Mebrolond Systems?"   # embedded checkpoint, simulated pool
    python infer.py --question "..." --checkpoint DIR --pool configs/pool/paper.yaml [--pool-url URL]
    python infer.py --question "..." --json --gold "Tekrel Ratis"  # one JSON object, with EM/F1
    python infer.py --question "..." --budget 1 --budget-mode forced  # a turn budget (AdaTurn)

Each turn shows the policy's thinking, its route (model and sub-question) or answer, the
pool's reply with the call's cost and latency, and the generation time. Colour only on a
terminal. Without --pool the simulated pool is served in-process, with its simulated
latencies (--sim-latency 0 answers at once). The prompt is the checkpoint's
prompt_template.txt when it has one (--prompt-template overrides), else the default; its
listing is the pool's in use. At start it names the pool's models the router was never
trained to name, and stops where that is all of them (--allow-unseen-models goes on).
"""
from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

from router_r1.flags import from_args, parser_for, run_command
from router_r1.prompts import BUDGET_EXHAUSTED_TEXT, build_router_prompt
from router_r1.reward.format import check_format
from router_r1.reward.qa_em import em_score, extract_answer, f1_score
from router_r1.router_env import RouterEnvConfig
from router_r1.runtime import (LOAD_ERRORS, Decoding, EnvOverrides, EvalError, Policy, Pool, PoolFlags,
                               episode_config, episode_env, fit_context, load_policy, quiet_transformers,
                               resolve_checkpoint, resolve_env, seeded, tokenize_prompt, trained_env)
from router_r1.trained_names import check_trained_names

DEFAULT_CHECKPOINT = Path(__file__).resolve().parent / "outputs" / "embedded" / "hf"
_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
STYLE = {"think": "2", "route": "36", "info": "33", "answer": "1;32", "bad": "31", "head": "1"}


@dataclass
class InferConfig(PoolFlags, EnvOverrides, Decoding):
    """infer.py's settings; each field is a flag (router_r1/flags.py)."""

    question: str = field(default="", metadata={"required": True})  # the question to route (the embedded pool answers questions about its made-up world, sim/qa.py)
    checkpoint: str = str(DEFAULT_CHECKPOINT)  # HF model dir, or a run's output dir (default: the embedded one, outputs/embedded/hf)
    sim_latency: float = 1.0  # scale of the simulated latencies (0: the sim answers at once)
    prompt_template: Optional[str] = None  # template file of the router prompt (default: the checkpoint's prompt_template.txt, else the default template)
    budget: Optional[int] = field(default=None, metadata={"metavar": "N"})  # turn budget: at most N routing turns, stated in the prompt (replaces --max-turns)
    budget_mode: str = field(default="forced", metadata={"choices": ("end", "forced")})  # a route past the budget: refuse it and ask for the answer (forced), or end there
    gold: Optional[list[str]] = None  # gold answer(s): adds EM and F1
    device: Optional[str] = None  # torch device (default: cuda if available)
    json: bool = False  # print one JSON object instead of the turns


def run_question(question: str, policy: Policy, pool: Pool, rcfg: RouterEnvConfig, sampling,
                 gold: list[str] | None = None, budget: int | None = None, alpha: float | None = None) -> dict:
    """One episode of the training rollout (validation mode) for `question`, as a plain record.

    With `budget`, the prompt states it (when the template has {budget}) and rcfg should carry it as its budgets;
    `alpha` is stated in the prompt of an alpha-conditioned router.
    """
    from verl.trainer.dataset import PromptRow

    template = policy.template
    with_budget = budget is not None and (template is None or "{budget}" in template)
    prompt = tokenize_prompt(policy.tokenizer, build_router_prompt(question, pool.registry, template,
                                                                   turn_budget=budget if with_budget else None,
                                                                   alpha=alpha))
    rcfg = fit_context([prompt], ["--question"], policy, rcfg, log=lambda msg: print(msg, file=sys.stderr))
    gen_s: list[float] = []

    def timed(prompts, sampling):  # one prompt, so one call per turn
        t0 = time.perf_counter()
        out = policy.generate(prompts, sampling)
        gen_s.append(time.perf_counter() - t0)
        return out

    env = episode_env(rcfg, policy, pool)
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


def parse_args(argv: list[str] | None = None) -> InferConfig:
    p = parser_for(InferConfig, "python infer.py", __doc__.split("\n\n")[0])
    return from_args(InferConfig, p.parse_args(argv))


def ask(a: InferConfig) -> dict:
    """One question's record: the checks, then the pool, the policy and one episode."""
    if not a.question.strip():
        raise EvalError("--question is empty")
    a = replace(a, checkpoint=str(resolve_checkpoint(a.checkpoint)))  # before the model imports and the pool start
    if a.budget is not None and a.budget < 0:
        raise EvalError(f"--budget must be >= 0, got {a.budget}")
    a.check()
    env = resolve_env([a.checkpoint], a if a.schedule else replace(a, schedule="sync"), log=lambda msg: None)
    conditioned = trained_env(a.checkpoint).env.alphas
    alpha = (a.alpha if a.alpha is not None else conditioned[0]) if conditioned else None
    with a.open(env) as pool:
        check_trained_names(a.checkpoint, pool.registry, a.prompt_template, a.allow_unseen_models,
                            log=lambda msg: print(msg, file=sys.stderr))
        quiet_transformers()
        policy = load_policy(a.checkpoint, a.device, a.prompt_template, constrain_names=env.constrain_names)
        rcfg = episode_config(env, budget=a.budget, budget_mode=a.budget_mode)
        record = run_question(a.question, policy, pool, rcfg, a.sampling(), a.gold, a.budget, alpha)
        record.update(checkpoint=a.checkpoint, pool=pool.where)
    return record


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)

    def show(record: dict) -> None:
        print(json.dumps(record, ensure_ascii=False) if a.json else render(record, color=sys.stdout.isatty()))

    return run_command(lambda: ask(a), LOAD_ERRORS, show, code=2)


if __name__ == "__main__":
    sys.exit(main())
