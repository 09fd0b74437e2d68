"""The actor -> rollout weight sync without a CPU round trip: the engine reads the actor's own tensors,
one at a time, and checks the names before it changes a weight.

At 3B on an H200 the old path (every weight copied to CPU, then loaded back) took 12-13 s a step
(docs/results/h200/decode_s5, section 4); the GPU figure after the change is not measured here."""
from collections.abc import Mapping

import pytest
import torch

from test_fsdp_workers import SPEC
from tiny import tiny_tokenizer
from verl.workers.actor_rollout import ActorRolloutWorker
from verl.workers.config import worker_config
from verl.workers.rollout.hf_rollout import HFRollout
from verl.workers.model_loader import load_model

pytestmark = pytest.mark.usefixtures("one_thread")


def make_worker(backend="hf_static"):
    tok = tiny_tokenizer()
    spec = dict(SPEC, vocab_size=len(tok), hidden_size=64, num_attention_heads=4)
    worker = ActorRolloutWorker(worker_config(model=spec, device="cpu", lr=1e-2, tokenizer=tok),
                                rollout={"name": backend, "max_batch_size": 4, "max_model_len": 64})
    worker.init_model()
    return worker


def test_the_rollout_reads_the_actors_own_tensors():
    worker = make_worker()
    weights = worker.rollout_weights()
    params = dict(worker.model.named_parameters())
    shared = [n for n, t in weights.items() if n in params and t.data_ptr() == params[n].data_ptr()]
    assert len(shared) == len(params), "rollout_weights copied the weights (the CPU round trip)"


@pytest.mark.parametrize("backend", ["hf", "hf_static"])
def test_a_sync_makes_the_engine_decode_the_actors_weights(backend):
    worker = make_worker(backend)
    with torch.no_grad():
        for p in worker.model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    worker._stale = True
    worker.sync_rollout()
    engine = dict(worker.rollout.model.named_parameters())
    for name, p in worker.model.named_parameters():
        torch.testing.assert_close(engine[name], p.detach())


class _Watched(Mapping):
    """A state dict that records, each time it hands out a tensor, how many earlier ones the model already holds."""

    def __init__(self, state, model):
        self.state, self.model, self.copied_before = state, model, []

    def __getitem__(self, k):
        names = list(self.state)
        live = dict(self.model.named_parameters())
        earlier = names[:names.index(k)]
        self.copied_before.append(sum(torch.equal(live[n], self.state[n]) for n in earlier if n in live))
        return self.state[k]

    def __iter__(self):
        return iter(self.state)

    def __len__(self):
        return len(self.state)


def test_update_weights_streams_one_tensor_at_a_time(tok):
    from tiny import tiny_model
    engine = HFRollout(tiny_model(len(tok), seed=1), tok, eos_token_ids=[])
    new = {k: v + 1.0 for k, v in tiny_model(len(tok), seed=2).state_dict().items()}
    watched = _Watched(new, engine.model)
    engine.update_weights(watched)
    names = [n for n in new if n in dict(engine.model.named_parameters())]
    # when the i-th tensor is handed out, the ones before it are already in the model: nothing is held whole
    assert watched.copied_before[-1] >= len(names) - 1
    for n, p in engine.model.named_parameters():
        torch.testing.assert_close(p.detach(), new[n])


def test_a_bad_name_changes_no_weight(tok):
    from tiny import tiny_model
    engine = HFRollout(tiny_model(len(tok), seed=1), tok, eos_token_ids=[])
    before = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    new = {k: v + 1.0 for k, v in tiny_model(len(tok), seed=2).state_dict().items()}
    new["model.layers.0.mlp.typo.weight"] = torch.zeros(2)
    with pytest.raises(KeyError, match="unexpected 1"):
        engine.update_weights(new)
    for n, p in engine.model.named_parameters():
        assert torch.equal(p.detach(), before[n]), f"{n} changed before the names were checked"
    del new["model.layers.0.mlp.typo.weight"]
    new["_orig_mod.model.norm.weight"] = new["model.norm.weight"]  # two keys for one weight
    with pytest.raises(ValueError, match="both map to"):
        engine.update_weights(new)
    for n, p in engine.model.named_parameters():
        assert torch.equal(p.detach(), before[n]), f"{n} changed before the clash was found"
    del new["_orig_mod.model.norm.weight"], new["model.norm.weight"]
    with pytest.raises(KeyError, match="missing 1"):
        engine.update_weights(new)


def test_lora_runs_still_sync_the_merged_weights():
    from test_lora import LORA, perturb_adapters
    tok = tiny_tokenizer()
    spec = dict(SPEC, vocab_size=len(tok), hidden_size=64, num_attention_heads=4)
    worker = ActorRolloutWorker(worker_config(model=spec, device="cpu", lr=1e-2, tokenizer=tok, lora=LORA),
                                rollout={"name": "hf", "max_batch_size": 4, "max_model_len": 64})
    worker.init_model()
    perturb_adapters(worker.model, scale=0.5)
    weights = worker.rollout_weights()
    assert not any("lora_" in n for n in weights)
    merged = load_model(spec, role="actor")
    merged.load_state_dict(weights)  # base names and shapes, adapters folded in
