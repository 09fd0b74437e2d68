"""The routing environment: its config section (`env`, configs/env/router.yaml), the multi-turn rollout
(generation interleaved with pool calls), the reward, and the factory the engine calls.

Three schedules produce the same kind of episodes (greedy episodes are identical under all); "auto" picks one:
- "continuous" (default): one coroutine per episode, as veRL's agent loop runs them:
  generate a turn, call the pool, generate the next turn, each the moment its input is
  ready, through the engine's async `generate_one`. The engine decides the batching
  (vLLM's async engine, hf_static's slots; a batch backend gets `as_async`, which sends
  whoever is waiting whenever the engine is free). No knobs.
- "sync": every turn generates for all live episodes, then waits for all their pool
  calls (the reference's schedule: the slowest call of the batch gates the next turn);
- "overlap": the earlier schedule, kept for comparison: an episode goes back to a queue the
  moment its pool call returns, and a batch `generate` takes whoever is ready once a share of
  the episodes is ready or the oldest has waited long enough (overlap_min_ready/max_wait_s);
- "auto": sync where the engine says whole batches are cheaper (`lockstep_batches`: the hf loop on the CPU,
  which pays per call and per decode step, not per row) and nothing needs continuous (no branch_turns);
  continuous otherwise.

With `sampling.return_logprobs` the result carries `info["rollout_log_probs"]`: per response
token, the sampling engine's log-prob for policy tokens and 0 for environment tokens (the
behaviour policy's log-probs that off-policy training corrects against).

Turn budgets (AdaTurn, off unless `budgets` is set): each prompt gets a budget T_max drawn
from `budgets`, stated in its prompt and used as its episode's routing limit; what a
route asked for after the budget is spent leads to is `budget_mode` (episode.BUDGET_MODES).

Forked groups (off unless `branch_turns` is set; training, continuous schedule): the rollout.n episodes of a
prompt share one trunk up to a turn drawn per group, then each samples that turn and the rest alone, so their
rewards compare the fork turn's choices (which model to ask) from one prefix. `info["branch_mask"]` marks each
episode's fork turn; the trainer credits those tokens against their siblings (ppo_trainer._advantages). Tree
rollouts that branch at tool calls: ARPO (Dong et al., 2025), TreeRPO (Yang et al., 2025).

Alpha conditioning (off unless `alphas` is set): each prompt gets a cost weight alpha drawn
from `alphas`, stated in its prompt (prompts.alpha_text), and its reward uses that alpha; the
cost normaliser's window is shared by all alphas. One policy then serves any cost preference.
"""
from __future__ import annotations

import asyncio
import copy
import logging
import zlib
from dataclasses import dataclass, field, replace
from typing import Optional

import numpy as np
from omegaconf import II

from router_r1.pool.client import PoolClient, ReplyLimits, RouteRequest
from router_r1.pool.health import PoolHealth
from router_r1.pool.preflight import data_command, pool_problems
from router_r1.pool.registry import ModelRegistry
from router_r1.pool.world import Truth, answer_key
from router_r1.prompts import build_router_prompt, load_template
from router_r1.actions import STOP_STRINGS
from router_r1.name_constraint import RouteNameConstraint
from router_r1.reward.cost import COST_FIELDS, CostNormalizer
from router_r1.reward.format import FORMAT_RULES
from router_r1.reward.score import RewardConfig, compute_scores
from router_r1.row_check import check_router_row
from router_r1.episodes.episode import Episode, TurnRules
from router_r1.episodes.logprob_track import LogprobTrack
from router_r1.routing_collapse import collapse_metrics
from router_r1.stages import stage_metrics, trajectory_stages
from router_r1.token_parts import PART_NAMES, names_pattern, response_parts
from verl.trainer.config import section_to_dataclass
from verl.trainer.env_interface import GenerateFn, RolloutResult
from verl.workers.rollout.base import AsyncRolloutBackend, SamplingParams, as_async

SCHEDULES = ("continuous", "sync", "overlap", "auto")


class RouterEnv:
    """The routing environment behind the engine's Env interface."""

    check_row = staticmethod(check_router_row)  # PromptDataset's row_check: every row, at load time
    part_names = PART_NAMES  # what token_parts' ids 1.. name (the trainer's part/* metrics)

    def __init__(self, cfg: "RouterEnvConfig", tokenizer, registry: ModelRegistry, client: PoolClient,
                 health: PoolHealth | None = None, template: str | None = None, truth: Truth | None = None):
        """`template`: the prompt template's text for prompts rebuilt here (budgets, alphas); None reads
        cfg.prompt_template (a file), else the default template."""
        cfg.check()
        self.cfg = cfg
        self.tok = tokenizer
        self.registry = registry
        self._think_names = names_pattern(n for m in registry.models.values() for n in (m.name, *m.aliases))
        self.client = client
        self.reward = cfg.reward_config()
        self.template = template if template is not None else (
            load_template(cfg.prompt_template) if cfg.prompt_template else None)
        # pool failure rate per batch; stops a training run whose pool keeps failing
        self.health = health or PoolHealth(
            cfg.max_pool_failure_rate, cfg.pool_failure_patience,
            hint=f"Pool settings in force: env.call_timeout_s={cfg.call_timeout_s:g}, env.call_deadline_s="
                 f"{cfg.call_deadline_s:g}, env.max_concurrency={cfg.max_concurrency}, pool {cfg.pool}"
                 + (f" at {cfg.pool_url}" if cfg.pool_url else "") + "; check the pool server's log.")
        self.truth = truth  # a simulated pool's answer key, for the expert and two-hop stages (None: world-free stages)
        self.rules = TurnRules(tokenizer, registry, cfg.max_turns, cfg.max_obs_length,
                               cfg.max_response_length, cfg.invalid_hint, cfg.budget_mode)
        self._names: RouteNameConstraint | None = None  # env.constrain_names' constraint, built on first use
        # Separate windows: validation must not shift the training reward (a reference defect).
        self.normalizers = {"train": CostNormalizer(), "val": CostNormalizer()}
        self._auto_said: str | None = None  # what schedule=auto last resolved to (said once per change)

    # ------------------------------------------------------------------ episodes
    def turn_sampling(self, sampling: SamplingParams, validate: bool = True) -> SamplingParams:
        """A turn's sampling: up to the first action's closing tag, at most response_length tokens (and the route
        names held to the pool's under env.constrain_names, which training rollouts refuse)."""
        constraint = sampling.constraint
        if self.cfg.constrain_names and not validate:
            raise ValueError("env.constrain_names decodes route names outside the policy's own distribution: "
                             "for evaluation and serving only, not training rollouts")
        if self.cfg.constrain_names and constraint is None:
            if self._names is None:
                self._names = RouteNameConstraint(self.rules.tok, self.rules.registry.names)
            constraint = self._names
        return replace(sampling, stop=tuple(STOP_STRINGS), max_new_tokens=self.cfg.response_length,
                       constraint=constraint)

    def budget_of(self, uid: str, sampling: SamplingParams, validate: bool) -> int | None:
        """T_max of one prompt: a pure function of (budget_seed, uid, sampling seed), None without budgets.

        In training the sampling seed is trainer.seed + step, so a prompt seen again gets a
        fresh draw and a resumed run draws what the uninterrupted one did; the n samples of
        a GRPO group share their uid and seed, hence their budget.
        """
        if not self.cfg.budgets:
            return None
        if validate and self.cfg.val_budget is not None:
            return self.cfg.val_budget
        key = [self.cfg.budget_seed, zlib.crc32(str(uid).encode())]
        if not validate:
            key.append(0 if sampling.seed is None else int(sampling.seed))
        rng = np.random.default_rng(key)
        return self.cfg.budgets[int(rng.integers(len(self.cfg.budgets)))]

    def alpha_of(self, uid: str, sampling: SamplingParams, validate: bool) -> float | None:
        """The prompt's cost weight: drawn as budget_of draws T_max (its own stream), None without alphas."""
        if not self.cfg.alphas:
            return None
        if validate and self.cfg.val_alpha is not None:
            return self.cfg.val_alpha
        key = [self.cfg.alpha_seed, zlib.crc32(str(uid).encode()), 1]  # 1: a stream apart from the budget's
        if not validate:
            key.append(0 if sampling.seed is None else int(sampling.seed))
        rng = np.random.default_rng(key)
        return self.cfg.alphas[int(rng.integers(len(self.cfg.alphas)))]

    def fork_turn_of(self, uid: str, sampling: SamplingParams) -> int:
        """The turn a training group forks at: drawn from branch_turns as alpha_of draws (its own stream)."""
        key = [zlib.crc32(str(uid).encode()), 2, 0 if sampling.seed is None else int(sampling.seed)]
        return self.cfg.branch_turns[int(np.random.default_rng(key).integers(len(self.cfg.branch_turns)))]

    def groups_of(self, rows, sampling: SamplingParams, validate: bool) -> list[tuple[list[int], int | None]]:
        """Runs of rows with one uid (a prompt's rollout.n samples), each with its fork turn; None: played apart."""
        if not self.cfg.branch_turns or validate:
            return [([i], None) for i in range(len(rows))]
        runs: list[list[int]] = []
        for i, r in enumerate(rows):
            if runs and rows[runs[-1][0]].uid == r.uid:
                runs[-1].append(i)
            else:
                runs.append([i])
        return [(idx, self.fork_turn_of(rows[idx[0]].uid, sampling) if len(idx) > 1 else None) for idx in runs]

    def row_load(self, row, sampling: SamplingParams, validate: bool) -> float:
        """The row's routing limit as its episode will have it: the engine's hint for spreading rows over ranks."""
        budget = self.budget_of(row.uid, sampling, validate)
        return float(self.cfg.max_turns if budget is None else budget)

    def budget_prompt(self, row, budget: int | None, i: int, alpha: float | None = None) -> list[int]:
        """The row's prompt rebuilt from its question with the budget and cost-weight sentences."""
        info = row.fields.get("extra_info") or {}
        question = info.get("question") if isinstance(info, dict) else None
        if not isinstance(question, str) or not question.strip():
            why = "env.alphas" if budget is None else "env.budget_in_prompt"
            raise ValueError(f"row {i} (uid {row.uid}): {why} needs extra_info.question")
        messages = build_router_prompt(question, self.registry, self.template, turn_budget=budget,
                                       alpha=alpha)
        text = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def episodes_for(self, rows, sampling: SamplingParams, validate: bool) -> list[Episode]:
        episodes = []
        for i, r in enumerate(rows):
            budget = self.budget_of(r.uid, sampling, validate)
            alpha = self.alpha_of(r.uid, sampling, validate)
            stated = budget if self.cfg.budget_in_prompt else None
            ids = list(r.prompt_ids)
            if stated is not None or alpha is not None:
                ids = self.budget_prompt(r, stated, i, alpha)
            episodes.append(Episode(prompt_ids=ids, max_turns=budget))
        return episodes

    def rollout(self, rows, generate: GenerateFn | AsyncRolloutBackend, sampling: SamplingParams,
                validate: bool) -> RolloutResult:
        """Play one episode per row. `generate` is a batch function, or an engine with async
        `generate_one` (the continuous schedule uses it directly; the others need a batch function)."""
        schedule = self.schedule_for(generate)
        if schedule == "continuous":
            return self.client.run(self.rollout_async(rows, as_async(generate), sampling, validate))
        if not callable(generate):
            raise ValueError(f"env.schedule={schedule!r} needs a batch generate function; "
                             f"{type(generate).__name__} only has generate_one (use schedule=continuous)")
        episodes = self.episodes_for(rows, sampling, validate)
        alphas = [self.alpha_of(r.uid, sampling, validate) for r in rows]
        sampling = self.turn_sampling(sampling, validate)
        track = LogprobTrack(episodes) if sampling.return_logprobs else None
        if schedule == "sync":
            self._run_sync(episodes, generate, sampling, track)
        else:
            self.client.run(self._run_overlap(episodes, generate, sampling, track))
        return self._result(episodes, track, alphas)

    def schedule_for(self, generate) -> str:
        """The schedule `rollout` plays with this engine: env.schedule, with auto resolved (logged once)."""
        if self.cfg.schedule != "auto":
            return self.cfg.schedule
        lockstep = bool(getattr(generate, "lockstep_batches", False)) and callable(generate)
        schedule = "sync" if lockstep and not self.cfg.branch_turns else "continuous"
        if self._auto_said != schedule:
            self._auto_said = schedule
            why = ("the engine decodes whole batches cheaper" if schedule == "sync" else
                   "forked groups need it" if lockstep else "the engine does not ask for whole batches")
            print(f"env.schedule=auto plays {schedule}: {why}", flush=True)
        return schedule

    async def rollout_async(self, rows, engine: AsyncRolloutBackend, sampling: SamplingParams,
                            validate: bool) -> RolloutResult:
        """The continuous schedule on the running loop: one coroutine per row, through `generate_one`
        (`rollout` runs it; streaming rollouts await it per prompt group on `submit`'s loop)."""
        episodes = self.episodes_for(rows, sampling, validate)
        alphas = [self.alpha_of(r.uid, sampling, validate) for r in rows]
        groups = self.groups_of(rows, sampling, validate)
        sampling = self.turn_sampling(sampling, validate)
        track = LogprobTrack(episodes) if sampling.return_logprobs else None
        await self._run_continuous(episodes, engine, sampling, track, groups)
        return self._result(episodes, track, alphas, forked=bool(self.cfg.branch_turns) and not validate)

    def token_parts(self, response_ids: list[list[int]]) -> list[list[int]]:
        """Each response token's part id (router_r1/token_parts.py); the trainer asks for its training batches only."""
        return [response_parts(self.tok, ids, self._think_names) for ids in response_ids]

    def choice_token_ids(self) -> list[int]:
        """The first token of each pool model's name as a think writes it ("Ask X."), without repeats: the
        choices algorithm.name_floor holds up at each think_model span's first token."""
        prefix = self.tok.encode("Ask", add_special_tokens=False)
        ids = set()
        for model in self.registry.models.values():
            full = self.tok.encode(f"Ask {model.name}", add_special_tokens=False)
            if full[:len(prefix)] != prefix:
                raise ValueError(f"the tokenizer merges 'Ask' into {model.name!r}'s first token: no choice token")
            # The first token with a visible character: a tokenizer may give the space a token of its own.
            first = next((i for i in full[len(prefix):] if self.tok.decode([i]).strip()), None)
            if first is not None:
                ids.add(first)
        return sorted(ids)

    def submit(self, coro):
        """Start a coroutine on the pool client's loop (where its connections live); its future."""
        return self.client.submit(coro)

    def _generated(self, ep: Episode, out, track: "LogprobTrack | None"):
        """Hand a generated turn to the rules (recording its log-probs first); returns the route or None."""
        if track is not None:
            track.record(ep, out)
        return self.rules.after_generation(ep, out.token_ids)

    async def play(self, ep: Episode, engine: AsyncRolloutBackend, sampling: SamplingParams,
                   track: "LogprobTrack | None" = None) -> None:
        """One episode to its end: generate a turn, call the pool, repeat (`sampling` as turn_sampling made it).
        The continuous schedule runs one per row; the router server runs one per request."""
        while not ep.done:
            action = self._generated(ep, await engine.generate_one(ep.context(), sampling), track)
            if action is not None:
                self.rules.after_pool(ep, await self.client.route_one(RouteRequest(action.model, action.query)))
        release = getattr(engine, "release", None)
        if release is not None:  # the engine may free what it kept of this episode
            release(ep.context())

    async def play_group(self, episodes: list[Episode], idx: list[int], fork_turn: int,
                         engine: AsyncRolloutBackend, sampling: SamplingParams,
                         track: "LogprobTrack | None" = None) -> None:
        """A prompt group as a tree: episodes[idx[0]] plays up to turn `fork_turn` (or up to the turn it ended
        with, if it ends first), the others start there as its copies, and each plays on alone."""
        trunk = episodes[idx[0]]
        while True:
            fork = copy.deepcopy(trunk), (list(track.turns[id(trunk)]) if track is not None else None)
            if trunk.turn >= fork_turn:
                break
            action = self._generated(trunk, await engine.generate_one(trunk.context(), sampling), track)
            if action is not None and not trunk.done:
                self.rules.after_pool(trunk, await self.client.route_one(RouteRequest(action.model, action.query)))
            if trunk.done:  # ended before the fork turn: the siblings sample its last turn again
                break
        origin, origin_turns = fork
        origin.branch_from = trunk.branch_from = len(origin.response_ids)
        for j in idx[1:]:
            episodes[j] = copy.deepcopy(origin)
            if track is not None:
                track.copy(origin_turns, episodes[j])
        await asyncio.gather(*(self.play(episodes[j], engine, sampling, track) for j in idx))

    async def _run_continuous(self, episodes: list[Episode], engine: AsyncRolloutBackend,
                              sampling: SamplingParams, track: "LogprobTrack | None",
                              groups: list[tuple[list[int], int | None]]) -> None:
        """`groups` as groups_of gives them: each row index run played alone (fork None) or as a forked group."""
        # A failing episode means a bug in our code (the client never raises): surface it, and stop the
        # others instead of leaving them running on the client's loop.
        tasks = [asyncio.ensure_future(self.play(episodes[idx[0]], engine, sampling, track) if fork is None
                                       else self.play_group(episodes, idx, fork, engine, sampling, track))
                 for idx, fork in groups]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            raise

    def _run_sync(self, episodes: list[Episode], generate: GenerateFn, sampling: SamplingParams,
                  track: "LogprobTrack | None" = None) -> None:
        while live := [e for e in episodes if not e.done]:
            outs = generate([e.context() for e in live], sampling)
            routes = [(e, a) for e, o in zip(live, outs) if (a := self._generated(e, o, track))]
            results = self.client.route([RouteRequest(a.model, a.query) for _, a in routes])
            for (e, _), res in zip(routes, results):
                self.rules.after_pool(e, res)

    async def _run_overlap(self, episodes: list[Episode], generate: GenerateFn, sampling: SamplingParams,
                           track: "LogprobTrack | None" = None) -> None:
        loop = asyncio.get_running_loop()
        ready: list[Episode] = list(episodes)
        calls: set[asyncio.Task] = set()
        woken = asyncio.Event()
        ready_since = loop.time()  # when the oldest waiting episode became ready

        def make_ready(ep: Episode) -> None:
            nonlocal ready_since
            if not ready:
                ready_since = loop.time()
            ready.append(ep)
            woken.set()

        async def call_pool(ep: Episode, model: str, query: str) -> None:
            self.rules.after_pool(ep, await self.client.route_one(RouteRequest(model, query)))
            if not ep.done:
                make_ready(ep)

        while ready or calls:
            # Wait for more episodes while a good share is still at the pool: one generate
            # call costs about the same for 4 rows as for 64, so tiny batches waste it.
            wanted = self.cfg.overlap_min_ready * (len(ready) + len(calls))
            if not ready or (calls and len(ready) < wanted):
                budget = None if not ready else ready_since + self.cfg.overlap_max_wait_s - loop.time()
                if budget is None or budget > 0:
                    woken.clear()
                    try:
                        await asyncio.wait_for(woken.wait(), budget)
                        continue  # something changed: decide again
                    except TimeoutError:
                        pass  # waited long enough: generate for whoever is ready
            batch, ready[:] = list(ready), []
            outs = await loop.run_in_executor(None, generate, [e.context() for e in batch], sampling)
            for ep, out in zip(batch, outs):
                action = self._generated(ep, out, track)
                if action is not None:
                    task = asyncio.create_task(call_pool(ep, action.model, action.query))
                    calls.add(task)
                    task.add_done_callback(calls.discard)
                elif not ep.done:
                    make_ready(ep)
            # A failing task means a bug in our code (the client never raises): surface it.
            for task in [t for t in calls if t.done() and t.exception()]:
                raise task.exception()

    def _result(self, episodes: list[Episode], track: "LogprobTrack | None" = None,
                alphas: list | None = None, forked: bool = False) -> RolloutResult:
        def mask(e: Episode) -> list[int]:  # mask mode: a trajectory that hit the budget is left out of the loss
            return [0] * len(e.response_mask) if self.cfg.budget_mode == "mask" and e.hit_budget else e.response_mask

        result = RolloutResult(
            prompt_ids=[e.prompt_ids for e in episodes],
            response_ids=[e.response_ids for e in episodes],
            response_mask=[mask(e) for e in episodes],
            info={"text": [e.text for e in episodes], "turns": [e.turns for e in episodes],
                  "cost_usd": [e.cost_usd for e in episodes], "billed_usd": [e.billed_usd for e in episodes],
                  "route_count": [e.route_count for e in episodes],
                  "hit_budget": [e.hit_budget for e in episodes], "truncated": [e.truncated for e in episodes],
                  "pool_latency_s": [e.pool_latency_s for e in episodes],
                  "pool_failures": [e.pool_failures for e in episodes],
                  "forced": [e.forced for e in episodes],
                  "turn_budget": [self.cfg.max_turns if e.max_turns is None else e.max_turns for e in episodes]},
        )
        if track is not None:
            result.info["rollout_log_probs"] = [track.aligned(e) for e in episodes]
        if self.cfg.alphas:
            result.info["alpha"] = alphas
        if forked:
            result.info["branch_mask"] = [e.branch_mask() for e in episodes]
        return result

    # ------------------------------------------------------------------ reward
    def score(self, result: RolloutResult, rows, validate: bool):
        golds = [_golds(r.fields, i) for i, r in enumerate(rows)]
        alphas = result.info.get("alpha")  # per-prompt cost weights (alpha conditioning), one shared window
        scores, per = compute_scores(result.info["text"], golds, result.info[COST_FIELDS[self.cfg.cost_basis]],
                                     result.info["route_count"], self.registry,
                                     self.normalizers["val" if validate else "train"], self.reward, alphas=alphas)
        if self.cfg.budget_mode == "penalize":
            scores = [self.reward.format_penalty if hit else s for s, hit in zip(scores, result.info["hit_budget"])]
        metrics = {k: [float(m[k]) for m in per] for k in ("em", "f1", "format_ok", "cost_reward", "route_count")}
        for k in COST_FIELDS.values():  # both costs, whichever the reward reads
            if k in result.info:
                metrics[k] = [float(c) for c in result.info[k]]
        metrics["hit_budget"] = [float(x) for x in result.info["hit_budget"]]
        for rule in FORMAT_RULES:  # which format rule failed: the first one check_format found broken
            metrics[f"format_fail/{rule}"] = [float(m["format_reason"].split(":")[0] == rule) for m in per]
        if self.cfg.budgets:  # per-budget accuracy, and how often an answer had to be forced
            metrics["forced"] = [float(x) for x in result.info["forced"]]
            for b in sorted(set(result.info["turn_budget"])):
                metrics[f"budget_{b}/em"] = [m["em"] for m, tb in zip(per, result.info["turn_budget"]) if tb == b]
        if alphas:  # accuracy and spend at each cost weight
            for a in sorted(set(alphas)):
                for k in ("em", "cost_usd"):
                    metrics[f"alpha_{a:g}/{k}"] = [metrics[k][i] for i, x in enumerate(alphas) if x == a]
        metrics["pool_failures"] = [float(x) for x in result.info["pool_failures"]]
        metrics.update(self.health.observe(result.info["turns"], validate))
        for name in self.registry.names:  # share of trajectories that called each model
            key = f"calls/{name}"
            metrics[key] = [float(sum(t.get("model") == name and "ok" in t for t in turns))
                            for turns in result.info["turns"]]
        metrics.update(collapse_metrics(result.info["turns"], [r.fields.get("data_source") for r in rows],
                                        self.registry.names))
        stages = [trajectory_stages((r.fields.get("extra_info") or {}).get("question"), g, turns, m["em"],
                                    m["format_ok"], self.truth, self.registry.names)
                  for r, g, turns, m in zip(rows, golds, result.info["turns"], per)]
        metrics.update(stage_metrics(stages))  # where EM is lost: stage/copy_ok, stage/gold_in_info, ...
        return np.asarray(scores, dtype=np.float32), metrics

    def state_dict(self) -> dict:
        return {**{k: n.state_dict() for k, n in self.normalizers.items()}, "pool_health": self.health.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        for k, n in self.normalizers.items():
            if k in state:
                n.load_state_dict(state[k])
        self.health.load_state_dict(state.get("pool_health", {}))  # a checkpoint from before it: a fresh count

    def check_run(self) -> None:
        """After the last training step: PoolFailureError when the run's pool calls mostly failed."""
        self.health.check_run()


def _golds(fields: dict, i: int) -> list[str]:
    try:
        target = fields["reward_model"]["ground_truth"]["target"]
    except (KeyError, TypeError) as e:
        raise ValueError(f"row {i}: missing reward_model.ground_truth.target") from e
    return [target] if isinstance(target, str) else [str(t) for t in target]


@dataclass
class RouterEnvConfig:
    """`env` of a routing run: the pool, the episode's shape, the reward. The one home of these keys and their
    defaults; evaluation, inference, serving and calibration read a trained run's values from its
    run_config.yaml (router_r1/runtime.py), a flag overriding one."""

    factory: str = "router_r1.router_env:make_env"  # "module:function" the engine calls with (env section, tokenizer)
    pool: str = "configs/pool/paper.yaml"  # the pool registry yaml (models, prices, endpoints)
    pool_url: Optional[str] = None  # override every endpoint of the pool yaml (a local proxy, the simulated server)
    seen_only: bool = True  # route only to models not marked unseen
    alpha: float = RewardConfig.alpha  # cost_coe: reward = (1 - alpha) + alpha * R_cost for a right answer; 0 = accuracy only (the paper's cost runs: up to 0.9)
    format_rules: str = RewardConfig.format_rules  # reference (the published code's check) | strict (router_r1/reward/format.py says what each checks)
    reward_metric: str = RewardConfig.reward_metric  # em | f1: the answer metric of the gate and the score
    cost_basis: str = "output"  # the cost R_cost reads: output (the reference's: each call's completion tokens at its output price) | billed (as the APIs bill it: its prompt tokens, all the call sends, at the input price too; pool yamls' price_in_per_m); evaluation reports both
    max_turns: int = 4  # generations that may route; one more turn must answer
    max_obs_length: int = 600  # tokens of pool text per <information> block (cut inside the block)
    response_length: int = II("rollout.response_length")  # tokens per generated turn
    max_response_length: int = II("rollout.max_response_length")  # all turns and <information> blocks together
    schedule: str = "continuous"  # continuous (one coroutine per episode; the engine batches) | sync (each turn waits for the batch's slowest call, the reference's) | overlap (the older batch queue) | auto (sync where the engine decodes whole batches cheaper, the hf loop on the CPU; else continuous); see this module's docstring
    overlap_min_ready: float = 0.5  # overlap schedule: generate once this share of unfinished episodes is ready...
    overlap_max_wait_s: float = 0.5  # ...or the oldest ready one has waited this long
    invalid_hint: bool = False  # append a corrective hint after an invalid action (else nothing)
    constrain_names: bool = False  # decode a route's model name as one of the pool's (router_r1/name_constraint.py; the hf engine): evaluation and serving only, it leaves the policy's distribution
    cache_dir: Optional[str] = None  # pool reply cache: re-runs are free and repeatable
    max_concurrency: int = 32  # pool calls in flight per endpoint
    call_timeout_s: float = 30.0  # seconds per pool call attempt
    call_deadline_s: float = 120.0  # seconds per pool call, retries included; then the call is a failed observation
    max_reply_chars: int = ReplyLimits.max_chars  # pool reply text kept; longer is cut (the call's turn says `cut`)
    max_reply_bytes: int = ReplyLimits.max_bytes  # pool reply body read; longer is a failed call (`too_large`)
    max_retries: int = 4  # retries of a retryable pool error (bounded exponential backoff with jitter)
    sim_seed: int = 0  # world seed of a simulated pool (its server's --seed): the stage/* metrics read from the pool's world (its yaml's `world:`) which expert knows a sub-question (router_r1/stages.py); a pool without a world gets the world-free stages
    max_pool_failure_rate: float = PoolHealth.max_failure_rate  # a training batch whose pool calls fail more often is unhealthy (pool/failure_rate is logged every step)
    pool_failure_patience: int = PoolHealth.patience  # unhealthy training batches in a row before training stops with PoolFailureError (validation only reports)
    # AdaTurn (budget-aware turns); off while budgets is empty
    budgets: list[int] = field(default_factory=list)  # T_max is drawn per prompt from this set, stated in the prompt, and is the episode's routing limit (max_turns is then unused); a pure function of (budget_seed, uid, trainer.seed + step): a resumed run and a GRPO group draw the same
    budget_seed: int = 0  # seed of that draw
    val_budget: Optional[int] = None  # validation: a fixed budget, or null for a fixed per-prompt draw from budgets
    budget_in_prompt: bool = True  # rebuild each prompt with its budget sentence (needs extra_info.question)
    prompt_template: Optional[str] = None  # template file of that rebuild (configs/env/router.yaml sets data.prompt_template, the one the data was built with; null: the default template); must contain {budget}
    budget_mode: str = "end"  # a route asked for with the budget spent: end (the episode stops) | forced (refuse it, drop its turn, append the budget-exhausted message, generate the answer) | mask (as end, response_mask zeroed) | penalize (as end, score = the format penalty)
    # Alpha conditioning (router_r1/serve, calibrate); off while alphas is empty
    alphas: list[float] = field(default_factory=list)  # the set each prompt's cost weight is drawn from, stated in its prompt (prompts.alpha_text); its reward uses that alpha; empty: the one `alpha`, prompts as given
    alpha_seed: int = 0  # seed of that draw
    val_alpha: Optional[float] = None  # validation alpha; null: drawn per prompt, the same at every validation
    # Forked groups (this module's docstring); off while branch_turns is empty
    branch_turns: list[int] = field(default_factory=list)  # training with rollout.n > 1: a prompt's n episodes share one trunk up to a turn drawn per group from this list (0 = the first turn; a trunk that ends earlier forks at its last turn) and the trainer credits that turn's tokens against the siblings'; needs the continuous schedule

    def check(self) -> None:
        """ValueError naming the first key out of range (RouterEnv checks its config on construction)."""
        for key in ("response_length", "max_response_length"):
            if not isinstance(getattr(self, key), int):  # built in Python, outside a run config
                raise ValueError(f"env.{key} is not set (a run config ties it to rollout.{key})")
        for key, least in (("max_turns", 0), ("max_obs_length", 1), ("response_length", 1), ("max_response_length", 1)):
            v = getattr(self, key)
            if isinstance(v, bool) or v < least:
                raise ValueError(f"env.{key} must be an integer >= {least}, got {v!r}")
        if self.cost_basis not in COST_FIELDS:
            raise ValueError(f"env.cost_basis must be one of {'|'.join(COST_FIELDS)}, got {self.cost_basis!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"env.schedule must be one of {'|'.join(SCHEDULES)}, got {self.schedule!r}")
        if self.branch_turns and self.schedule not in ("continuous", "auto"):
            raise ValueError(f"env.branch_turns forks episodes in the continuous schedule only, not {self.schedule!r}")
        if any(isinstance(t, bool) or t < 0 for t in self.branch_turns):
            raise ValueError(f"env.branch_turns must be turn indices >= 0, got {self.branch_turns}")
        for a in [*self.alphas, *([] if self.val_alpha is None else [self.val_alpha])]:
            if not 0.0 <= a <= 1.0:
                raise ValueError(f"env.alphas / env.val_alpha must be in [0, 1], got {a}")
        for b in [*self.budgets, *([] if self.val_budget is None else [self.val_budget])]:
            if b < 0:
                raise ValueError(f"env.budgets / env.val_budget must be >= 0, got {b}")

    def reward_config(self) -> RewardConfig:
        """The reward's settings (RewardConfig checks alpha's range)."""
        return RewardConfig(alpha=self.alpha, format_rules=self.format_rules, reward_metric=self.reward_metric)


def make_env(env_cfg, tokenizer, *, registry: ModelRegistry | None = None, client: PoolClient | None = None,
             template: str | None = None) -> RouterEnv:
    """Build RouterEnv from the `env` section (a RouterEnvConfig, or a mapping of its keys): the one place an
    environment is built. Training passes the section only (the pool comes from its keys); evaluation,
    inference and serving pass the pool they opened and the checkpoint's template (router_r1/runtime.py)."""
    cfg = section_to_dataclass(RouterEnvConfig, env_cfg, "env")
    # The HTTP stack logs every request at INFO; a rollout makes thousands.
    for name in ("httpx", "httpx2", "openai"):
        logging.getLogger(name).setLevel(logging.WARNING)
    if registry is None:
        registry = ModelRegistry.from_yaml(cfg.pool, base_url=cfg.pool_url)
        if cfg.seen_only:
            registry = registry.seen()
    if client is None:
        client = PoolClient(registry, max_concurrency_per_endpoint=cfg.max_concurrency, timeout_s=cfg.call_timeout_s,
                            max_retries=cfg.max_retries, deadline_s=cfg.call_deadline_s, cache_dir=cfg.cache_dir,
                            limits=ReplyLimits(cfg.max_reply_chars, cfg.max_reply_bytes))
    # the hook for simulated pools: their world's answer key judges the expert and two-hop stages
    return RouterEnv(cfg, tokenizer, registry, client, template=template, truth=answer_key(registry, cfg.sim_seed))


make_env.config_class = RouterEnvConfig
# env keys a resume may change (verl.trainer.config.training_changes): where the pool is and how it is called,
# not what it answers; evaluation-only decoding
RouterEnvConfig.not_training = ("pool_url", "cache_dir", "max_concurrency", "call_timeout_s", "call_deadline_s",
                                "max_retries", "max_pool_failure_rate", "pool_failure_patience", "schedule",
                                "overlap_min_ready", "overlap_max_wait_s", "constrain_names", "sim_seed")
make_env.preflight = pool_problems  # the engine's preflight: the pool yaml and its key, before any model loads
make_env.data_command = data_command  # the preflight's missing-data line names the command that builds it
