"""The critic worker: one value per response token and the clipped value-loss update."""
from __future__ import annotations

import torch

from verl.algos.losses import value_loss
from verl.protocol import DataProto
from verl.single_controller.base import register
from verl.workers.config import WorkerConfig
from verl.workers.fsdp_worker import FSDPWorker
from verl.workers.micro_batch import SEQ_KEYS, pad_response, trim_padding


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

        def micro_loss(mb: DataProto, mask: torch.Tensor):
            values = self._values(mb)
            old = torch.where(mask, mb.batch["values"], values.detach())
            returns = torch.where(mask, mb.batch["returns"], values.detach())
            loss, m = value_loss(values, old, returns, mask, cfg.cliprange_value, cfg.loss_agg_mode)
            m["vf_loss"] = loss.item()
            return loss, m

        return self.ppo_update(data, micro_loss, "critic")
