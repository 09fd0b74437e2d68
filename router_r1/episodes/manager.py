"""The multi-turn rollout: generation interleaved with pool calls, and the reward.

Three schedules produce the same kind of episodes (greedy episodes are identical under all):
- "continuous" (default): one coroutine per episode, as veRL's agent loop runs them:
  generate a turn, call the pool, generate the next turn, each the moment its input is
  ready, through the engine's async `generate_one`. The engine decides the batching
  (vLLM's async engine, hf_static's slots; a batch backend gets `as_async`, which sends
  whoever is waiting whenever the engine is free). No knobs.
- "sync": every turn generates for all live episodes, then waits for all their pool
  calls (the reference's schedule: the slowest call of the batch gates the next turn);
- "overlap": the earlier schedule, kept for comparison: an episode goes back to a queue the
  moment its pool call returns, and a batch `generate` takes whoever is ready once a share of
  the episodes is ready or the oldest has waited long enough (overlap_min_ready/max_wait_s).

With `sampling.return_logprobs` the result carries `info["rollout_log_probs"]`: per response
token, the sampling engine's log-prob for policy tokens and 0 for environment tokens (the
behaviour policy's log-probs that off-policy training corrects against).

Turn budgets (AdaTurn, off unless `budgets` is set): each prompt gets a budget T_max drawn
from `budgets`, stated in its prompt and used as its episode's routing limit; what a
route asked for after the budget is spent leads to is `budget_mode` (episode.BUDGET_MODES).

Alpha conditioning (off unless `alphas` is set): each prompt gets a cost weight alpha drawn
from `alphas`, stated in its prompt (prompts.alpha_text), and its reward uses that alpha; the
cost normaliser's window is shared by all alphas. One policy then serves any cost preference.
"""
from __future__ import annotations

import asyncio
import zlib
from dataclasses import dataclass, replace

import numpy as np

from router_r1.pool.client import PoolClient, RouteRequest
from router_r1.pool.health import PoolHealth
from router_r1.pool.registry import ModelRegistry
from router_r1.prompts import build_router_prompt
from router_r1.actions import STOP_STRINGS
from router_r1.reward.cost import CostNormalizer
from router_r1.reward.format import FORMAT_RULES
from router_r1.reward.score import RewardConfig, compute_scores
from router_r1.row_check import check_router_row
from router_r1.episodes.episode import Episode, TurnRules
from router_r1.routing_collapse import collapse_metrics
from verl.trainer.env_interface import GenerateFn, RolloutResult
from verl.workers.rollout.base import AsyncRolloutBackend, SamplingParams, as_async

SCHEDULES = ("continuous", "sync", "overlap")


@dataclass
class RouterConfig:
    max_turns: int = 4  # generations that may route; one more turn must answer
    max_obs_length: int = 600  # tokens of pool text per <information> block
    response_length: int = 1024  # tokens per generated turn
    max_response_length: int = 4096  # all turns and observations together
    invalid_hint: bool = False  # a corrective hint after an invalid action (else nothing)
    schedule: str = "continuous"  # continuous | sync | overlap (see the module docstring)
    overlap_min_ready: float = 0.5  # overlap only: generate once this share of unfinished episodes is ready...
    overlap_max_wait_s: float = 0.5  # ...or the oldest ready one has waited this long
    # AdaTurn. budgets: the set T_max is drawn from per prompt (empty: max_turns for all, prompts as given).
    budgets: tuple[int, ...] = ()
    budget_seed: int = 0
    val_budget: int | None = None  # validation budget; None: drawn per prompt, the same at every validation
    budget_in_prompt: bool = True  # rebuild each prompt with its budget sentence (needs extra_info.question)
    prompt_template: str | None = None  # template text for that rebuild (None: prompts.DEFAULT_TEMPLATE)
    budget_mode: str = "end"  # end | forced | mask | penalize (episode.BUDGET_MODES)
    # Alpha conditioning. alphas: the set a prompt's cost weight is drawn from (empty: the reward's one alpha,
    # prompts as given); val_alpha: the validation alpha (None: drawn per prompt, the same at every validation).
    alphas: tuple[float, ...] = ()
    alpha_seed: int = 0
    val_alpha: float | None = None

    def __post_init__(self):
        self.alphas = tuple(float(a) for a in self.alphas)
        for a in [*self.alphas, *([] if self.val_alpha is None else [self.val_alpha])]:
            if not 0.0 <= a <= 1.0:
                raise ValueError(f"env.alphas / env.val_alpha must be in [0, 1], got {a}")
        self.budgets = tuple(int(b) for b in self.budgets)
        for b in [*self.budgets, *([] if self.val_budget is None else [self.val_budget])]:
            if b < 0:
                raise ValueError(f"env.budgets / env.val_budget must be >= 0, got {b}")


class RouterEnv:
    """The routing environment behind the engine's Env interface."""

    check_row = staticmethod(check_router_row)  # PromptDataset's row_check: every row, at load time

    def __init__(self, cfg: RouterConfig, tokenizer, registry: ModelRegistry, client: PoolClient,
                 reward: RewardConfig, health: PoolHealth | None = None):
        if cfg.schedule not in SCHEDULES:
            raise ValueError(f"env.schedule must be one of {'|'.join(SCHEDULES)}, got {cfg.schedule!r}")
        self.cfg = cfg
        self.tok = tokenizer
        self.registry = registry
        self.client = client
        self.reward = reward
        self.health = health or PoolHealth()  # pool failure rate per batch; stops a run whose pool keeps failing
        self.rules = TurnRules(tokenizer, registry, cfg.max_turns, cfg.max_obs_length,
                               cfg.max_response_length, cfg.invalid_hint, cfg.budget_mode)
        # Separate windows: validation must not shift the training reward (a reference defect).
        self.normalizers = {"train": CostNormalizer(), "val": CostNormalizer()}

    # ------------------------------------------------------------------ episodes
    def turn_sampling(self, sampling: SamplingParams) -> SamplingParams:
        return replace(sampling, stop=tuple(STOP_STRINGS), max_new_tokens=self.cfg.response_length)

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
        messages = build_router_prompt(question, self.registry, self.cfg.prompt_template, turn_budget=budget,
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
        episodes = self.episodes_for(rows, sampling, validate)
        alphas = [self.alpha_of(r.uid, sampling, validate) for r in rows]
        sampling = self.turn_sampling(sampling)
        track = _LogprobTrack(episodes) if sampling.return_logprobs else None
        if self.cfg.schedule == "continuous":
            self.client.run(self._run_continuous(episodes, as_async(generate), sampling, track))
        elif not callable(generate):
            raise ValueError(f"env.schedule={self.cfg.schedule!r} needs a batch generate function; "
                             f"{type(generate).__name__} only has generate_one (use schedule=continuous)")
        elif self.cfg.schedule == "sync":
            self._run_sync(episodes, generate, sampling, track)
        else:
            self.client.run(self._run_overlap(episodes, generate, sampling, track))
        result = self._result(episodes, track)
        if self.cfg.alphas:
            result.info["alpha"] = alphas
        return result

    def _generated(self, ep: Episode, out, track: "_LogprobTrack | None"):
        """Hand a generated turn to the rules (recording its log-probs first); returns the route or None."""
        if track is not None:
            track.record(ep, out)
        return self.rules.after_generation(ep, out.token_ids)

    async def play(self, ep: Episode, engine: AsyncRolloutBackend, sampling: SamplingParams,
                   track: "_LogprobTrack | None" = None) -> None:
        """One episode to its end: generate a turn, call the pool, repeat (`sampling` as turn_sampling made it).
        The continuous schedule runs one per row; the router server runs one per request."""
        while not ep.done:
            action = self._generated(ep, await engine.generate_one(ep.context(), sampling), track)
            if action is not None:
                self.rules.after_pool(ep, await self.client.route_one(RouteRequest(action.model, action.query)))
        release = getattr(engine, "release", None)
        if release is not None:  # the engine may free what it kept of this episode
            release(ep.context())

    async def _run_continuous(self, episodes: list[Episode], engine: AsyncRolloutBackend,
                              sampling: SamplingParams, track: "_LogprobTrack | None") -> None:
        # A failing episode means a bug in our code (the client never raises): surface it, and stop the
        # others instead of leaving them running on the client's loop.
        tasks = [asyncio.ensure_future(self.play(ep, engine, sampling, track)) for ep in episodes]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            raise

    def _run_sync(self, episodes: list[Episode], generate: GenerateFn, sampling: SamplingParams,
                  track: "_LogprobTrack | None" = None) -> None:
        while live := [e for e in episodes if not e.done]:
            outs = generate([e.context() for e in live], sampling)
            routes = [(e, a) for e, o in zip(live, outs) if (a := self._generated(e, o, track))]
            results = self.client.route([RouteRequest(a.model, a.query) for _, a in routes])
            for (e, _), res in zip(routes, results):
                self.rules.after_pool(e, res)

    async def _run_overlap(self, episodes: list[Episode], generate: GenerateFn, sampling: SamplingParams,
                           track: "_LogprobTrack | None" = None) -> None:
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

    def _result(self, episodes: list[Episode], track: "_LogprobTrack | None" = None) -> RolloutResult:
        def mask(e: Episode) -> list[int]:  # mask mode: a trajectory that hit the budget is left out of the loss
            return [0] * len(e.response_mask) if self.cfg.budget_mode == "mask" and e.hit_budget else e.response_mask

        result = RolloutResult(
            prompt_ids=[e.prompt_ids for e in episodes],
            response_ids=[e.response_ids for e in episodes],
            response_mask=[mask(e) for e in episodes],
            info={"text": [e.text for e in episodes], "turns": [e.turns for e in episodes],
                  "cost_usd": [e.cost_usd for e in episodes], "route_count": [e.route_count for e in episodes],
                  "hit_budget": [e.hit_budget for e in episodes], "truncated": [e.truncated for e in episodes],
                  "pool_latency_s": [e.pool_latency_s for e in episodes],
                  "pool_failures": [e.pool_failures for e in episodes],
                  "forced": [e.forced for e in episodes],
                  "turn_budget": [self.cfg.max_turns if e.max_turns is None else e.max_turns for e in episodes]},
        )
        if track is not None:
            result.info["rollout_log_probs"] = [track.aligned(e) for e in episodes]
        return result

    # ------------------------------------------------------------------ reward
    def score(self, result: RolloutResult, rows, validate: bool):
        golds = [_golds(r.fields, i) for i, r in enumerate(rows)]
        alphas = result.info.get("alpha")  # per-prompt cost weights (alpha conditioning), one shared window
        scores, per = compute_scores(result.info["text"], golds, result.info["cost_usd"],
                                     result.info["route_count"], self.registry,
                                     self.normalizers["val" if validate else "train"], self.reward, alphas=alphas)
        if self.cfg.budget_mode == "penalize":
            scores = [self.reward.format_penalty if hit else s for s, hit in zip(scores, result.info["hit_budget"])]
        metrics = {k: [float(m[k]) for m in per] for k in ("em", "f1", "format_ok", "cost_usd", "cost_reward",
                                                           "route_count")}
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
                    metrics[f"alpha_{a:g}/{k}"] = [float(m[k]) for m, x in zip(per, alphas) if x == a]
        metrics["pool_failures"] = [float(x) for x in result.info["pool_failures"]]
        metrics.update(self.health.observe(result.info["turns"], validate))
        for name in self.registry.names:  # share of trajectories that called each model
            key = f"calls/{name}"
            metrics[key] = [float(sum(t.get("model") == name and "ok" in t for t in turns))
                            for turns in result.info["turns"]]
        metrics.update(collapse_metrics(result.info["turns"], [r.fields.get("data_source") for r in rows],
                                        self.registry.names))
        return np.asarray(scores, dtype=np.float32), metrics

    def state_dict(self) -> dict:
        return {k: n.state_dict() for k, n in self.normalizers.items()}

    def load_state_dict(self, state: dict) -> None:
        for k, n in self.normalizers.items():
            if k in state:
                n.load_state_dict(state[k])


def _golds(fields: dict, i: int) -> list[str]:
    try:
        target = fields["reward_model"]["ground_truth"]["target"]
    except (KeyError, TypeError) as e:
        raise ValueError(f"row {i}: missing reward_model.ground_truth.target") from e
    return [target] if isinstance(target, str) else [str(t) for t in target]


class _LogprobTrack:
    """The sampling engine's log-probs of each generated turn, aligned to the final response.

    The rules may cut a turn (no room left) or drop a refused one (forced answer), so the
    turns' log-probs are placed where their tokens ended up: a turn generated when the
    response held `start` tokens covers positions start.., kept while the token there is
    the policy's and the same id; a later turn at the same place overrides an earlier one."""

    def __init__(self, episodes: list[Episode]):
        self.turns: dict[int, list[tuple[int, list[int], list[float]]]] = {id(e): [] for e in episodes}

    def record(self, ep: Episode, out) -> None:
        if out.logprobs is None or len(out.logprobs) != len(out.token_ids):
            raise ValueError("sampling.return_logprobs is set but the engine returned "
                             f"{None if out.logprobs is None else len(out.logprobs)} log-probs for "
                             f"{len(out.token_ids)} tokens")
        self.turns[id(ep)].append((len(ep.response_ids), list(out.token_ids), list(out.logprobs)))

    def aligned(self, ep: Episode) -> list[float]:
        lp = [0.0] * len(ep.response_ids)  # environment tokens: 0 (masked out of every loss)
        for start, ids, lps in self.turns[id(ep)]:
            for j, (t, x) in enumerate(zip(ids, lps)):
                i = start + j
                if i >= len(lp) or ep.response_mask[i] != 1 or ep.response_ids[i] != t:
                    break
                lp[i] = x
        return lp
