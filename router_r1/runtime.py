"""A trained router outside training: its policy, the env section it was trained with, the pool.

Evaluation (router_r1/eval/evaluate.py), infer.py, the server (router_r1/serve.py), calibration
(router_r1/calibrate.py) and the scripts load a checkpoint here: the policy behind a transformers
rollout backend, the prompt template it was trained with (its prompt_template.txt), the env section of
its run_config.yaml (RouterEnvConfig, the one home of its keys; a checkpoint without one gets the paper
run's), overridden key by key by explicit flags (EnvOverrides), and the pool. The episodes themselves
are the training environment's, built by make_env.
"""
from __future__ import annotations

import itertools
import re
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Callable, ContextManager, Iterator, Optional

import numpy as np

from router_r1.pool.client import PoolClient
from router_r1.pool.registry import ModelRegistry, ModelSpec, RegistryError
from router_r1.pool.server import ServerThread
from router_r1.pool.world import SIM_POOL, world_of
from router_r1.prompts import DEFAULT_TEMPLATE, PLACEHOLDERS, TemplateError, load_template
from router_r1.router_env import SCHEDULES, RouterEnv, RouterEnvConfig, make_env
from router_r1.reward.format import FORMAT_RULE_SETS
from router_r1.reward.score import REWARD_METRICS
from verl.trainer.config import PROMPT_TEMPLATE_FILE, find_run_config, load_run_config, section_to_dataclass

# torch and transformers are imported inside the functions that need them, so that bad
# input (paths, columns, the pool) is reported in a second rather than after model imports.

PAPER_CONFIG = "router_r1"  # configs/router_r1.yaml: the env of a checkpoint without a run config


class EvalError(ValueError):
    """Input a trained router cannot be run on; the message names the file, column, field, flag, checkpoint or URL."""


LOAD_ERRORS = (EvalError, RegistryError, TemplateError)  # bad input: a one-line error, exit code 2


# ---------------------------------------------------------------------------------- settings

@dataclass
class EnvOverrides:
    """Keys of the run's env section (RouterEnvConfig, same names) that a flag may override; each None keeps
    the value the checkpoint was trained with."""

    max_turns: Optional[int] = None  # routing turns (default: the checkpoint's training run's)
    max_obs_length: Optional[int] = None  # tokens per <information> block (default: the run's)
    response_length: Optional[int] = None  # tokens per generated turn (default: the run's)
    max_response_length: Optional[int] = None  # tokens of all turns and observations together (default: the run's)
    schedule: Optional[str] = field(default=None, metadata={"choices": SCHEDULES})  # rollout schedule (default: the run's; greedy episodes are the same under all)
    alpha: Optional[float] = None  # cost weight: of the reward column, and the alpha told an alpha-conditioned router (default: the run's)
    format_rules: Optional[str] = field(default=None, metadata={"choices": FORMAT_RULE_SETS})  # format rule set of the format and reward columns (default: the run's)
    reward_metric: Optional[str] = field(default=None, metadata={"choices": REWARD_METRICS})  # answer metric that gates the reward column (default: the run's)
    call_timeout_s: Optional[float] = None  # seconds per pool call attempt (default: the run's)
    call_deadline_s: Optional[float] = None  # seconds per pool call with all its retries (default: the run's)
    max_concurrency: Optional[int] = None  # pool calls in flight per endpoint; more wait in the client (default: the run's)
    constrain_names: Optional[bool] = None  # decode each route's model name as one of the pool's, on the hf engine (evaluation and serving only: it leaves the policy's distribution) (default: the run's)
    invalid_hint: Optional[bool] = None  # after an invalid action, a corrective hint naming the pool's models, as the misname drill of `python -m sim.warm_start` (--misname-drill) shows it (default: the run's)

    def overrides(self) -> dict:
        """The keys a flag set, with their values."""
        return {f.name: getattr(self, f.name) for f in fields(EnvOverrides) if getattr(self, f.name) is not None}

    @staticmethod
    def values_in(env: RouterEnvConfig) -> dict:
        """The overridable keys' values in `env` (for start-up lines and summaries)."""
        return {f.name: getattr(env, f.name) for f in fields(EnvOverrides)}


@dataclass
class PoolFlags:
    """Which pool a trained router calls."""

    pool: Optional[str] = None  # pool yaml (default: the simulated pool, served in-process)
    pool_url: Optional[str] = None  # one endpoint for every model of the yaml (excludes --sim)
    sim: bool = False  # serve the pool in-process: the experts of the world its yaml names (`world: sim`)
    sim_seed: int = 0  # seed of the simulated world (must match the data's)
    sim_latency: float = 0.0  # scale of the simulated latencies (0: the sim answers at once)
    include_unseen: bool = False  # the router may call models marked unseen
    allow_unseen_models: bool = False  # go on where the router was trained to name none of the pool's models (router_r1/trained_names.py; without it that stops at start-up, and each model it was never trained to name is named)
    cache_dir: Optional[str] = None  # pool reply cache: a re-run costs the same and calls nothing

    def open(self, limits, default_pool: str | Path | None = None) -> ContextManager[Pool]:
        """open_pool of these flags (--pool, else `default_pool`) with the call limits of `limits` (an env section,
        or settings with the same call_timeout_s, call_deadline_s, max_concurrency)."""
        return open_pool(self.pool or default_pool, pool_url=self.pool_url, sim=self.sim, sim_seed=self.sim_seed,
                         sim_latency=self.sim_latency, include_unseen=self.include_unseen, cache_dir=self.cache_dir,
                         call_timeout_s=limits.call_timeout_s, call_deadline_s=limits.call_deadline_s,
                         max_concurrency=limits.max_concurrency)


@dataclass
class Decoding:
    """How the router's turns are decoded."""

    temperature: Optional[float] = None  # sample at this temperature (default: greedy, how a router answers best)
    top_p: float = 1.0  # nucleus sampling of sampled runs
    seed: int = 0  # sampling seed: generate call k of a run samples with (seed, k)
    greedy: bool = False  # decode greedily: the default without --temperature, said explicitly (excludes it)

    @property
    def is_greedy(self) -> bool:
        return self.temperature is None

    def check(self) -> None:
        if self.greedy and self.temperature is not None:
            raise EvalError("--greedy and --temperature exclude each other")
        if self.temperature is not None and not self.temperature > 0:
            raise EvalError(f"--temperature must be > 0, got {self.temperature} (leave it out for greedy)")

    def sampling(self):
        from verl.workers.rollout.base import SamplingParams

        if self.is_greedy:
            return SamplingParams(greedy=True, temperature=0.0)
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, seed=self.seed)


@dataclass
class TrainedEnv:
    """The env section a checkpoint was trained with, and where it came from (for start-up lines)."""

    env: RouterEnvConfig
    source: str  # its run_config.yaml, or the paper config it fell back to
    saved: bool  # whether it came from the checkpoint's own run config


def trained_env(checkpoint: str | Path | None, fallback: str = PAPER_CONFIG) -> TrainedEnv:
    """The env section of `checkpoint`'s run_config.yaml; a checkpoint without one (or trained in another
    environment) gets configs/<fallback>.yaml's. A key out of range or unknown is an EvalError naming the file."""
    run = load_run_config(checkpoint) if checkpoint is not None else None
    if run is not None and run.get("env") is not None and run.env.get("factory") == RouterEnvConfig.factory:
        where = str(find_run_config(checkpoint))
        try:
            env = section_to_dataclass(RouterEnvConfig, run.env, f"{where}: env")
        except ValueError as e:  # an unknown or mistyped key, named by section_to_dataclass
            raise EvalError(str(e)) from None
        return TrainedEnv(_checked(env, where), where, True)
    from verl.trainer.main_ppo import load_config

    env = section_to_dataclass(RouterEnvConfig, load_config(fallback).env, "env")
    return TrainedEnv(env, f"configs/{fallback}.yaml (no run_config.yaml)", False)


def _checked(env: RouterEnvConfig, where: str) -> RouterEnvConfig:
    try:
        env.check()
    except ValueError as e:
        raise EvalError(f"{where}: {e}") from None
    return env


def resolve_env(checkpoints: list, overrides: EnvOverrides, log=print, fallback: str = PAPER_CONFIG) -> RouterEnvConfig:
    """One env for a set of checkpoints: their training runs' (the checkpoints with a run_config.yaml; with none,
    configs/<fallback>.yaml's), each override applied. Runs trained with different values of an overridable key
    need its flag."""
    trained = [t for t in (trained_env(c, fallback) for c in checkpoints) if t.saved] or [trained_env(None, fallback)]
    set_by_flag = overrides.overrides()
    for f in fields(EnvOverrides):
        values = {t.source: getattr(t.env, f.name) for t in trained}
        if f.name not in set_by_flag and len(set(values.values())) > 1:
            raise EvalError(f"the checkpoints were trained with different env.{f.name} ({values}); "
                            f"pass --{f.name.replace('_', '-')}")
    env = _checked(replace(trained[0].env, **set_by_flag), "flags")
    log("settings from " + ", ".join(t.source for t in trained) + ": "
        + " ".join(f"{k}={v}" for k, v in EnvOverrides.values_in(env).items())
        + (f" (flags: {', '.join(set_by_flag)})" if set_by_flag else ""))
    return env


def episode_config(env: RouterEnvConfig, *, budget: int | None = None, budget_mode: str = "end",
                   max_turns: int | None = None, **keys) -> RouterEnvConfig:
    """The env of episodes played outside training: the prompts are the caller's (no alpha or budget drawn,
    none rebuilt); `budget` is a fixed turn limit (AdaTurn) whose overstep leads to `budget_mode`."""
    return replace(env, alphas=[], val_alpha=None, budgets=[] if budget is None else [budget], val_budget=None,
                   budget_in_prompt=False, budget_mode="end" if budget is None else budget_mode,
                   max_turns=env.max_turns if max_turns is None else max_turns, **keys)


# ---------------------------------------------------------------------------------- policy

@dataclass
class Policy:
    tokenizer: object
    generate: Callable  # GenerateFn: (prompts: list[list[int]], SamplingParams) -> list[GenOutput]
    template: str | None = None  # template for prompts built here (direct, infer); None: the default
    max_positions: int | None = None  # the model's context window, if its config says
    template_source: str | None = None  # the file `template` came from, for messages

    def template_mismatch(self, rows: list[tuple[str, list[dict]]]) -> str | None:
        """The first of `rows` (where, chat messages) whose prompt was not built from this policy's template (the
        default one without), as a message naming both; None when every prompt reads as the template filled in."""
        shape = template_pattern(DEFAULT_TEMPLATE if self.template is None else self.template)
        for where, messages in rows:
            content = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
            if not shape.fullmatch(content):
                template = self.template_source or ("the policy's template" if self.template is not None
                                                    else "the default template (router_r1/prompts.py)")
                return (f"{where}: its prompt was not built with {template}, the one this router is prompted "
                        f"with: it starts {content[:80]!r}")
        return None


def template_pattern(template: str) -> re.Pattern:
    """What a prompt built from `template` looks like: its text, with any text at each placeholder."""
    parts = re.split(r"\{(?:" + "|".join(PLACEHOLDERS) + r")\}", template)
    return re.compile(".*?".join(re.escape(p) for p in parts), re.S)


def resolve_checkpoint(path: str | Path) -> Path:
    """The model dir that --checkpoint names, one rule for evaluate (test.sh), infer.py, the server and calibration:
    an HF model dir as it is, else its hf/ export (a run's output dir, train.sh's OUT or OUT/ppo)."""
    path = Path(path)
    for model_dir in (path, path / "hf"):
        if (model_dir / "config.json").is_file():
            return model_dir
    why = (" is a training checkpoint (sharded state, no model): pass its run's hf/ export"
           if (path / "COMPLETE").is_file() else f" or {path / 'hf'} (no config.json)")
    raise EvalError(f"no checkpoint at {path}{why}; --checkpoint takes a run's output dir, its hf/ export or an "
                    "HF model dir (run bash train.sh first)")


def resolve_template(template_file: str | None, checkpoint: Path | None) -> tuple[str | None, str | None]:
    """(text, file) of --prompt-template, else of the checkpoint's prompt_template.txt, else (None, None): the
    default template."""
    path = Path(template_file) if template_file else (
        checkpoint / PROMPT_TEMPLATE_FILE if checkpoint is not None else None)
    if path is None or (not template_file and not path.is_file()):
        return None, None
    return load_template(path), str(path)


ROLLOUTS = ("auto", "hf", "hf_static")


def load_policy(checkpoint: str | Path, device: str | None = None, template_file: str | None = None,
                rollout: str = "auto", max_batch_size: int = 64, constrain_names: bool = False) -> Policy:
    """An HF model dir (config, weights, tokenizer) behind a transformers rollout backend: `auto` takes
    hf_static (static cache, CUDA graphs; what the GPU pipeline trains with) on CUDA where the model
    type allows, else the plain hf loop; with constrain_names always the hf loop, the one engine that applies it."""
    if constrain_names and rollout not in ("auto", "hf"):
        raise EvalError(f"--constrain-names is applied by the hf engine only, not --rollout {rollout}")
    if rollout not in ROLLOUTS:
        raise EvalError(f"--rollout must be one of {ROLLOUTS}, got {rollout!r}")
    path = resolve_checkpoint(checkpoint)
    import torch
    from transformers import AutoModelForCausalLM

    from verl.utils.tokenizer import load_tokenizer
    from verl.workers.rollout import build_rollout
    from verl.workers.rollout.static_rollout import SUPPORTED_TYPES

    from verl.utils.export_manifest import ExportError, nonfinite_weight, verify

    try:
        verify(path)  # the export's manifest: every weight file whole and unchanged
        tokenizer = load_tokenizer(str(path))
        model = AutoModelForCausalLM.from_pretrained(path)
    except ExportError as e:
        raise EvalError(f"damaged checkpoint: {e}") from e
    except Exception as e:
        why = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
        if type(e).__name__ == "SafetensorError":  # a cut or damaged file; safetensors' error names no file
            files = " or ".join(str(p) for p in sorted(path.glob("*.safetensors")))
            raise EvalError(f"cannot read the weights in {files} ({why})") from e
        if not isinstance(e, (OSError, ValueError)):
            raise
        raise EvalError(f"{path}: cannot load the checkpoint ({why})") from e
    if (bad := nonfinite_weight(model)) is not None:
        raise EvalError(f"{path}: weight {bad} holds NaN or inf (the run diverged, or the file was damaged); "
                        "this checkpoint cannot route")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if rollout == "auto" and constrain_names:
        rollout = "hf"
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
    template, source = resolve_template(template_file, path)
    return Policy(tokenizer, backend.generate, template, positions, source)


def seeded(generate: Callable) -> Callable:
    """Sampling with a seed gets a fresh, reproducible seed per generate call: call k uses (seed, k)."""
    calls = itertools.count()

    def wrapped(prompts, sampling):
        k = next(calls)
        if sampling.seed is not None and not sampling.is_greedy:
            sampling = replace(sampling, seed=int(np.random.SeedSequence([sampling.seed, k]).generate_state(1)[0]))
        return generate(prompts, sampling)

    # env.schedule=auto asks the engine behind a bound `generate` whether it wants whole batches
    wrapped.lockstep_batches = bool(getattr(getattr(generate, "__self__", None), "lockstep_batches", False))
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
              cache_dir: str | None = None, call_timeout_s: float = RouterEnvConfig.call_timeout_s,
              call_deadline_s: float = RouterEnvConfig.call_deadline_s,
              max_concurrency: int = RouterEnvConfig.max_concurrency) -> Iterator[Pool]:
    """The pool of a yaml, its endpoints checked; `sim` (or no yaml at all) serves the pool's world in-process."""
    if sim and pool_url:
        raise EvalError("--sim and --pool-url exclude each other: --sim serves the pool itself")
    sim = sim or (pool_yaml is None and pool_url is None)
    pool_yaml = Path(pool_yaml or SIM_POOL)
    server = None
    if sim:
        world = world_of(ModelRegistry.from_yaml(pool_yaml), "--sim")  # a missing or broken yaml is reported first
        server = ServerThread(world.make_backend(pool_yaml, seed=sim_seed, latency_scale=sim_latency))
        server.start()
        pool_url, where = server.url, f"simulated {pool_yaml} (seed {sim_seed}) at {server.url}"
    else:
        where = f"{pool_yaml} at {pool_url}" if pool_url else f"{pool_yaml} (endpoints of the yaml)"
    try:
        full = ModelRegistry.from_yaml(pool_yaml, base_url=pool_url)
        registry = full if include_unseen else full.seen()
        check_endpoints(list(registry.models.values()))
        client = PoolClient(full, timeout_s=call_timeout_s, deadline_s=call_deadline_s,
                            max_concurrency_per_endpoint=max_concurrency, cache_dir=cache_dir)
        try:
            yield Pool(registry, full, client, where)
        finally:
            client.close()
    finally:
        if server is not None:
            server.stop()


def episode_env(cfg: RouterEnvConfig, policy: Policy, pool: Pool) -> RouterEnv:
    """The training environment over a loaded policy and an open pool (validation mode: reports, never stops)."""
    return make_env(cfg, policy.tokenizer, registry=pool.registry, client=pool.client, template=policy.template)


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


def quiet_transformers() -> None:
    """No progress bars or load reports from transformers on the console."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
