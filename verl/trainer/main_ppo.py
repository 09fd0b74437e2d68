"""Entry point: `python -m verl.trainer.main_ppo [key=value ...]` (hydra, configs/ppo_trainer.yaml).

trainer.mode=ppo (RL) or sft (supervised warm start on data.sft_files: configs/sft.yaml); both run
the same actor worker, update loop, checkpoints and logging.

Launch modes (trainer.backend):
  spmd  one process on CPU or one GPU, or `torchrun --nproc_per_node N -m verl.trainer.main_ppo`:
        every process runs this controller and holds its share of every worker;
  ray   one controller process; workers are Ray actors (one per GPU, several nodes).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from verl.trainer import checkpoint, preflight
from verl.trainer.config import CONFIG_DIR, check_env_config, register_configs, save_run_config
from verl.trainer.dataset import PromptDataset
from verl.trainer.dist import Dist
from verl.trainer.env_interface import load_env
from verl.trainer.ppo_trainer import PPOTrainer
from verl.trainer.sft_data import SFTSet
from verl.trainer.tracking import Tracker, hide_library_bars, read_jsonl, summary_table
from verl.utils.tokenizer import load_tokenizer
from verl.workers.config import WorkerConfig
from verl.workers.model_loader import parse_model_spec, spec_for_tokenizer

CONFIG_DIR = str(CONFIG_DIR)
register_configs()


def load_config(name: str = "ppo_trainer", overrides=()) -> DictConfig:
    """Compose configs/<name>.yaml with hydra overrides, outside a hydra app (tests, notebooks); env typed."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(CONFIG_DIR, version_base=None):
        return check_env_config(compose(name, overrides=list(overrides)))


def uses(cfg: DictConfig) -> tuple[bool, bool]:
    """(critic, reference) on or off, resolving `auto`."""
    critic = cfg.critic.enable
    critic = cfg.algorithm.adv_estimator == "gae" if critic == "auto" else bool(critic)
    ref = cfg.ref.enable
    ref = (cfg.algorithm.use_kl_in_reward or cfg.actor.use_kl_loss) if ref == "auto" else bool(ref)
    return critic, ref


def resolved_dtype(model_dtype: str) -> str:
    """model.dtype as a torch dtype name (auto: bf16; on CPU the workers compute in fp32 anyway)."""
    if model_dtype not in ("auto", "bf16", "bfloat16", "fp32", "float32"):
        raise ValueError(f"model.dtype must be auto | bf16 | fp32, got {model_dtype!r}")
    return "bfloat16" if model_dtype in ("auto", "bf16", "bfloat16") else "float32"


def worker_configs(cfg: DictConfig, tokenizer) -> tuple[WorkerConfig, WorkerConfig]:
    """(policy, critic) worker configs: the resolved model plus the actor and critic sections."""
    m = cfg.model
    policy = spec_for_tokenizer(OmegaConf.to_container(m.path, resolve=True) if OmegaConf.is_config(m.path) else m.path,
                                tokenizer)
    critic_model = policy if m.critic_path is None else spec_for_tokenizer(m.critic_path, tokenizer)
    shared = dict(tokenizer=tokenizer, dtype=resolved_dtype(m.dtype), seed=m.seed, total_steps=cfg.trainer.total_steps,
                  gradient_checkpointing=m.gradient_checkpointing, compile=m.compile,
                  actor=OmegaConf.to_object(cfg.actor), critic=OmegaConf.to_object(cfg.critic))
    return WorkerConfig(model=policy, **shared), WorkerConfig(model=critic_model, **shared)


def rollout_config(cfg: DictConfig) -> dict:
    r = cfg.rollout
    out = {"name": r.name, "max_batch_size": r.max_batch_size, "tensor_parallel_size": r.tensor_parallel_size,
           "gpu_memory_utilization": r.gpu_memory_utilization, "seed": cfg.trainer.seed,
           "cuda_graph": r.cuda_graph, "compile": r.compile, "compile_mode": r.compile_mode,
           "decode_linear": r.decode_linear, "decode_attention": r.decode_attention,
           "enforce_eager": r.enforce_eager, "device": r.device,
           "max_model_len": r.max_model_len or cfg.data.max_prompt_length + r.max_response_length + r.response_length}
    if isinstance(cfg.model.path, str):  # vLLM starts from the checkpoint, then gets the actor's weights
        out["model_path"] = cfg.model.path
    if r.name == "vllm":  # the transformers backends decode a copy of the actor at the actor's compute dtype
        out["dtype"] = resolved_dtype(cfg.model.dtype)
    return out


def build_groups(cfg: DictConfig, tokenizer, backend: str) -> tuple[dict, Dist | None]:
    """Actor(+rollout), critic and reference worker groups for the chosen backend."""
    from verl.workers.actor import ActorWorker
    from verl.workers.actor_rollout import ActorRolloutWorker
    from verl.workers.critic import CriticWorker

    actor_cfg, critic_cfg = worker_configs(cfg, tokenizer)
    if cfg.trainer.mode == "sft":  # the actor alone: no rollout engine, critic or reference
        use_critic, use_ref = False, False
        specs = {"actor": (ActorWorker, {"config": actor_cfg, "role": "actor"})}
    else:
        use_critic, use_ref = uses(cfg)
        specs = {"actor": (ActorRolloutWorker, {"config": actor_cfg, "rollout": rollout_config(cfg)})}
    if use_critic:
        specs["critic"] = (CriticWorker, {"config": critic_cfg})
    # A LoRA actor is its own reference (adapters off): no second copy of the weights.
    ref_is_actor = use_ref and actor_cfg.actor.lora.enabled
    if use_ref and not ref_is_actor:
        specs["ref"] = (ActorWorker, {"config": actor_cfg, "role": "ref"})

    if backend == "spmd":
        from verl.single_controller.spmd import SPMDWorkerGroup

        groups = {name: SPMDWorkerGroup(cls(**kw)) for name, (cls, kw) in specs.items()}
        dist = Dist(groups["actor"].rank, groups["actor"].world_size)
    else:
        groups = ray_groups(cfg, specs)
        dist = None
    for group in groups.values():
        group.init_model()
    if ref_is_actor:
        groups["ref"] = groups["actor"]
    return groups, dist


def ray_groups(cfg: DictConfig, specs: dict) -> dict:
    """One colocated Ray group (one actor per rank hosting every role); a view per role for the trainer."""
    import ray

    from verl.single_controller.ray_group import RayPlacement, RayWorkerGroup

    t = cfg.trainer
    if not ray.is_initialized():
        ray.init(address=t.ray_address, ignore_reinit_error=True)
    placement = RayPlacement(world_size=t.nnodes * t.n_gpus_per_node, num_cpus_per_worker=t.num_cpus_per_worker,
                             num_gpus_per_worker=1 if _want_cuda(cfg) else 0, nnodes=t.nnodes,
                             strategy=t.ray_placement, ready_timeout_s=t.ray_ready_timeout_s)
    group = RayWorkerGroup(specs, placement)
    group.check_shared_dir(t.output_dir)
    print(f"ray: {placement.world_size} rank(s) on node(s) {group.nodes}", flush=True)
    return {name: group.role(name) for name in specs}


def _want_cuda(cfg: DictConfig) -> bool:
    import torch

    return cfg.trainer.device == "cuda" or (cfg.trainer.device == "auto" and torch.cuda.is_available())


def pick_backend(cfg: DictConfig) -> str:
    b = cfg.trainer.backend
    if b == "auto":
        return "ray" if (cfg.trainer.nnodes > 1 or cfg.trainer.ray_address) else "spmd"
    if b not in ("spmd", "ray"):
        raise ValueError(f"trainer.backend must be auto|spmd|ray, got {b!r}")
    return b


def resolve_total_steps(cfg: DictConfig, steps_per_epoch: int) -> int:
    """trainer.total_steps from itself and trainer.total_epochs (the smaller where both are set), written back
    so that the workers' lr schedule, the loop and the saved run config see one number."""
    t = cfg.trainer
    counts = [n for n in (t.total_steps, t.total_epochs * steps_per_epoch if t.total_epochs else None) if n is not None]
    if not counts:
        raise ValueError("set trainer.total_steps or trainer.total_epochs")
    if min(counts) < 1:
        raise ValueError(f"trainer.total_steps/total_epochs give {min(counts)} steps ({steps_per_epoch} per epoch)")
    t.total_steps = min(counts)
    return t.total_steps


def keep_freed_memory() -> None:
    """Let glibc keep freed large blocks instead of unmapping them (no-op elsewhere).

    Every SFT step frees and re-allocates the same large tensors (logits and their grads); by
    default glibc returns them to the OS and page-faults them back in, which cost about a
    third of the step time on CPU here."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.mallopt(-4, 0)  # M_MMAP_MAX = 0: large blocks come from the heap, not from mmap
    libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD: keep up to 1 GiB of free heap


def run(cfg: DictConfig) -> dict:
    """Build everything from the config and train; returns the last step's metrics."""
    mode = cfg.trainer.mode
    if mode not in ("ppo", "sft"):
        raise ValueError(f"trainer.mode must be ppo | sft, got {mode!r}")
    if mode == "ppo":
        cfg = check_env_config(cfg)  # an unknown env key fails here, before any model loads
    else:  # SFT plays no episode: its run config names no env, so evaluation never takes a shape from it
        with open_dict(cfg):
            cfg.env = None
    preflight.check(cfg)  # GPUs, data files, the pool key: before the tokenizer's hub retries
    if cfg.trainer.device == "cpu":
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    hide_library_bars()
    if isinstance(cfg.model.path, str) and cfg.model.path.endswith(".json"):  # the run config keeps the mapping itself
        cfg.model.path = parse_model_spec(cfg.model.path)
    tokenizer = load_tokenizer(cfg.model.tokenizer)
    d = cfg.data
    if mode == "sft":
        env, val = None, None
        train = SFTSet.load(list(d.sft_files), tokenizer, d.sft_max_length, d.train_batch_size, d.seed, d.shuffle)
        resolve_total_steps(cfg, train.batches_per_epoch)
        if not _want_cuda(cfg):
            keep_freed_memory()
    else:
        env = load_env(cfg.env.factory, cfg.env, tokenizer)
        check = getattr(env, "check_row", None)  # the environment's row validation, run while loading
        train = PromptDataset(list(d.train_files), tokenizer, d.prompt_key, d.max_prompt_length, d.truncation,
                              limit=d.train_limit, row_check=check)
        val = PromptDataset(list(d.val_files), tokenizer, d.prompt_key, d.max_prompt_length, d.truncation,
                            limit=d.val_limit, row_check=check) if d.val_files else None
        resolve_total_steps(cfg, len(train) // d.train_batch_size)
    backend = pick_backend(cfg)
    check_output_dir(cfg)  # before the models load: a refused resume costs a second, not a model load
    groups, dist = build_groups(cfg, tokenizer, backend)
    is_main = dist is None or dist.rank == 0
    if is_main:
        save_run_config(cfg, cfg.trainer.output_dir)
    tracker = Tracker(list(cfg.trainer.logger), cfg.trainer.output_dir, cfg.trainer.project_name,
                      cfg.trainer.experiment_name, OmegaConf.to_container(cfg, resolve=True),
                      resume=cfg.trainer.resume != "none", console_every=cfg.trainer.console_every) if is_main else None
    trainer = PPOTrainer(cfg, tokenizer, groups, env, train, val, tracker, dist)
    try:
        last = trainer.fit()
    finally:
        trainer.close()  # groups still in play (streaming) stop before the env's client closes
        if tracker is not None:
            tracker.finish()
        close = getattr(env, "close", None)
        if close is not None:
            close()
        for view in groups.values():  # Ray: free the actors and their placement group (once per group)
            owner = getattr(view, "group", None)
            if owner is not None and owner.hosts:
                owner.shutdown()
    if is_main:
        print(summary(last, cfg, trainer.stopped), flush=True)
    check = getattr(env, "check_run", None)  # after the table, so the failure it names is on screen
    if check is not None:
        check()
    return last


def check_output_dir(cfg: DictConfig) -> None:
    """trainer.resume=none moves a used output_dir aside (rank 0); otherwise the checkpoint a resume would start
    from is checked (checkpoint.check_resume: RunDirError for a finished run or changed training settings).
    The trainer checks the checkpoint it really loads again."""
    t = cfg.trainer
    resume = str(t.resume)
    if resume == "none":
        if int(os.environ.get("RANK", "0")) == 0:
            checkpoint.move_aside(t.output_dir, lambda msg: print(msg, flush=True))
        return
    candidates = checkpoint.step_dirs(t.output_dir)[-1:] if resume == "auto" else [Path(resume)]
    for step_dir in candidates:
        if (step_dir / checkpoint.MANIFEST).is_file():
            checkpoint.check_resume(step_dir, cfg, log=lambda msg: None)


def summary(metrics: dict, cfg: DictConfig, stopped: str = "done") -> str:
    """The end-of-run table: the console fields over the whole run (metrics.jsonl), else the last step's;
    a run that stopped before its planned steps says why in the first line."""
    out = Path(cfg.trainer.output_dir)
    rows = read_jsonl(out / "metrics.jsonl") if (out / "metrics.jsonl").exists() else [{"step": 0, **metrics}]
    steps = rows[-1]["step"] if rows else 0
    early = "" if stopped == "done" else f" - STOPPED EARLY ({stopped})"
    return (f"finished {steps} of {cfg.trainer.total_steps} steps{early} -> {out} (every metric: metrics.jsonl)\n"
            + summary_table(rows))


@hydra.main(config_path=CONFIG_DIR, config_name="ppo_trainer", version_base=None)
def main(cfg: DictConfig) -> None:
    try:
        run(cfg)
    except (preflight.PreflightError, checkpoint.RunDirError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
