"""The controller: one PPO step = rollout -> reward -> log-probs -> values -> advantages -> updates;
with trainer.mode=sft one step = one length-bucketed batch of data.sft_files -> the actor's update_sft
(`sft_step`), through the same loop, checkpoints and logging.

Read `step()` top to bottom; everything else is bookkeeping (validation, checkpoints,
logging). Where a step's episodes come from is the rollout schedule's business
(verl/trainer/rollout_schedule.py): played now, played ahead while the previous step trains
(trainer.off_policy_steps=1, weighted by `off_policy_weights`), or streamed (rollout.in_flight > 0).
The workers (actor, critic, reference) live behind worker groups, so the same loop drives one CPU
process, a torchrun launch, or Ray actors.
"""
from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch.distributed.checkpoint.api import CheckpointException
from tqdm import tqdm

from verl.algos.advantages import compute_gae, compute_grpo_advantages, place_score_on_last_token
from verl.algos.dapo import informative_groups, overlong_penalty, select_groups
from verl.algos.kl import AdaptiveKLController, FixedKLController, apply_kl_penalty
from verl.algos.masked import masked_mean
from verl.protocol import DataProto
from verl.trainer import checkpoint
from verl.trainer.balance import engine_loads, imbalance, row_loads
from verl.trainer.batching import pad_trajectories
from verl.trainer.config import save_run_config, schedule_length_matters
from verl.trainer.curves import decoding_labels, plot_curves
from verl.trainer.dataset import PromptDataset, eval_batches, train_batch_indices
from verl.trainer.env_interface import Env, RolloutResult, pick_episodes
from verl.trainer.part_metrics import object_column, part_id, part_metrics, part_tensor
from verl.trainer.rollout_schedule import make_schedule
from verl.trainer.sft_data import SFTSet, collate
from verl.trainer.tracking import Tracker, _plain, on_terminal, read_jsonl, timer, trim_jsonl
from verl.workers.fsdp import CheckpointError
from verl.workers.rollout.base import AsyncRolloutBackend, GenOutput, SamplingParams


def _summary(prefix: str, values) -> dict[str, float]:
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return {}
    return {f"{prefix}/mean": float(arr.mean()), f"{prefix}/max": float(arr.max()), f"{prefix}/min": float(arr.min())}


@dataclasses.dataclass
class Played:
    """One generation batch of a training step."""

    rows: list
    result: RolloutResult
    scores: np.ndarray  # (episodes,)
    metrics: dict[str, list]


def _n_informative(played: list[Played]) -> int:
    rows = [r for p in played for r in p.rows]
    return sum(informative_groups(np.concatenate([p.scores for p in played]), [r.uid for r in rows]).values())


def logprob_mismatch(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, mask: torch.Tensor
                     ) -> dict[str, float]:
    """Mean and max |actor's recomputed log-prob - sampling engine's own| over policy tokens."""
    m = mask.bool()
    diff = (old_log_probs - rollout_log_probs).abs()[m]
    if diff.numel() == 0:
        return {}
    return {"rollout/logprob_diff_mean": float(diff.mean()), "rollout/logprob_diff_max": float(diff.max())}


def off_policy_weights(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, mask: torch.Tensor,
                       cap: float) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance weights min(pi_old / pi_rollout, cap) per token (batch, response_len), 0 off the mask.

    pi_old is the policy the update starts from (recomputed log-probs), pi_rollout the one that
    sampled (the engine's own log-probs). Truncation as veRL's rollout importance sampling
    (token level, "truncate" mode) and AReaL's decoupled PPO (behaviour weight cap); the PPO ratio
    and its clip then run against pi_old, so the trust region is measured from the current policy."""
    m = mask.bool()
    log_w = torch.where(m, old_log_probs - rollout_log_probs, 0.0)
    w = torch.exp(log_w.clamp(max=math.log(cap)))
    raw = torch.exp(log_w.clamp(-20.0, 20.0))
    n = m.sum().clamp(min=1)
    stats = {"offpolicy/is_weight_mean": float((raw * m).sum() / n),
             "offpolicy/is_weight_max": float(raw[m].max()) if m.any() else 1.0,
             "offpolicy/is_weight_min": float(raw[m].min()) if m.any() else 1.0,
             "offpolicy/is_truncated_frac": float(((raw > cap) & m).sum() / n),
             "offpolicy/rollout_kl": float((torch.where(m, rollout_log_probs - old_log_probs, 0.0)).sum() / n)}
    return torch.where(m, w, 0.0), stats


class _LocalAsyncEngine:
    """The worker's own async engine, seen by the env: batch `generate` for the batch schedules, and
    `generate_one`/`release` for the continuous one; both check the weights are synced (unless off-policy)."""

    def __init__(self, trainer: "PPOTrainer", rollout):
        self.trainer, self.rollout = trainer, rollout
        self.worker = trainer.actor.worker
        stats = getattr(getattr(rollout, "engine", None), "stats", None)
        self._busy0 = getattr(stats, "busy_s", 0.0)

    def busy_s(self) -> float:
        """Seconds the engine decoded for generate_one calls since this view was made."""
        stats = getattr(getattr(self.rollout, "engine", None), "stats", None)
        return getattr(stats, "busy_s", 0.0) - self._busy0

    def _check(self) -> None:
        if getattr(self.worker, "_stale", False) and not self.trainer.off_policy_steps:
            raise RuntimeError("generate: the rollout weights are stale; call sync_rollout() after an update")

    def __call__(self, prompts: list[list[int]], sampling: SamplingParams) -> list[GenOutput]:
        return self.trainer.generate(prompts, sampling)

    async def generate_one(self, prompt_ids: list[int], sampling: SamplingParams) -> GenOutput:
        self._check()
        return await self.rollout.generate_one(prompt_ids, sampling)

    def release(self, context_ids: list[int]) -> None:
        release = getattr(self.rollout, "release", None)
        if release is not None:
            release(context_ids)


class _BatchEngine:
    """The trainer's batch `generate`, seen by the env, with the local engine's `lockstep_batches` (whether whole
    batches are cheaper for it: the env's schedule=auto then plays in sync)."""

    def __init__(self, trainer: "PPOTrainer", lockstep_batches: bool):
        self.trainer, self.lockstep_batches = trainer, lockstep_batches

    def __call__(self, prompts: list[list[int]], sampling: SamplingParams) -> list[GenOutput]:
        return self.trainer.generate(prompts, sampling)


MAX_BAD_STEPS = 10  # consecutive steps with a non-finite gradient (updates skipped) before a run gives up


class TrainingDivergedError(RuntimeError):
    """MAX_BAD_STEPS steps in a row had non-finite gradients (their updates were skipped); nothing more is saved."""


def check_decision_parts(alg, env, use_kl_loss: bool = False) -> None:
    """algorithm.decision_parts must name parts the env labels, with a positive weight; a bonus or a KL weight on
    them needs parts (and the KL weight a KL loss)."""
    coef, kl_weight = alg.get("decision_entropy_coef", 0.0), alg.get("decision_kl_weight", 1.0)
    if coef < 0:
        raise ValueError(f"algorithm.decision_entropy_coef must be >= 0, got {coef}")
    if kl_weight < 0:
        raise ValueError(f"algorithm.decision_kl_weight must be >= 0, got {kl_weight}")
    if kl_weight != 1.0 and not use_kl_loss:
        raise ValueError("algorithm.decision_kl_weight weighs the KL loss on algorithm.decision_parts' tokens, and "
                         "actor.use_kl_loss is false: there is no KL loss to weigh")
    if not alg.get("decision_parts"):
        if coef or kl_weight != 1.0:
            key = "decision_entropy_coef" if coef else "decision_kl_weight"
            raise ValueError(f"algorithm.{key} acts on algorithm.decision_parts' tokens, and "
                             "none are named: set algorithm.decision_parts (a router's: [route_model,think_model])")
        return
    known = tuple(getattr(env, "part_names", ()) or ())
    unknown = [p for p in alg.decision_parts if p not in known]
    if unknown:
        raise ValueError(f"algorithm.decision_parts: {unknown} not among the env's token parts "
                         f"({', '.join(known) or 'it labels none'})")
    if alg.decision_adv_weight <= 0:
        raise ValueError(f"algorithm.decision_adv_weight must be > 0, got {alg.decision_adv_weight}")


def name_floor_ids(alg, env) -> list[int]:
    """algorithm.name_floor's choice tokens (the env's choice_token_ids()), checked; [] when the floor is off."""
    floor = alg.get("name_floor", 0.0)
    if not floor:
        return []
    if not 0 < floor < 1 or alg.get("name_floor_coef", 1.0) <= 0:
        raise ValueError(f"algorithm.name_floor must be in (0, 1) with name_floor_coef > 0, got {floor} and "
                         f"{alg.get('name_floor_coef')}")
    ids = list(env.choice_token_ids()) if hasattr(env, "choice_token_ids") else []
    if not ids:
        raise ValueError("algorithm.name_floor: the env names no choice tokens (choice_token_ids()) to hold up")
    if floor * len(ids) >= 1:
        raise ValueError(f"algorithm.name_floor={floor} for {len(ids)} choice tokens asks for more than all the "
                         f"probability: keep it below {1 / len(ids):.3f}")
    known = tuple(getattr(env, "part_names", ()) or ())
    if alg.name_floor_part not in known:
        raise ValueError(f"algorithm.name_floor_part: {alg.name_floor_part!r} not among the env's token parts "
                         f"({', '.join(known) or 'it labels none'})")
    return ids


def span_starts(parts: torch.Tensor, part: int) -> torch.Tensor:
    """(batch, len) bool: the first token of each run of `part` in the (batch, len) part ids."""
    here = parts == part
    before = torch.cat([torch.zeros_like(here[:, :1]), here[:, :-1]], dim=1)
    return here & ~before


class PPOTrainer:
    """The training loop of both modes: trainer.mode=ppo (`step`) and sft (`sft_step`, env None, train_set an SFTSet)."""

    def __init__(self, cfg, tokenizer, groups, env: Env | None, train_set: PromptDataset | SFTSet,
                 val_set: PromptDataset | None, tracker: Tracker | None, dist=None):
        self.cfg = cfg
        self.mode = cfg.trainer.get("mode", "ppo")
        self.tokenizer = tokenizer
        self.actor = groups["actor"]
        self.critic = groups.get("critic")
        self.ref = groups.get("ref")
        self.env = env
        self.train_set = train_set
        self.val_set = val_set
        self.tracker = tracker
        self.dist = dist  # verl.trainer.dist.Dist: this process's rank in an SPMD launch
        self.out_dir = Path(cfg.trainer.output_dir)
        alg = cfg.algorithm
        if alg.kl_ctrl.type == "adaptive":
            self.kl_ctrl = AdaptiveKLController(alg.kl_ctrl.kl_coef, alg.kl_ctrl.target_kl, alg.kl_ctrl.horizon)
        else:
            self.kl_ctrl = FixedKLController(alg.kl_ctrl.kl_coef)
        self.global_step = 0  # number of completed updates
        self.decode_s = 0.0  # seconds spent inside generate calls (the rest of a rollout waits for the env)
        self.sync_s = 0.0  # seconds copying the actor's weights into the rollout engine (sync_rollout)
        self.gen_batches = 0  # prompt batches drawn so far; dynamic sampling may draw several per step
        self.rollout_imbalance = None  # max/mean of the ranks' summed load hints, when balanced
        self.sft_tokens = 0  # sft: real tokens trained on so far
        self.sft_losses: list[float] = []  # sft: this process's per-step policy-token losses (sft_summary.json)
        self.stopped = "done"  # why fit ended: done, or the time limit
        self.off_policy_steps = int(cfg.trainer.off_policy_steps)  # the engine view's stale-weights check reads it
        self.schedule = make_schedule(self, cfg, dist)  # sync, off-policy or streaming: where episodes come from
        if alg.dynamic_sampling.enable and cfg.rollout.n < 2:
            raise ValueError("algorithm.dynamic_sampling needs rollout.n > 1 (it keeps groups whose rewards differ)")
        check_decision_parts(alg, env, cfg.actor.use_kl_loss)
        self.floor_ids = name_floor_ids(alg, env)  # algorithm.name_floor's choice tokens; [] when off
        if alg.get("whiten_by") and (alg.adv_estimator != "gae" or not alg.whiten_advantages):
            raise ValueError(f"algorithm.whiten_by={alg.whiten_by!r} whitens GAE advantages: it needs adv_estimator=gae "
                             "and whiten_advantages=true (grpo already compares within a prompt's group)")

    # ------------------------------------------------------------------ rollout
    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[GenOutput]:
        """The `generate` the environment calls; runs on the actor's rollout engine."""
        start = time.perf_counter()
        try:
            if self.dist is not None:  # SPMD: each rank decodes its own episodes, no collectives
                return self._generate_on(self.actor.worker.generate, prompts, sampling, 1)
            return self._generate_on(self.actor.generate, prompts, sampling, self.actor.world_size)
        finally:
            self.decode_s += time.perf_counter() - start

    def sync_rollout(self) -> None:
        """Copy the actor's weights into the rollout engine (a no-op when fresh), timed into sync_s: at 3B
        the copy takes seconds, which a rollout's time split must not count as waiting for the pool."""
        start = time.perf_counter()
        try:
            self.actor.sync_rollout()
        finally:
            self.sync_s += time.perf_counter() - start

    def engine(self):
        """What the env generates with: the local rollout engine itself where it has an async
        `generate_one` (hf_static's slots, vLLM's async engine: continuous batching and prefix reuse
        across an episode's turns), else the batch `generate` (Ray workers, batch-only backends)."""
        rollout = getattr(getattr(self.actor, "worker", None), "rollout", None)
        if isinstance(rollout, AsyncRolloutBackend) and callable(getattr(rollout, "generate", None)):
            return _LocalAsyncEngine(self, rollout)
        return _BatchEngine(self, bool(getattr(rollout, "lockstep_batches", False)))

    @staticmethod
    def _generate_on(fn, prompts, sampling, world_size: int) -> list[GenOutput]:
        # dp dispatch splits evenly: pad with copies of the first prompt, drop their outputs.
        n = len(prompts)
        padded = prompts + [prompts[0]] * (-n % world_size)
        arr = np.empty(len(padded), dtype=object)  # (batch,) of token lists
        arr[:] = padded
        # allow_stale: an off-policy rollout decodes with the weights it was synced with while the actor updates
        out = fn(DataProto(batch={}, non_tensor={"prompt_ids": arr}, meta={"sampling": sampling, "allow_stale": True}))
        return list(out.non_tensor["gen_outputs"])[:n]

    def sampling(self, validate: bool, step: int | None = None) -> SamplingParams:
        """Sampling for a rollout; `step` (default: the next update's index - 1) seeds it, so the
        rollout played ahead for step k+1 draws the noise an on-policy step k+1 would."""
        r = self.cfg.rollout
        if validate and r.val_greedy:
            return SamplingParams(greedy=True, temperature=0.0, max_new_tokens=r.response_length)
        temperature = r.val_temperature if validate else r.temperature
        step = self.global_step if step is None else step
        return SamplingParams(temperature=temperature, top_p=r.top_p, top_k=r.top_k,
                              max_new_tokens=r.response_length, seed=self.cfg.trainer.seed + step,
                              return_logprobs=(self.schedule.off_policy or r.name == "vllm")
                              and not validate)

    def play(self, rows, validate: bool, sampling: SamplingParams | None = None,
             sync: bool = True) -> tuple[RolloutResult, np.ndarray, dict[str, list]]:
        """Episodes for `rows` and their scores; under SPMD each rank plays its share (balanced by
        per-row load when trainer.balance_rollouts is on) and every rank gets every episode.
        sync=False: the caller synced the rollout weights (a rollout played ahead must not read
        the actor's weights while they update)."""
        sampling = sampling or self.sampling(validate)
        if sync:
            self.sync_rollout()
        engine = self.engine()
        if self.dist is None:
            result: RolloutResult = self.env.rollout(rows, engine, sampling, validate)
        else:
            loads = row_loads(rows, self.env, sampling, validate) if self.cfg.trainer.balance_rollouts else None
            plan = self.dist.assignment(len(rows), loads)
            self.rollout_imbalance = imbalance(engine_loads(loads, plan)) if loads else None
            result = self.env.rollout([rows[i] for i in plan[self.dist.rank]], engine, sampling, validate)
            result = self.dist.gather_result(result, plan)
        if isinstance(engine, _LocalAsyncEngine):  # continuous batching: the engine's own busy time
            self.decode_s += engine.busy_s()
        # Scored on the whole batch, so every rank's reward state (e.g. a cost window) is the same.
        scores, env_metrics = self.env.score(result, rows, validate)
        return result, np.asarray(scores, dtype=np.float32), env_metrics

    def to_batch(self, result: RolloutResult, rows, scores, sampling: SamplingParams) -> DataProto:
        """Pad the episodes into the workers' tensors, with `scores` (batch,), the group `uid`, and
        meta["temperature"]: the T the episodes were sampled at, which every log-prob is computed at."""
        tensors = pad_trajectories(result.prompt_ids, result.response_ids, result.response_mask,
                                   pad_id=self.tokenizer.pad_token_id)
        tensors["scores"] = torch.as_tensor(np.asarray(scores), dtype=torch.float32)  # (batch,)
        shape = tensors["responses"].shape  # (batch, response_len)
        if (lps := result.info.get("rollout_log_probs")) is not None:  # the sampling engine's, aligned with `responses`
            tensors["rollout_log_probs"] = _right_padded(lps, shape, torch.float32)
        if (forks := result.info.get("branch_mask")) is not None:  # forked groups: each episode's fork turn
            tensors["branch_mask"] = _right_padded(forks, shape, torch.bool)
        non_tensor = {"uid": np.array([r.uid for r in rows], dtype=object)}
        if hasattr(self.env, "token_parts"):  # the env's labels of its response tokens (part_metrics)
            non_tensor["token_part"] = object_column(self.env.token_parts(result.response_ids))
        if key := self.cfg.algorithm.get("whiten_by"):  # the advantage whitening's groups, one per value
            if key not in result.info:
                raise ValueError(f"algorithm.whiten_by={key!r}: the env's rollout info has no such field (it has: "
                                 f"{', '.join(sorted(result.info)) or 'none'}); a router needs env.alphas for 'alpha'")
            non_tensor["whiten_group"] = np.array(result.info[key], dtype=object)
        return DataProto.from_dict(tensors, non_tensor, meta={"temperature": sampling.logprob_temperature})

    def run_episodes(self, rows, validate: bool) -> tuple[DataProto, dict[str, list]]:
        """Episodes for `rows`, padded into one batch, and the environment's metrics."""
        sampling = self.sampling(validate)
        result, scores, env_metrics = self.play(rows, validate, sampling)
        return self.to_batch(result, rows, scores, sampling), env_metrics

    def next_indices(self) -> list[int]:
        """The next prompt batch of the data order, as indices into the training set."""
        d = self.cfg.data
        self.gen_batches += 1
        return list(train_batch_indices(len(self.train_set), d.train_batch_size, self.gen_batches, d.seed, d.shuffle))

    def group_rows(self, index: int) -> list:
        """Prompt `index` repeated rollout.n times (one uid group)."""
        return [self.train_set.rows[index]] * self.cfg.rollout.n

    def next_rows(self) -> list:
        """The next prompt batch of the data order, each prompt repeated rollout.n times (one uid group)."""
        return [r for i in self.next_indices() for r in self.group_rows(i)]

    def train_episodes(self, rows, metrics: dict, step: int | None = None,
                       sync: bool = True) -> tuple[DataProto, dict[str, list]]:
        """Training episodes for `rows`. With dynamic sampling (DAPO), groups whose rewards are all
        equal are dropped and further prompt batches are played until data.train_batch_size
        groups remain, or max_gen_batches were played. The env metrics cover every episode played."""
        ds, target = self.cfg.algorithm.dynamic_sampling, self.cfg.data.train_batch_size
        played = [self._play_for_training(rows, 0, step, sync)]
        while ds.enable and len(played) < ds.max_gen_batches and _n_informative(played) < target:
            played.append(self._play_for_training(self.next_rows(), len(played), step, sync=False))
        rows = [r for p in played for r in p.rows]
        scores = np.concatenate([p.scores for p in played])  # (episodes,)
        env_metrics = {k: [x for p in played for x in p.metrics[k]] for k in played[0].metrics}
        keep = self._keep_informative(rows, scores, len(played), metrics) if ds.enable else list(range(len(rows)))
        result = pick_episodes([p.result for p in played], keep)
        sampling = self.sampling(validate=False, step=step)  # the temperature every played batch shares
        return self.to_batch(result, [rows[i] for i in keep], scores[keep], sampling), env_metrics

    def _play_for_training(self, rows, k: int, step: int | None = None, sync: bool = True) -> Played:
        """Play the k-th generation batch of this step; its scores carry the overlong penalty when on."""
        sampling = self.sampling(validate=False, step=step)
        if k and sampling.seed is not None:  # fresh sampling noise for each extra batch of a step
            sampling = dataclasses.replace(sampling, seed=sampling.seed + 100_003 * k)
        result, scores, env_metrics = self.play(rows, validate=False, sampling=sampling, sync=sync)
        return self.scored(rows, result, scores, env_metrics, k, step)

    def scored(self, rows, result: RolloutResult, scores: np.ndarray, env_metrics: dict, k: int,
                step: int | None) -> Played:
        """A played batch with the overlong penalty (when on) in its scores; the first of a step is dumped."""
        o = self.cfg.algorithm.overlong_penalty
        if o.enable:
            lengths = [len(r) for r in result.response_ids]
            scores = scores + overlong_penalty(lengths, o.max_length, o.buffer, o.factor).astype(np.float32)
        env_metrics["reward"] = scores.tolist()  # what the advantages see, except rows the env masked out whole
        if k == 0 and self.cfg.trainer.dump_rollouts and self.is_main:
            self._dump_rollouts(rows, result, env_metrics, step)
        return Played(rows, result, scores, env_metrics)

    def _dump_rollouts(self, rows, result: RolloutResult, env_metrics: dict, step: int | None = None) -> None:
        """Append the first trainer.dump_rollouts episodes of this step to output_dir/rollouts.jsonl."""
        n = min(self.cfg.trainer.dump_rollouts, len(rows))
        texts = result.info.get("text")
        if texts is None:  # an env that keeps no decoded text
            texts = self.tokenizer.batch_decode(result.response_ids[:n], skip_special_tokens=True)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.out_dir / "rollouts.jsonl", "a") as f:
            for i in range(n):
                rec = {"step": (self.global_step if step is None else step) + 1, "uid": str(rows[i].uid), "text": texts[i],
                       **{k: v[i] for k, v in env_metrics.items() if len(v) == len(rows)}}
                f.write(json.dumps(rec, default=float) + "\n")

    def _keep_informative(self, rows, scores, n_batches: int, metrics: dict) -> list[int]:
        """Rows of the first train_batch_size groups with differing rewards; logs the counts."""
        target = self.cfg.data.train_batch_size
        world = self.dist.world_size if self.dist is not None else self.actor.world_size
        keep, counts = select_groups(scores, [r.uid for r in rows], target, multiple=world)
        metrics.update({f"dapo/groups_{k}": float(v) for k, v in counts.items()})
        metrics.update({"dapo/gen_batches": float(n_batches), "dapo/short_batch": float(counts["kept"] < target)})
        if counts["kept"] < target and self.is_main:
            warnings.warn(f"dynamic sampling: {counts['kept']} of {target} groups have differing rewards after "
                          f"{n_batches} generation batches (algorithm.dynamic_sampling.max_gen_batches); "
                          f"training on those")
        return keep

    # ------------------------------------------------------------------ one update
    def step(self) -> dict[str, float]:
        """One update: the schedule's next batch, old log-probs, reference log-probs, values,
        advantages, critic update, actor update, then the step's metrics."""
        cfg = self.cfg
        start = time.perf_counter()
        rollout = self.schedule.next_batch(self.global_step)  # played now, played ahead, or streamed
        batch, metrics = rollout.batch, dict(rollout.metrics)
        with timer("train", metrics):
            mask = batch.batch["response_mask"].float()  # (batch, response_len)
            self._check_temperature(batch)
            if cfg.rollout.name == "vllm" and not self.schedule.overlaps_update:
                self.actor.sleep_rollout()  # vLLM frees its weights and KV cache; the next sync wakes it

            with timer("old_log_prob", metrics):
                batch = batch.union(self.actor.compute_log_prob(batch))
            if "rollout_log_probs" in batch.batch:  # training/inference drift, as veRL reports it
                metrics.update(logprob_mismatch(batch.batch["old_log_probs"], batch.batch["rollout_log_probs"], mask))
            if self.schedule.off_policy:
                batch.batch["rollout_is_weights"] = self._is_weights(batch, mask, metrics)
            if self.ref is not None:
                with timer("ref", metrics):
                    batch = batch.union(self.ref.compute_ref_log_prob(batch))
            if self.critic is not None:
                with timer("values", metrics):
                    batch = batch.union(self.critic.compute_values(batch))
            with timer("adv", metrics):
                batch.batch.update(self._advantages(batch, mask, metrics))
            if self.floor_ids:  # the actor's floor hinge reads the choice tokens and the floor from the meta
                batch.meta.update(name_ids=self.floor_ids, name_floor=float(cfg.algorithm.name_floor),
                                  name_floor_coef=float(cfg.algorithm.name_floor_coef))

            if self.critic is not None:
                with timer("update_critic", metrics):
                    metrics.update(self.critic.update_critic(batch))
            if self.global_step >= cfg.critic.warmup_steps or self.critic is None:
                with timer("update_actor", metrics):
                    metrics.update(self.actor.update_actor(batch))
        # wall time of the step as the loop sees it: a rollout played ahead counts only where it was waited for
        metrics["timing/step"] = time.perf_counter() - start
        metrics.update(self._episode_metrics(batch, rollout.env_metrics, mask, metrics["timing/step"]))
        metrics.update(self.schedule.after_update())
        return metrics

    def _check_temperature(self, batch: DataProto) -> None:
        expected = SamplingParams(temperature=self.cfg.rollout.temperature).logprob_temperature  # greedy: 1
        if batch.meta.get("temperature") != expected:
            raise ValueError(f"the batch was sampled at temperature {batch.meta.get('temperature')!r} but "
                             f"rollout.temperature is {self.cfg.rollout.temperature}: its log-probs and ratios "
                             "would be computed for another policy")

    def _is_weights(self, batch: DataProto, mask: torch.Tensor, metrics: dict) -> torch.Tensor:
        """Truncated importance weights (batch, response_len) of episodes an older policy may have sampled."""
        if "rollout_log_probs" not in batch.batch:
            raise ValueError("trainer.off_policy_steps=1 and rollout.in_flight need the sampling engine's log-probs: the env must "
                             "return info['rollout_log_probs'] when sampling.return_logprobs is set")
        weights, is_stats = off_policy_weights(batch.batch["old_log_probs"], batch.batch["rollout_log_probs"],
                                               mask, self.cfg.algorithm.rollout_is_cap)
        if "staleness" in batch.batch:  # streaming: episodes the current weights sampled have behaviour
            fresh = batch.batch["staleness"] == 0  # policy pi_old itself (the ratio's ~1e-3 is numerics)
            weights = torch.where(fresh[:, None], mask, weights)
        metrics.update(is_stats)
        return weights

    def _advantages(self, batch: DataProto, mask: torch.Tensor, metrics: dict) -> dict[str, torch.Tensor]:
        """Token rewards (the score on the last policy token, minus the KL penalty when in the reward),
        advantages and returns, each (batch, response_len)."""
        alg = self.cfg.algorithm
        token_scores = place_score_on_last_token(batch.batch["scores"], mask)  # (batch, response_len)
        if alg.use_kl_in_reward and self.ref is not None:
            token_rewards, kl = apply_kl_penalty(token_scores, batch.batch["old_log_probs"],
                                                 batch.batch["ref_log_prob"], mask,
                                                 self.kl_ctrl.value, alg.kl_penalty)
            self.kl_ctrl.update(float(kl), n_steps=len(batch))
            metrics.update({"actor/reward_kl": float(kl), "actor/kl_coef": self.kl_ctrl.value})
        else:
            token_rewards = token_scores
        if alg.adv_estimator == "gae":
            adv, returns = compute_gae(token_rewards, batch.batch["values"], mask,
                                       gamma=alg.gamma, lam=alg.lam, whiten=alg.whiten_advantages,
                                       whiten_groups=batch.non_tensor.get("whiten_group"))
        elif alg.adv_estimator == "grpo":
            adv, returns = compute_grpo_advantages(token_rewards.sum(-1), batch.non_tensor["uid"], mask,
                                                   norm_by_std=alg.grpo_norm_by_std)
        else:
            raise ValueError(f"algorithm.adv_estimator: unknown {alg.adv_estimator!r} (gae | grpo)")
        if alg.get("fork_only") and "branch_mask" not in batch.batch:
            raise ValueError("algorithm.fork_only trains the fork turns of forked groups, and this batch has none: "
                             "set the env's branch_turns (a router's env.branch_turns) with rollout.n > 1")
        if "branch_mask" in batch.batch:  # forked groups (env.branch_turns): the fork turn against its siblings
            branch = batch.batch["branch_mask"] & mask.bool()  # (batch, response_len)
            sibling_adv, _ = compute_grpo_advantages(token_rewards.sum(-1), batch.non_tensor["uid"], mask,
                                                     norm_by_std=alg.grpo_norm_by_std)
            adv = torch.where(branch, sibling_adv, torch.zeros_like(adv) if alg.get("fork_only") else adv)
            metrics["adv/fork_token_share"] = float(branch.sum() / mask.sum().clamp(min=1))
        out = {"token_level_rewards": token_rewards, "advantages": adv, "returns": returns}
        if alg.get("decision_parts"):
            decision = self._decision_tokens(batch, tuple(mask.shape))
            if alg.decision_adv_weight != 1.0:
                out["advantages"] = torch.where(decision, adv * float(alg.decision_adv_weight), adv)
            if alg.get("decision_entropy_coef"):  # the actor adds this weight x the token's entropy to its objective
                out["entropy_weights"] = decision.float() * float(alg.decision_entropy_coef)
            if alg.get("decision_kl_weight", 1.0) != 1.0:  # the actor's KL loss weighs each token's KL by this
                out["kl_weights"] = torch.where(decision, float(alg.decision_kl_weight), 1.0)
        if self.floor_ids:
            parts = part_tensor(batch.non_tensor["token_part"], tuple(mask.shape))
            at = span_starts(parts, part_id(self.env.part_names, alg.name_floor_part)) & mask.bool()
            out["choice_mask"] = at.float()  # (batch, response_len)
            metrics["actor/name_floor_positions"] = float(at.sum()) / len(at)  # per episode
        return out

    def _decision_tokens(self, batch: DataProto, shape: tuple[int, int]) -> torch.Tensor:
        """(batch, response_len) bool: the tokens of algorithm.decision_parts."""
        parts = part_tensor(batch.non_tensor["token_part"], shape)
        ids = [part_id(self.env.part_names, p) for p in self.cfg.algorithm.decision_parts]
        return torch.isin(parts, torch.tensor(ids))

    def _episode_metrics(self, batch: DataProto, env_metrics: dict[str, list], mask: torch.Tensor,
                         step_s: float) -> dict[str, float]:
        """The env's metrics over every episode played, then the trained batch's size, length, advantage, throughput."""
        metrics: dict[str, float] = {}
        for name, values in env_metrics.items():  # "reward" included
            metrics.update(_summary(name, values))
        if self.rollout_imbalance is not None:
            metrics["rollout/load_imbalance"] = self.rollout_imbalance
        metrics["batch/episodes"] = float(len(batch))  # episodes this update trained on (samples per step)
        metrics["response_length/mean"] = float(batch.batch["response_mask"].sum(-1).float().mean())
        metrics["adv/mean"] = float(masked_mean(batch.batch["advantages"], mask))
        names = getattr(self.env, "part_names", None)
        if names and "token_part" in batch.non_tensor:
            parts = part_tensor(batch.non_tensor["token_part"], tuple(mask.shape))
            metrics.update(part_metrics(parts, names, mask, batch.batch["advantages"], batch.batch["old_log_probs"],
                                        batch.batch.get("values"), batch.batch["scores"]))
        # real (unpadded) tokens of the trained batch: prompts, policy and <information> tokens (NeMo-RL's unit)
        attention = batch.batch["attention_mask"]  # (batch, prompt_len + response_len)
        metrics["batch/tokens"] = float(attention.sum())
        metrics["batch/prompt_tokens"] = float(attention[:, :batch.batch["prompts"].shape[1]].sum())
        metrics["timing/tokens_per_s"] = metrics["batch/tokens"] / step_s
        return metrics

    def sft_step(self) -> dict[str, float]:
        """trainer.mode=sft: one update on the next length-bucketed batch of data.sft_files."""
        start = time.perf_counter()
        epoch, examples = self.train_set.batch_at(self.global_step)
        ids, attn, loss_mask = collate(examples, self.tokenizer.pad_token_id)  # each (batch, seq), right-padded
        batch = DataProto.from_dict({"input_ids": ids, "attention_mask": attn, "response_mask": loss_mask})
        metrics: dict[str, float] = {}
        with timer("update_actor", metrics):
            metrics.update(self.actor.update_sft(batch))
        metrics["timing/step"] = time.perf_counter() - start
        tokens = int(attn.sum())
        self.sft_tokens += tokens
        metrics.update({"sft/epoch": float(epoch), "sft/tokens": float(self.sft_tokens),
                        "timing/tokens_per_s": tokens / metrics["timing/step"]})
        return metrics

    # ------------------------------------------------------------------ validation
    def validate(self) -> dict[str, float]:
        """Greedy (when asked) over the whole validation set, the last short batch included."""
        if self.val_set is None:
            return {}
        scores, per_metric, sources = [], {}, []
        for idx in eval_batches(len(self.val_set), self.cfg.data.val_batch_size):
            rows = [self.val_set.rows[i] for i in idx]
            batch, env_metrics = self.run_episodes(rows, validate=True)
            scores += batch.batch["scores"].tolist()
            sources += [r.fields.get("data_source", "all") for r in rows]
            for k, v in env_metrics.items():
                per_metric.setdefault(k, []).extend(v)
        out = {"val/reward/mean": float(np.mean(scores)), "val/n": len(scores)}
        for k, v in per_metric.items():
            if k != "reward" and v and isinstance(v[0], (int, float, bool, np.number)):
                out[f"val/{k}/mean"] = float(np.mean(v))
        for src in sorted(set(sources)):
            sel = [s for s, d in zip(scores, sources) if d == src]
            out[f"val/{src}/reward"] = float(np.mean(sel))
        return out

    # ------------------------------------------------------------------ checkpoints
    def save(self, metrics: dict | None = None) -> Path:
        """Save this step's checkpoint; `metrics` (the step's metrics.jsonl row) rides in trainer_state.json, so
        a kill between the manifest and the row loses nothing (`_restore_row`)."""
        step_dir = self.out_dir / "checkpoints" / f"step_{self.global_step:06d}"
        if self.is_main:
            shutil.rmtree(step_dir, ignore_errors=True)
        self._barrier()
        self.actor.save_checkpoint(str(step_dir / "actor"))
        if self.critic is not None:
            self.critic.save_checkpoint(str(step_dir / "critic"))
        if self.is_main:
            # env state and draw counter as of the trained episodes: a resumed run replays the untrained ones
            state = {"global_step": self.global_step, "kl_coef": self.kl_ctrl.value, "sft_tokens": self.sft_tokens,
                     **self.schedule.state_dict()}
            torch.save(state, step_dir / "trainer_state.pt")
            row = {k: _plain(v) for k, v in (metrics or {}).items()}
            (step_dir / "trainer_state.json").write_text(json.dumps(
                {"global_step": self.global_step, "kl_coef": self.kl_ctrl.value, "metrics": row}, default=str))
            save_run_config(self.cfg, step_dir)  # evaluation reads the shape the run trained with
            checkpoint.write_manifest(step_dir, self.global_step)  # last: its presence means complete
            self._prune()
        self._barrier()
        return step_dir

    def _prune(self):
        keep = self.cfg.trainer.max_checkpoints
        for old in checkpoint.step_dirs(self.out_dir)[:-keep] if keep else []:
            shutil.rmtree(old, ignore_errors=True)

    def _verify(self, step_dir: Path) -> None:
        """checkpoint.verify on rank 0 (the files are read once); every rank gets its verdict."""
        problem = None
        if self.is_main:
            try:
                checkpoint.verify(step_dir)
            except CheckpointError as e:
                problem = str(e)
        if self.dist is not None and self.dist.world_size > 1:
            box = [problem]
            torch.distributed.broadcast_object_list(box, src=0)
            problem = box[0]
        if problem:
            raise CheckpointError(problem)

    def _load(self, step_dir: Path) -> None:
        self.actor.load_checkpoint(str(step_dir / "actor"))
        if self.critic is not None:
            self.critic.load_checkpoint(str(step_dir / "critic"))
        path = step_dir / "trainer_state.pt"
        try:
            state = torch.load(path, weights_only=False)
            if self.env is not None:
                self.env.load_state_dict(state["env"])
        except (Exception, CheckpointException) as e:  # torch's CheckpointException is a BaseException
            raise CheckpointError(f"{path}: cannot read the trainer state ({type(e).__name__}: {e})") from e
        self.global_step = int(state["global_step"])
        self.gen_batches = int(state.get("gen_batches", self.global_step))  # one batch per step before DAPO
        self.kl_ctrl.value = float(state["kl_coef"])  # both controllers keep it as a plain attribute
        self.sft_tokens = int(state.get("sft_tokens", 0))
        self.schedule.load_state_dict(state)

    def resume(self) -> None:
        """resume=auto: the newest checkpoint that verifies and loads (damaged ones are reported and
        skipped); a step directory: that one, or CheckpointError naming what is wrong with it. Either way
        RunDirError for a finished run or changed training settings (checkpoint.check_resume)."""
        mode = str(self.cfg.trainer.resume)
        log = (lambda msg: print(msg, flush=True)) if self.is_main else (lambda msg: None)
        def load(step_dir: Path) -> None:  # refused before any weight is read
            checkpoint.check_resume(step_dir, self.cfg, log if self.is_main else (lambda msg: None))
            self._load(step_dir)

        if mode == "none":
            step_dir = None
        elif mode == "auto":
            step_dir = checkpoint.resume_newest(self.out_dir, load, log, check=self._verify)
        else:
            step_dir = Path(mode)
            self._verify(step_dir)
            load(step_dir)
        if self.is_main:  # the killed run's rows of the steps about to be redone
            for path in (self.out_dir / "metrics.jsonl", self.out_dir / "rollouts.jsonl"):
                if trim_jsonl(path, self.global_step):
                    log(f"{path}: dropped the rows after step {self.global_step} (they are redone)")
        if step_dir is not None:
            log(f"resumed from {step_dir} (step {self.global_step})")
            if self.is_main:
                self._restore_row(step_dir, log)

    def _restore_row(self, step_dir: Path, log) -> None:
        """A kill after a checkpoint's manifest and before its metrics row: the row is logged again from the
        checkpoint's trainer_state.json; any other step without a row is named in a warning."""
        if self.tracker is None or "jsonl" not in self.tracker.sinks:
            return
        path = self.tracker.jsonl_path
        logged = {r.get("step") for r in read_jsonl(path)} if path.exists() else set()
        if self.global_step not in logged:
            row = json.loads((step_dir / "trainer_state.json").read_text()).get("metrics")
            if row:
                self.tracker.log(row, self.global_step, self.cfg.trainer.total_steps)
                logged.add(self.global_step)
                log(f"{path}: step {self.global_step}'s row was missing (a kill after its checkpoint); "
                    f"logged it again from {step_dir.name}/trainer_state.json")
        missing = [s for s in range(1, self.global_step + 1) if s not in logged]
        if missing:
            log(f"WARNING: {path} has no row for step(s) {_ranges(missing)} (up to the resumed step "
                f"{self.global_step}): those metrics are lost")

    # ------------------------------------------------------------------ main loop
    @property
    def is_main(self) -> bool:
        return self.dist is None or self.dist.rank == 0

    def _barrier(self):
        if self.dist is not None:
            self.dist.barrier()

    def _log(self, metrics: dict, step: int):
        if self.tracker is not None and self.is_main:
            self.tracker.log(metrics, step, self.cfg.trainer.total_steps)

    def fit(self) -> dict[str, float]:
        """Train for trainer.total_steps updates (or until trainer.time_limit_s); returns the last step's metrics."""
        t = self.cfg.trainer
        self.resume()
        if t.val_before_train and self.global_step == 0:
            self._log(self.validate(), 0)
        last, bad, started = {}, 0, time.perf_counter()
        bar = tqdm(range(self.global_step + 1, t.total_steps + 1), desc=self.mode,
                   disable=not self.is_main or not on_terminal(),  # redirected: the tracker's lines, no redraws
                   initial=self.global_step, total=t.total_steps)
        for step in bar:
            metrics = self.sft_step() if self.mode == "sft" else self.step()
            self.global_step = step
            bad = bad + 1 if _skipped_update(metrics) else 0
            if bad >= MAX_BAD_STEPS:
                self._log(metrics, step)
                raise TrainingDivergedError(
                    f"{self.mode} diverged: {bad} steps in a row with a non-finite loss or gradient (up to step {step}, "
                    f"lr {metrics.get('actor/lr', float('nan')):.3g}); lower actor.lr. Nothing more was saved to "
                    f"{self.out_dir}")
            timed_out = t.time_limit_s is not None and time.perf_counter() - started > t.time_limit_s
            if timed_out:
                self.stopped = f"time limit {t.time_limit_s:g}s"
                if self.is_main:  # a cut schedule trains a different model: say so where it happens
                    cut = " (the learning-rate schedule did not finish)" if schedule_length_matters(self.cfg) else ""
                    tqdm.write(f"{self.mode} STOPPED EARLY at step {step} of {t.total_steps}: trainer.time_limit_s="
                               f"{t.time_limit_s:g} reached{cut}")
            is_last = step == t.total_steps or timed_out
            if is_last or (t.test_freq and step % t.test_freq == 0):
                self.schedule.wait()
                metrics.update(self.validate())
            if is_last or (t.save_freq and step % t.save_freq == 0):
                self.schedule.wait()
                self.save(metrics)
            self._log(metrics, step)
            if self.mode == "sft":
                bar.set_postfix(loss=f"{metrics.get('actor/sft_loss', float('nan')):.3f}")
            else:
                bar.set_postfix(reward=f"{metrics.get('reward/mean', float('nan')):.3f}")
            last = metrics
            if self.mode == "sft":
                self.sft_losses.append(metrics["actor/sft_loss"])
            if timed_out:
                break
        bar.close()
        train_s = time.perf_counter() - started
        if self.is_main and self.tracker is not None and self.tracker.jsonl_path.exists():
            try:
                labels = decoding_labels(self.cfg.rollout) if self.mode == "ppo" else {}  # sft: no sampling
                plot_curves(self.tracker.jsonl_path, list(t.plot_keys), self.out_dir / "curves.png",
                            title=t.experiment_name, **labels)
            except ValueError as e:
                print(f"no plot: {e}")
        if t.export_hf:
            hf_dir = Path(t.hf_dir) if t.hf_dir else self.out_dir / "hf"
            self.actor.export_hf(str(hf_dir))
            if self.is_main:
                save_run_config(self.cfg, hf_dir)
        if self.mode == "sft" and self.is_main:
            self._write_sft_summary(train_s)
        return last

    def close(self) -> None:
        """Stop the rollouts still playing (streaming's groups are in the last checkpoint's pending list)."""
        self.schedule.close()

    def _write_sft_summary(self, train_s: float) -> None:
        """output_dir/sft_summary.json: steps, first and final loss (mean of the last 10), throughput, why it stopped."""
        recent = self.sft_losses[-10:]
        summary = {"steps": self.global_step, "planned_steps": self.cfg.trainer.total_steps,
                   "examples": len(self.train_set.examples), "first_loss": self.sft_losses[0] if self.sft_losses else None,
                   "final_loss": sum(recent) / max(1, len(recent)), "tokens": self.sft_tokens,
                   "tokens_per_s": self.sft_tokens / max(train_s, 1e-9), "train_s": train_s, "stopped": self.stopped}
        (self.out_dir / "sft_summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def _right_padded(rows: list[list], shape, dtype) -> torch.Tensor:
    """Per-token rows laid into a zero tensor of `shape` (batch, response_len) from position 0, as responses are."""
    out = torch.zeros(shape, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, :len(row)] = torch.as_tensor(row, dtype=dtype)
    return out


def _ranges(steps: list[int]) -> str:
    """[1, 2, 3, 5] -> '1-3, 5'."""
    out, start = [], steps[0]
    for prev, cur in zip(steps, steps[1:] + [None]):
        if cur != prev + 1:
            out.append(f"{start}-{prev}" if prev > start else str(start))
            start = cur
    return ", ".join(out)


def _skipped_update(metrics: dict) -> bool:
    """Whether an update of this step met a non-finite gradient norm (its optimizer step was skipped)."""
    return any(k.endswith("/grad_norm") and not math.isfinite(v) for k, v in metrics.items())
