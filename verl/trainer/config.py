"""The run config: one dataclass per yaml section, registered with Hydra's ConfigStore as `ppo_schema`.

Every key has one home, here or in verl/workers/config.py (model, actor, critic, ref) or, for the `env`
section, in the dataclass its factory names (`make_env.config_class`): field name = yaml key, default,
and its documentation beside it. configs/*.yaml only override. Hydra rejects an unknown or mistyped key
at start, naming it; `check_env_config` does the same for `env` against the environment's dataclass.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from hydra.core.config_store import ConfigStore
from omegaconf import II, DictConfig, OmegaConf, open_dict
from omegaconf.errors import ConfigKeyError, ValidationError

from verl.trainer.env_interface import import_factory
from verl.workers.config import ActorConfig, CriticConfig, ModelConfig, RefConfig


@dataclass
class DataConfig:
    """`data`: prompts and batches."""

    train_files: list[str] = field(default_factory=lambda: ["tests/data/toy_prompts.parquet"])  # parquet files with a `prompt` column of chat messages
    val_files: list[str] = field(default_factory=lambda: ["tests/data/toy_prompts.parquet"])  # validation parquet files (empty: no validation)
    prompt_key: str = "prompt"  # the column holding the chat messages
    max_prompt_length: int = 256  # tokens; longer prompts: see truncation
    truncation: str = "error"  # error | left | skip
    train_batch_size: int = 8  # prompts per step (before rollout.n samples each)
    val_batch_size: int = 16  # validation batch; the last short batch is kept
    shuffle: bool = True  # shuffle the training order each epoch
    seed: int = 42  # fixes the data order; a resumed run sees the same order
    train_limit: Optional[int] = None  # use only the first N training rows (debugging)
    val_limit: Optional[int] = None  # use only the first N validation rows
    sft_files: list[str] = field(default_factory=list)  # trainer.mode=sft: parquet or JSONL files of rows with `prompt` (chat messages) and `segments` ([{text, by_policy, loss?}]: loss false keeps a policy slip as context, unlearnt); steps draw data.train_batch_size rows in length buckets
    sft_max_length: int = 1024  # trainer.mode=sft: longest prompt + segments in tokens; a longer row is an error naming it
    prompt_template: Optional[str] = None  # the template file the data's prompts were built with (data_process --prompt-template): copied as prompt_template.txt beside run_config.yaml into every checkpoint and the HF export, where evaluation, infer.py and the server build their prompts from it; null: the default template


@dataclass
class RolloutConfig:
    """`rollout`: the decoding engine and its sampling."""

    name: str = "hf"  # hf (transformers, everywhere) | hf_static (static KV cache + CUDA-graph decode; Llama/Qwen2/Gemma 3 shapes; the fast choice on GPU without vLLM) | vllm (GPU, the vllm extra). On the H200 hf wrote a wrong first token in one chunk per call with Gemma 3 (docs/results.md, the H200 runs): use hf_static there
    temperature: float = 1.0  # training sampling temperature
    top_p: float = 1.0  # nucleus sampling
    top_k: int = -1  # top-k sampling (-1 = off)
    n: int = 1  # samples per prompt (GRPO/DAPO groups)
    response_length: int = 64  # max tokens generated per turn (and per single-turn response)
    max_response_length: int = 256  # max total response tokens (all turns + observations)
    device: Optional[str] = None  # hf / hf_static: where the engine's copy of the policy decodes; null: the actor's device. One process only: cuda:1 puts the rollout on a second GPU, so with trainer.off_policy_steps=1 the whole rollout runs beside the update
    max_batch_size: int = 64  # hf / hf_static: rows decoded together (hf_static preallocates its cache for this many)
    max_model_len: Optional[int] = None  # hf_static cache columns per row / vllm context; null: data.max_prompt_length + max_response_length + response_length (the longest context a turn can see)
    cuda_graph: bool = True  # hf_static: replay the decode step as a CUDA graph (false: eager, for debugging)
    compile: bool = False  # hf_static: torch.compile the per-layer work around the matmuls and the sampler; compiles once, ~15 s on a GPU
    compile_mode: str = "default"  # hf_static, with compile: torch.compile's mode for that work; "max-autotune-no-cudagraphs" lets Inductor time its Triton GEMM templates against cuBLAS for the decode's skinny matmuls (slower at Qwen2.5's shapes on an H200, 3B step 5.14 -> 5.50 ms, and a 90 s first call: docs/results/h200/decode_s7; the engine captures its own CUDA graph, so no mode with cudagraphs)
    decode_linear: str = "torch"  # hf_static: the layers' matmuls at decode; "torch" (F.linear: cuBLAS), "triton" (a split-K kernel that spreads a skinny matmul's weight over every SM: triton_decode_linear.py; slower than cuBLAS at Qwen2.5's shapes on an H200, 3B step 5.14 -> 6.19 ms: docs/results/h200/decode_s7)
    decode_attention: str = "auto"  # hf_static: "triton" (one split-K kernel reading only the cache columns a row attends), "matmul" (batched matmuls over the bucket with a mask), "auto" (triton on CUDA when it imports, else matmul)
    gpu_memory_utilization: float = 0.5  # vllm: share of GPU memory for weights and KV cache
    tensor_parallel_size: int = 1  # vllm: GPUs per engine
    enforce_eager: bool = False  # vllm: no CUDA graphs (debugging)
    enable_sleep_mode: bool = True  # vllm: release the KV cache and the weights while the actor and critic train, restore them for the next rollout
    sleep_level: int = 1  # vllm, with enable_sleep_mode: 1 keeps the weights in CPU memory while asleep, 2 drops them (each step's weight sync sends every parameter back)
    in_flight: int = 0  # streaming rollouts (0: off, each step plays its own batch): prompt groups (rollout.n episodes each) kept in play; a step trains on the first data.train_batch_size that finish, the rest carry over (bounded by trainer.max_staleness, weighted by algorithm.rollout_is_cap); try 2x data.train_batch_size. Needs an env with rollout_async; not with dynamic sampling, off_policy_steps or torchrun ranks
    val_greedy: bool = True  # validation decodes greedily (and really does)
    val_temperature: float = 0.0  # validation temperature when val_greedy is false


@dataclass
class KLCtrlConfig:
    """`algorithm.kl_ctrl`: the coefficient of KL in the reward."""

    type: str = "fixed"  # fixed | adaptive
    kl_coef: float = 0.001  # the (initial) coefficient
    target_kl: float = 0.1  # adaptive only: the KL the controller steers to
    horizon: int = 10000  # adaptive only: its time constant in samples


@dataclass
class DynamicSamplingConfig:
    """`algorithm.dynamic_sampling` (DAPO): drop groups (same uid) whose rewards are all equal (zero advantage) and
    play further prompt batches until data.train_batch_size groups remain; needs rollout.n > 1; logs
    dapo/groups_{kept,dropped,trained,filled} and dapo/gen_batches."""

    enable: bool = False  # on / off
    max_gen_batches: int = 10  # cap on prompt batches per step; then train on what there is (a warning, dapo/short_batch = 1)


@dataclass
class OverlongPenaltyConfig:
    """`algorithm.overlong_penalty`: DAPO's soft overlong punishment, added to the score before advantages."""

    enable: bool = False  # on / off
    max_length: int = II("rollout.max_response_length")  # response tokens (all turns + observations) where it reaches -factor
    buffer: int = 64  # the penalty falls linearly from 0 to -factor over the last `buffer` tokens
    factor: float = 1.0  # the full penalty


@dataclass
class AlgorithmConfig:
    """`algorithm`: advantages and KL."""

    adv_estimator: str = "gae"  # gae | grpo
    gamma: float = 1.0  # GAE discount
    lam: float = 1.0  # GAE lambda
    whiten_advantages: bool = True  # gae: whiten over policy tokens
    whiten_by: Optional[str] = None  # gae: whiten within each value of this per-episode field of the env's rollout info instead of over the whole batch ("alpha": per cost weight, for a router trained on several, env.alphas: an episode is then compared only with episodes of its own alpha); null: the whole batch. grpo needs none: a group shares its prompt
    grpo_norm_by_std: bool = True  # grpo: divide by the group's std (false: Dr. GRPO)
    use_kl_in_reward: bool = True  # subtract kl_coef * KL(policy || ref) per token from the reward
    kl_penalty: str = "k1"  # KL estimator in the reward: k1 | abs | k2 | k3
    kl_ctrl: KLCtrlConfig = field(default_factory=KLCtrlConfig)  # the KL-in-reward coefficient
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)  # DAPO's group filter
    overlong_penalty: OverlongPenaltyConfig = field(default_factory=OverlongPenaltyConfig)  # DAPO's length penalty
    rollout_is_cap: float = 2.0  # off-policy: per-token importance weight pi_old/pi_rollout truncated at this
    decision_parts: list[str] = field(default_factory=list)  # parts of the env's token labels (its part_names; a router's: route_model, think_model) whose advantage is scaled by decision_adv_weight; empty: every policy token alike
    decision_adv_weight: float = 1.0  # the scale of decision_parts' advantages: a larger step for the few tokens that choose (a route's model name is ~4% of a router's policy tokens) against the many that copy (docs/rl_diagnosis.md section 15)
    decision_entropy_coef: float = 0.0  # entropy bonus on decision_parts' tokens alone, aggregated as the policy loss (keeps the names' sampling spread; from the card start 0.3-1 learned the routing no faster and 3 left the specialists for the generalists: docs/results/card_start); 0: none
    decision_kl_weight: float = 1.0  # the KL loss's weight on decision_parts' tokens against the other policy tokens' 1 (actor.use_kl_loss): 0 lets the choice leave the warm start while the KL still holds the copies (from the card start at lr 2e-4 the routing is learned in fewer steps: docs/results/card_start); 1: every token alike
    name_floor: float = 0.0  # a floor under each of the env's choice tokens' (its choice_token_ids(): a router's pool names' first tokens) mean probability over the choice positions of a micro-batch (the first token of each name_floor_part span), at the sampling temperature: a hinge on the log of that mean, from the full softmax, so a name no episode sampled is pushed back up where it is likeliest (a name that falls to ~0 in one update is never sampled again: docs/results/card_start); 0: none
    name_floor_part: str = "think_model"  # the env's token part (one of its part_names) whose spans' first tokens are the choices the floor applies at (a router's think names the model it asks: "Ask X.")
    name_floor_coef: float = 1.0  # the floor hinge's weight beside the policy loss
    fork_only: bool = False  # forked groups (the env's branch_turns): train the fork turns alone, every other token's advantage 0 (the route's credit without the rest of the episode's; docs/results/forked_groups)


@dataclass
class TrainerConfig:
    """`trainer`: the loop, checkpoints, logging and launch."""

    mode: str = "ppo"  # ppo (rollout, reward, RL update) | sft (supervised: the next-token loss on data.sft_files' policy tokens, the same actor worker, checkpoints and logging)
    total_steps: Optional[int] = 4  # N steps = N updates; the last step is always saved. null: total_epochs decides
    total_epochs: Optional[int] = None  # passes over the training data (ppo: full data.train_batch_size batches; sft: length buckets, the last one short); with total_steps set, the smaller count
    time_limit_s: Optional[float] = None  # stop after the step that passes S seconds of training; it is saved and exported as the last (a safety net)
    save_freq: int = 2  # save every N steps (0 = only the last)
    test_freq: int = 2  # validate every N steps (0 = only the last); also before step 1 if val_before_train
    val_before_train: bool = True  # validate once before training
    output_dir: str = "outputs/smoke"  # checkpoints, metrics.jsonl, curves.png, hf/ and the run's config.yaml
    resume: str = "auto"  # auto (latest complete checkpoint in output_dir; a finished run, or one whose training settings differ, is refused: config.TRAINING_SECTIONS) | none (a fresh run: a used output_dir is moved aside to output_dir.old-<time>, named in the log) | a step directory
    resume_changed_ok: bool = False  # resume although training settings differ from the checkpoint's run config (the keys are listed; the later steps train with the new ones)
    max_checkpoints: int = 3  # keep the newest N checkpoints (0 = all)
    export_hf: bool = True  # write the final actor as an HF model (with its tokenizer and run_config.yaml) to hf_dir
    hf_dir: Optional[str] = None  # where export_hf writes; null: output_dir/hf
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])  # console (a line per step) | jsonl (output_dir/metrics.jsonl) | tensorboard (output_dir/tensorboard; extra [tensorboard]) | wandb (project_name, experiment_name; extra [wandb]); another name, or a missing package, stops the run before anything loads (the preflight)
    console_every: int = 10  # output not a terminal: no progress bars, the console line every N steps (and the first, last and validated); a terminal: every step
    project_name: str = "router-r1"  # wandb project
    experiment_name: str = "smoke"  # wandb run name and plot title
    backend: str = "auto"  # auto (ray if nnodes > 1 or ray_address is set, else spmd) | spmd | ray
    ray_address: Optional[str] = None  # connect to a running cluster (`ray start --head`); null = local
    num_cpus_per_worker: int = 1  # ray: CPUs each rank's actor reserves (its roles share them)
    ray_placement: str = "auto"  # ray: auto (STRICT_PACK when one node holds every rank, else PACK) | STRICT_PACK | PACK | SPREAD | STRICT_SPREAD
    ray_ready_timeout_s: float = 300.0  # ray: seconds to place the ranks and build their workers before failing
    nnodes: int = 1  # nodes (ray)
    n_gpus_per_node: int = 1  # ray: workers per node (one per GPU; on CPU, processes). spmd runs one process per GPU (torchrun's --nproc_per_node); on GPUs the preflight refuses fewer processes than nnodes x this
    device: str = "auto"  # auto | cpu | cuda
    seed: int = 1  # sampling seed (step s samples with seed + s)
    balance_rollouts: bool = False  # spmd: spread episodes over ranks by a per-row load hint, largest first to the least-loaded rank (hint: env.row_load(row, sampling, validate) if the env has it, else extra_info.turn_budget; no hint or off: contiguous chunks)
    off_policy_steps: int = 0  # 1: the next step's rollout (generation + pool calls) runs while this step trains; the loss is weighted by algorithm.rollout_is_cap-truncated importance weights
    max_staleness: int = 1  # streaming (rollout.in_flight > 0): most policy updates between the oldest weights that sampled a group and its update; a group past it is dropped, finished or not (stream/dropped)
    dump_rollouts: int = 0  # write the first N training episodes of every step (text, score, metrics) to output_dir/rollouts.jsonl (0 = off)
    plot_keys: list[str] = field(default_factory=lambda: ["reward/mean", "val/reward/mean", "actor/pg_loss", "critic/vf_loss", "response_length/mean"])  # metrics drawn in output_dir/curves.png


@dataclass
class PPOConfig:
    """The whole run. `env` is the environment's own section (a config group: configs/env/*.yaml)."""

    data: DataConfig = field(default_factory=DataConfig)  # prompts and batches
    model: ModelConfig = field(default_factory=ModelConfig)  # weights and tokenizer
    actor: ActorConfig = field(default_factory=ActorConfig)  # policy optimizer and loss
    critic: CriticConfig = field(default_factory=CriticConfig)  # value model
    ref: RefConfig = field(default_factory=RefConfig)  # reference policy
    rollout: RolloutConfig = field(default_factory=RolloutConfig)  # decoding
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)  # advantages and KL
    env: Any = None  # the environment: `factory` ("module:function") plus the keys of its config_class
    trainer: TrainerConfig = field(default_factory=TrainerConfig)  # loop, checkpoints, logging


CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


def register_configs(config_dir: str | Path = CONFIG_DIR) -> None:
    """Register `ppo_schema` (configs/ppo_trainer.yaml starts from it) and, for each environment
    configs/env/<name>.yaml, its factory's config_class as `env/<name>_schema` (the yaml starts from that).
    The factories are imported by the name their yaml gives, as load_env does: verl names no environment."""
    cs = ConfigStore.instance()
    cs.store(name="ppo_schema", node=PPOConfig)
    for path in sorted(Path(config_dir, "env").glob("*.yaml")):
        factory = (yaml.safe_load(path.read_text()) or {}).get("factory")
        cls = env_config_class(factory) if factory else None
        if cls is not None:
            cs.store(group="env", name=f"{path.stem}_schema", node=cls)


def env_config_class(factory: str) -> type | None:
    """The dataclass of an environment's section: `config_class` on its factory function (None if it has none)."""
    return getattr(import_factory(factory), "config_class", None)


def check_env_config(cfg: DictConfig) -> DictConfig:
    """Replace cfg.env by its environment's typed section (defaults filled in); an unknown or mistyped key
    fails here, at start, naming it. An environment without a config_class keeps its section as given."""
    if cfg.env is None or "factory" not in cfg.env:
        raise ValueError("env.factory is not set (pick an environment: env=router | env=gramma | env=single_turn)")
    cls = env_config_class(cfg.env.factory)
    if cls is None:
        return cfg
    typed = _merge(cls, cfg.env, "env")
    with open_dict(cfg):
        cfg.env = typed
    return cfg


def _merge(cls: type, section: Any, where: str) -> DictConfig:
    if isinstance(section, DictConfig):  # as plain data: a key force-added (+env.x) to a typed node is checked too
        section = OmegaConf.to_container(section, resolve=False)
    try:
        return OmegaConf.merge(OmegaConf.structured(cls), section)
    except (ConfigKeyError, ValidationError) as e:
        raise ValueError(f"{where}.{e.full_key}: {e.msg} (the keys of {where} are the fields of "
                         f"{cls.__module__}.{cls.__qualname__})") from None


def section_to_dataclass(cls: type, section: Any, where: str):
    """A config section (a dataclass, a mapping, or a DictConfig inside the run config) as an instance of
    `cls`, checked: an unknown or mistyped key raises ValueError naming `where.key`."""
    if isinstance(section, cls):
        return section
    if isinstance(section, DictConfig):  # resolve ${...} against the whole run config first
        section = OmegaConf.to_container(section, resolve=True)
    return OmegaConf.to_object(_merge(cls, section, where))


def field_docs(cls: type) -> dict[str, str]:
    """Each field's documentation: the comment beside it in the source (tests check none is missing)."""
    import inspect

    docs = {}
    for cls_ in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(cls_):
            continue
        for line in inspect.getsource(cls_).splitlines():
            name, sep, rest = line.strip().partition(":")
            if sep and name.isidentifier() and "  # " in rest:
                docs[name] = rest.split("  # ", 1)[1].strip()
    return docs


RUN_CONFIG = "run_config.yaml"  # the resolved config of a run, beside its checkpoints and its HF export
PROMPT_TEMPLATE_FILE = "prompt_template.txt"  # data.prompt_template's copy beside it: the prompts the run trained on


def save_run_config(cfg: DictConfig, directory: str | Path) -> Path:
    """Write the run's resolved config (every key, defaults filled in) as directory/run_config.yaml, and the
    prompt template of its data (data.prompt_template) as directory/prompt_template.txt: what replaying the
    run's episodes needs besides the weights."""
    path = Path(directory) / RUN_CONFIG
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(OmegaConf.to_yaml(cfg, resolve=True))
    template = OmegaConf.select(cfg, "data.prompt_template")
    if template:
        try:
            text = Path(template).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"data.prompt_template: cannot read {template} ({type(e).__name__})") from None
        (path.parent / PROMPT_TEMPLATE_FILE).write_text(text, encoding="utf-8")
    return path


def _flat(node, prefix: str = "") -> dict:
    if isinstance(node, dict):
        return {k: v for key, sub in node.items() for k, v in _flat(sub, f"{prefix}{key}.").items()} or \
            {prefix[:-1]: {}}
    return {prefix[:-1]: node}


_ABSENT = "(absent)"


def _differences(saved: DictConfig, current: DictConfig) -> list[tuple[str, object, object]]:
    """(key, old, new) for every key whose value differs between two run configs, in key order; a key only one
    has counts as changed, its missing side _ABSENT."""
    old = _flat(OmegaConf.to_container(saved, resolve=True))
    new = _flat(OmegaConf.to_container(current, resolve=True))
    return [(k, old.get(k, _ABSENT), new.get(k, _ABSENT)) for k in sorted(old.keys() | new.keys())
            if old.get(k, _ABSENT) != new.get(k, _ABSENT)]


def config_changes(saved: DictConfig, current: DictConfig) -> list[str]:
    """'key: old -> new' for every key whose value differs between two run configs (a key only one has
    counts as changed), in key order."""
    return [f"{k}: {a} -> {b}" for k, a, b in _differences(saved, current)]


# Training settings: the keys that change what the weights become. A resume whose value of one differs from
# the checkpoint's run config is refused unless trainer.resume_changed_ok (the other keys, logging, paths,
# validation, throughput, may change freely, and are listed). Every key of these sections counts, except
# NOT_TRAINING and the keys an environment's config class names in its `not_training` (where its pool is,
# timeouts, concurrency).
TRAINING_SECTIONS = ("data", "model", "actor", "critic", "ref", "rollout", "algorithm", "env")
TRAINING_TRAINER_KEYS = ("trainer.mode", "trainer.seed", "trainer.off_policy_steps", "trainer.max_staleness")
NOT_TRAINING = (
    "data.val_files", "data.val_batch_size", "data.val_limit",  # validation reads the weights, never writes them
    "rollout.val_greedy", "rollout.val_temperature",
    # engine and memory knobs: the same episodes, faster or slower
    "rollout.device", "rollout.max_batch_size", "rollout.max_model_len", "rollout.cuda_graph", "rollout.compile",
    "rollout.compile_mode", "rollout.decode_attention", "rollout.decode_linear",
    "rollout.gpu_memory_utilization", "rollout.tensor_parallel_size", "rollout.enforce_eager",
    "rollout.enable_sleep_mode", "rollout.sleep_level", "model.gradient_checkpointing", "model.compile",
)


def schedule_length_matters(cfg: DictConfig) -> bool:
    # trainer.total_steps shapes the lr only through a cosine schedule or a warmup given as a ratio
    # (verl/workers/fsdp_worker.lr_schedule); otherwise more steps is simply a longer run.
    actor = OmegaConf.select(cfg, "actor") or {}
    return actor.get("lr_schedule") == "cosine" or (bool(actor.get("warmup_ratio")) and not actor.get("warmup_steps"))


def _schema_defaults(env_class: type | None = None) -> dict:
    """Every key of PPOConfig and of the env's config class with its default, flat: 'algorithm.lam' -> 1.0."""
    out = _flat(OmegaConf.to_container(OmegaConf.structured(PPOConfig), resolve=True))
    if env_class is not None:
        out |= {f"env.{k}": v for k, v in _flat(OmegaConf.to_container(OmegaConf.structured(env_class))).items()}
    return out


def training_changes(saved: DictConfig, current: DictConfig, not_training: tuple[str, ...] = (),
                     env_class: type | None = None) -> list[str]:
    """The training settings (TRAINING_SECTIONS) whose value differs, as 'key: old -> new'; `not_training`
    adds env keys (without the `env.` prefix) that do not count. A key added to the schema (PPOConfig's, or
    env_class's) after the checkpoint was saved, at its default, is no change: a new knob defaults to the
    behaviour there was no key for."""
    skip = set(NOT_TRAINING) | {f"env.{k}" for k in not_training}
    keys = set(TRAINING_TRAINER_KEYS)
    if schedule_length_matters(saved) or schedule_length_matters(current):
        keys |= {"trainer.total_steps"}
    defaults = _schema_defaults(env_class)
    out = []
    for key, old, new in _differences(saved, current):
        if key in skip:
            continue
        if old == _ABSENT and key in defaults and new == defaults[key]:
            continue
        if key.split(".", 1)[0] in TRAINING_SECTIONS or key in keys:
            out.append(f"{key}: {old} -> {new}")
    return out


def find_run_config(checkpoint: str | Path) -> Path | None:
    """The run_config.yaml of a checkpoint directory (output_dir/hf, a step directory, or its actor/
    subdirectory); None for a model no run of ours wrote."""
    p = Path(checkpoint)
    for d in (p, p.parent) if p.name in ("actor", "critic") else (p,):
        if (d / RUN_CONFIG).is_file():
            return d / RUN_CONFIG
    return None


def load_run_config(checkpoint: str | Path) -> DictConfig | None:
    """The resolved run config a checkpoint was trained with (see find_run_config), or None."""
    path = find_run_config(checkpoint)
    return OmegaConf.load(path) if path is not None else None
