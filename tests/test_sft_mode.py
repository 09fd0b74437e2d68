"""trainer.mode=sft reproduces the old standalone SFT trainer exactly, and resumes like PPO.

`old_sft_train` is the training loop of the former verl/trainer/sft.py (its own AdamW, lr schedule,
loss and step), kept here frozen as the reference: the new mode runs the shared actor worker, update
loop and checkpoint code, and must give the same losses and the same weights, bit for bit.
"""
import json
import math
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from test_sft import oracle_rows
from verl.algos.losses import token_nll
from verl.algos.masked import masked_mean
from verl.trainer.main_ppo import load_config, resolve_total_steps, run
from verl.trainer.sft import main as sft_main
from verl.trainer.sft_data import collate, length_batches, load_rows, tokenize_rows
from verl.workers.model_loader import load_model, spec_for_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
         "tie_word_embeddings": True}


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    return oracle_rows(tmp_path_factory.mktemp("oracle"), seed=3, vocab_size=400)


def old_sft_train(data, tokenizer_dir, model_spec, steps_cap, epochs, lr, min_lr_ratio, warmup_ratio, batch_size,
                  weight_decay, grad_clip, seed, context_loss_weight):
    """The former standalone SFT loop on CPU (verl/trainer/sft.py before SFT became a trainer mode)."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    examples = tokenize_rows(tokenizer, load_rows(data), 1024)
    model = load_model(spec_for_tokenizer(model_spec, tokenizer), dtype=torch.float32, role="actor", seed=seed)
    model.train()
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), fused=True)
    per_epoch = math.ceil(len(examples) / batch_size)
    total = min(steps_cap, per_epoch * epochs)
    warmup = int(warmup_ratio * total)

    def lr_at(step):
        if step < warmup:
            return lr * (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup - 1)
        return lr * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))

    losses, lrs, step = [], [], 0
    lengths = [len(e.ids) for e in examples]
    while step < total:
        epoch = step // per_epoch
        for batch_idx in length_batches(lengths, batch_size, seed, epoch):
            ids, attn, loss_mask = collate([examples[i] for i in batch_idx], tokenizer.pad_token_id)
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
            nll = token_nll(model(input_ids=ids, attention_mask=attn, use_cache=False).logits, ids)
            loss = masked_mean(nll, loss_mask)
            context_mask = attn.float() - loss_mask
            context_mask[:, 0] = 0.0
            context_loss = masked_mean(nll, context_mask)
            opt.zero_grad(set_to_none=True)
            (loss + context_loss_weight * context_loss).backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            if torch.isfinite(grad_norm):
                opt.step()
            losses.append(loss.item())
            lrs.append(lr_at(step))
            step += 1
            if step >= total:
                break
    return model, losses, lrs


def test_sft_mode_matches_the_old_trainer_bit_for_bit(tmp_path, oracle):
    # 40 rows in batches of 8: 5 per epoch; 7 steps cross an epoch; warmup 0.3 x 7 = 2 steps, then cosine
    settings = dict(steps_cap=7, epochs=2, lr=5e-3, min_lr_ratio=0.1, warmup_ratio=0.3, batch_size=8,
                    weight_decay=0.01, grad_clip=1.0, seed=3, context_loss_weight=1.0)
    model, losses, lrs = old_sft_train(oracle / "oracle.parquet", oracle / "tokenizer", dict(SMALL), **settings)

    out = tmp_path / "sft"
    assert sft_main(["--data", str(oracle / "oracle.parquet"), "--model", json.dumps(SMALL), "--tokenizer",
                     str(oracle / "tokenizer"), "--out", str(out), "--max-steps", "7", "--epochs", "2",
                     "--lr", "5e-3", "--min-lr-ratio", "0.1", "--warmup-ratio", "0.3", "--batch-size", "8",
                     "--seed", "3", "--context-loss-weight", "1.0", "--device", "cpu"]) == 0
    log = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert log[0]["actor/sft_loss"] == losses[0]  # the first step's loss, exactly
    assert [r["actor/sft_loss"] for r in log] == losses
    assert [r["actor/lr"] for r in log] == pytest.approx(lrs, rel=1e-12)
    new = AutoModelForCausalLM.from_pretrained(out).state_dict()
    old = model.state_dict()
    assert new.keys() == old.keys()
    differ = [k for k in old if not torch.equal(new[k], old[k])]
    assert not differ, differ
    assert losses[-1] < losses[0]


def test_sft_mode_resumes_from_its_checkpoint_to_the_same_weights(tmp_path, oracle):
    """Killed after step 2 (its checkpoint kept), resumed with trainer.resume=auto: the same model as one run."""
    def cfg_for(out):
        cfg = load_config("sft", [f"data.sft_files=[{oracle / 'oracle.parquet'}]", f"model.tokenizer={oracle / 'tokenizer'}",
                                  "trainer.total_steps=4", "trainer.save_freq=2", "trainer.max_checkpoints=0",
                                  "data.train_batch_size=8", "trainer.device=cpu", "trainer.logger=[jsonl]",
                                  f"trainer.output_dir={out}", "actor.sft_context_loss_weight=1.0"])
        cfg.model.path = dict(SMALL)
        return cfg

    whole = tmp_path / "whole"
    run(cfg_for(whole))
    part = tmp_path / "part"
    (part / "checkpoints").mkdir(parents=True)
    shutil.copytree(whole / "checkpoints" / "step_000002", part / "checkpoints" / "step_000002")
    rows = (whole / "metrics.jsonl").read_text().splitlines()
    (part / "metrics.jsonl").write_text("\n".join(rows[:3]) + "\n")  # steps 1-2 and a row of step 3 the kill cut off
    run(cfg_for(part))
    log = [json.loads(line) for line in (part / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4]
    keys = ("actor/sft_loss", "actor/context_loss", "actor/grad_norm", "actor/lr", "sft/tokens")
    assert [[r[k] for k in keys] for r in log] == [[json.loads(r)[k] for k in keys] for r in rows]
    a = AutoModelForCausalLM.from_pretrained(whole / "hf").state_dict()
    b = AutoModelForCausalLM.from_pretrained(part / "hf").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_micro_batches_give_the_whole_batch_loss(tmp_path, oracle):
    """Split into micro-batches of 3 rows (token counts differ per micro-batch), the policy and context token
    means, and so the update, are those of the whole batch."""
    def train(out, *extra):
        cfg = load_config("sft", [f"data.sft_files=[{oracle / 'oracle.parquet'}]", f"model.tokenizer={oracle / 'tokenizer'}",
                                  "trainer.total_steps=2", "data.train_batch_size=8", "trainer.device=cpu",
                                  "trainer.logger=[jsonl]", f"trainer.output_dir={out}",
                                  "actor.sft_context_loss_weight=1.0", *extra])
        cfg.model.path = dict(SMALL)
        run(cfg)
        log = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return log, AutoModelForCausalLM.from_pretrained(out / "hf").state_dict()

    whole, a = train(tmp_path / "whole")
    split, b = train(tmp_path / "split", "actor.ppo_micro_batch_size=3")
    for key in ("actor/sft_loss", "actor/context_loss", "actor/grad_norm"):
        assert [r[key] for r in split] == pytest.approx([r[key] for r in whole], rel=1e-5), key
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


@pytest.mark.parametrize("steps, epochs, want", [(4, None, 4), (None, 3, 15), (20, 3, 15), (7, 3, 7)])
def test_total_steps_come_from_steps_or_epochs_the_smaller(steps, epochs, want):
    cfg = load_config("sft", [f"trainer.total_steps={'null' if steps is None else steps}",
                              f"trainer.total_epochs={'null' if epochs is None else epochs}"])
    assert resolve_total_steps(cfg, 5) == want == cfg.trainer.total_steps


def test_neither_steps_nor_epochs_is_an_error():
    with pytest.raises(ValueError, match="trainer.total_steps or trainer.total_epochs"):
        resolve_total_steps(load_config("sft", ["trainer.total_steps=null", "trainer.total_epochs=null"]), 5)
