"""The actor with its rollout engine in the same process (veRL's colocated "hybrid engine").

The rollout engine keeps its own unsharded copy of the policy for decoding. After every
update (or checkpoint load) the copy is stale, and the controller calls `sync_rollout`
(a collective: all ranks at once) before the next rollout. `generate` itself uses no
collectives, because under torchrun each rank decodes its own episodes and ranks may
call it a different number of times.
"""
from __future__ import annotations

import numpy as np
import torch

from verl.protocol import DataProto
from verl.utils.tokenizer import load_tokenizer
from verl.single_controller.base import register
from verl.workers.actor import ActorWorker
from verl.workers.config import WorkerConfig
from verl.workers.model_loader import load_model, to_dtype
from verl.workers.rollout import build_rollout


class ActorRolloutWorker(ActorWorker):
    def __init__(self, config: WorkerConfig, rollout: dict):
        super().__init__(config, role="actor")
        self.rollout_cfg = dict(rollout)
        self.rollout = None
        self._stale = True  # the rollout copy lags the actor's weights

    @register("all")
    def init_model(self) -> None:
        super().init_model()
        tokenizer = load_tokenizer(self.config.tokenizer)
        # rollout.device: the engine apart from the actor (one process: a second GPU); default the actor's device
        device = self.rollout_cfg.get("device") or str(self.device)
        if self.rollout_cfg.get("device") and self.world_size > 1:
            raise ValueError(f"rollout.device={device!r} places one engine; with {self.world_size} ranks each "
                             "rank decodes on its own device (leave rollout.device null)")
        cfg = {**self.rollout_cfg, "device": device}
        if cfg.get("name", "hf") in ("hf", "hf_static"):  # transformers backends decode a copy of the actor
            dtype = to_dtype(self.config.dtype) if torch.device(device).type == "cuda" else torch.float32
            copy = load_model(self.config.model, dtype, role="actor", seed=self.config.seed).to(device).eval()
            self.rollout = build_rollout(cfg, model=copy, tokenizer=tokenizer)
        else:
            self.rollout = build_rollout(cfg, tokenizer=tokenizer)

    @register("dp")
    def generate(self, request: DataProto) -> DataProto:
        """Decode `non_tensor["prompt_ids"]` with `meta["sampling"]`; returns `non_tensor["gen_outputs"]`."""
        if self._stale and not request.meta.get("allow_stale"):  # off-policy rollouts decode stale on purpose
            raise RuntimeError("generate: the rollout weights are stale; call sync_rollout() after an update")
        prompts = [list(p) for p in request.non_tensor["prompt_ids"]]
        outs = self.rollout.generate(prompts, request.meta["sampling"]) if prompts else []
        arr = np.empty(len(outs), dtype=object)  # (batch,) of GenOutput
        arr[:] = outs
        return DataProto(batch={}, non_tensor={"gen_outputs": arr}, meta={})

    @register("all")
    def sync_rollout(self) -> None:
        """Copy the actor's current weights into the rollout engine (no-op when fresh) and wake it."""
        if self._stale:
            self.rollout.update_weights(self.rollout_weights())  # vllm: wakes weights, loads, wakes KV
            self._stale = False
        if getattr(self.rollout, "asleep", False):
            self.rollout.wake()

    @register("all")
    def sleep_rollout(self) -> None:
        """Release the rollout engine's GPU memory (vllm: weights and KV cache) while the models train."""
        sleep = getattr(self.rollout, "sleep", None)
        if sleep is not None:
            sleep()

    @register("dp")
    def update_actor(self, data: DataProto) -> dict[str, float]:
        out = super().update_actor(data)
        self._stale = True
        return out

    @register("all")
    def load_checkpoint(self, path: str) -> None:
        super().load_checkpoint(path)
        self._stale = True
