"""The critic worker: one value per response token and the clipped value-loss update."""
from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from verl.algos.losses import value_loss
from verl.protocol import DataProto
from verl.single_controller.base import register
from verl.workers.actor import FSDPWorker
from verl.workers.config import WorkerConfig
from verl.workers.micro_batch import SEQ_KEYS, loss_units, pad_response, trim_padding


class CriticWorker(FSDPWorker):
    def __init__(self, config: WorkerConfig):
        super().__init__(config, role="critic")

    def _values(self, mb: DataProto) -> torch.Tensor:
        """V(state before each response token), (batch, response_len), 0 on padding."""
        resp_len = mb.batch["responses"].shape[1]
        keep = resp_len
        if not self.config.actor.use_remove_padding:
            mb, keep = trim_padding(mb)
        # Same shift as the policy: position t's output scores the state that produces token t+1.
        kwargs, index, real = self._inputs(mb, keep)
        with self._autocast():
            out = self.model(**kwargs)
        values = out.logits.reshape(-1)[index].float()  # (n,)
        return pad_response(torch.zeros(real.shape, device=values.device).index_put((real,), values), resp_len)

    @register("dp")
    def compute_values(self, data: DataProto) -> DataProto:
        data = data.select(list(SEQ_KEYS) + ["responses"])
        values = torch.zeros(data.batch["responses"].shape)  # (batch, response_len)
        self.model.eval()
        with self._no_grad():
            for idx in self._micro_batches(data, no_grad=True):
                values[torch.as_tensor(idx)] = self._values(data[idx].to(self.device)).cpu()
        return DataProto.from_dict({"values": values})

    @register("dp")
    def update_critic(self, data: DataProto) -> dict[str, float]:
        """Clipped value regression onto `returns` over policy tokens; same batching as update_actor."""
        cfg = self.config.critic
        data = data.select(list(SEQ_KEYS) + ["responses", "response_mask", "values", "returns"])
        metrics = defaultdict(list)
        self.model.train()
        for _ in range(cfg.ppo_epochs):
            for mini in data.split(self._mini_batch_rows()):
                self.optimizer.zero_grad(set_to_none=True)
                total = self.all_reduce(loss_units(mini.batch["response_mask"], cfg.loss_agg_mode))
                stats = defaultdict(float)
                for idx in self._micro_batches(mini):
                    mb = mini[idx].to(self.device)
                    mask = mb.batch["response_mask"].bool()  # (batch, response_len)
                    values = self._values(mb)
                    old = torch.where(mask, mb.batch["values"], values.detach())
                    returns = torch.where(mask, mb.batch["returns"], values.detach())
                    loss, m = value_loss(values, old, returns, mask, cfg.cliprange_value, cfg.loss_agg_mode)
                    m["vf_loss"] = loss.item()
                    weight = loss_units(mask, cfg.loss_agg_mode) / max(total, 1) * self.world_size
                    (loss * weight).backward()
                    for k, v in m.items():
                        stats[k] += v * weight
                metrics["critic/grad_norm"].append(self._optimizer_step())
                for k, v in stats.items():
                    metrics[f"critic/{k}"].append(v)
        out = {k: float(np.mean(v)) for k, v in metrics.items()}
        out["critic/lr"] = self.optimizer.param_groups[0]["lr"]  # the rate this update used
        self.scheduler.step()
        return out
