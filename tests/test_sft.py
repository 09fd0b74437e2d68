"""Supervised fine-tuning (trainer.mode=sft through `python -m verl.trainer.sft`): data checks, masks, loss,
batching, and short real runs."""
import json

import pandas as pd
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from sim.warm_start.cli import main as oracle_main
from verl.algos.losses import masked_lm_loss, token_nll
from verl.trainer.config import load_run_config
from verl.trainer.sft import main as sft_main
from verl.trainer.sft_data import (Example, SFTDataError, collate, evaluate_loss, length_batches, load_rows,
                                   tokenize_example, tokenize_rows)
from verl.workers.model_loader import load_model
from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.hf_rollout import HFRollout

SMALL = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 512,
         "tie_word_embeddings": True}


def oracle_rows(out, seed: int, vocab_size: int):
    """Forty noisy oracle trajectories (oracle.parquet) and their BPE tokenizer, written to `out` by the warm start."""
    assert oracle_main(["--out-dir", str(out), "--n", "40", "--noise", "0.2", "--seed", str(seed),
                        "--vocab-size", str(vocab_size)]) == 0
    return out


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    return oracle_rows(tmp_path_factory.mktemp("oracle"), seed=1, vocab_size=500)


@pytest.fixture(scope="module")
def tok(oracle):
    return AutoTokenizer.from_pretrained(oracle / "tokenizer")


def test_token_nll_and_mask_pick_exactly_the_masked_tokens():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7)
    ids = torch.randint(0, 7, (2, 5))
    mask = torch.tensor([[0, 0, 1, 1, 0], [0, 1, 0, 0, 1]], dtype=torch.float)
    logp = logits.log_softmax(-1)
    expected = -torch.stack([logp[0, 1, ids[0, 2]], logp[0, 2, ids[0, 3]],
                             logp[1, 0, ids[1, 1]], logp[1, 3, ids[1, 4]]]).mean()
    assert torch.allclose(masked_lm_loss(logits, ids, mask), expected, atol=1e-6)
    assert token_nll(logits, ids)[:, 0].abs().sum() == 0  # nothing predicts the first token
    # logits that predict masked-out tokens do not matter
    changed = logits.clone()
    changed[0, 0] += 5.0
    changed[1, 1:3] -= 3.0
    assert torch.allclose(masked_lm_loss(changed, ids, mask), expected, atol=1e-6)


def test_length_batches_cover_every_row_once_in_length_buckets():
    lengths = [5, 50, 7, 49, 6, 51, 8, 9, 4]
    batches = length_batches(lengths, 3, seed=0, epoch=0)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    spans = sorted(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches)
    assert spans[-1] <= 2  # similar lengths together: short rows never pad to long ones
    assert length_batches(lengths, 3, 0, 1) != batches or length_batches(lengths, 3, 0, 2) != batches


def test_collate_right_pads_and_keeps_masks():
    ids, attn, mask = collate([Example([5, 6, 7], [0, 1, 1]), Example([8], [1])], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert attn.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert mask.tolist() == [[0, 1, 1], [1, 0, 0]]


def test_bad_rows_are_named(tmp_path, tok):
    good = {"prompt": [{"role": "user", "content": "q"}],
            "segments": [{"text": "<think>x</think><answer>y</answer>", "by_policy": True}]}
    rows = [good, {**good, "segments": [{"text": "hi", "by_policy": "yes"}]}]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(SFTDataError, match=r"bad.jsonl: row 1: field 'segments'"):
        tokenize_rows(tok, load_rows(path), 512, str(path))
    mismatched = [{**good, "response_text": "something else"}]
    with pytest.raises(SFTDataError, match=r"row 0: field 'response_text'"):
        tokenize_rows(tok, mismatched, 512, "x")
    with pytest.raises(SFTDataError, match=r"row 0: \d+ tokens > data.sft_max_length 3"):
        tokenize_rows(tok, [good], 3, "x")
    with pytest.raises(SFTDataError, match="line 2 is not JSON"):
        (tmp_path / "broken.jsonl").write_text(json.dumps(good) + "\n{oops\n")
        load_rows(tmp_path / "broken.jsonl")
    with pytest.raises(SFTDataError, match="data file not found"):
        load_rows(tmp_path / "missing.parquet")


def test_parquet_and_jsonl_rows_tokenize_identically(tmp_path, oracle, tok):
    rows = load_rows(oracle / "oracle.parquet")[:5]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    a = tokenize_rows(tok, rows, 1024)
    b = tokenize_rows(tok, load_rows(path), 1024)
    assert [(e.ids, e.mask) for e in a] == [(e.ids, e.mask) for e in b]
    assert all(sum(e.mask) > 0 for e in a)


def test_sft_lowers_the_loss_and_saves_a_loadable_model(tmp_path, oracle, tok):
    spec = tmp_path / "model.json"
    spec.write_text(json.dumps(SMALL))  # vocab_size and special ids come from the tokenizer
    out = tmp_path / "sft"
    rows = load_rows(oracle / "oracle.parquet")
    examples = [tokenize_example(tok, r["prompt"], r["segments"]) for r in rows]
    before = evaluate_loss(load_model({**SMALL, "vocab_size": len(tok), "pad_token_id": tok.pad_token_id}, seed=0),
                           examples, tok.pad_token_id)

    assert sft_main(["--data", str(oracle / "oracle.parquet"), "--model", str(spec), "--tokenizer",
                     str(oracle / "tokenizer"), "--out", str(out), "--epochs", "8", "--batch-size", "8",
                     "--lr", "5e-3", "--context-loss-weight", "1.0", "--log-every", "5"]) == 0

    model = AutoModelForCausalLM.from_pretrained(out)
    after = evaluate_loss(model, examples, tok.pad_token_id)
    assert after < 0.6 * before, (before, after)
    log = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(1, 41))  # every step, as PPO logs
    assert log[-1]["timing/tokens_per_s"] > 0 and log[-1]["actor/context_loss"] > 0
    summary = json.loads((out / "sft_summary.json").read_text())
    assert summary["steps"] == 40 and summary["final_loss"] < summary["first_loss"]
    # the trainer's checkpoint (manifest last) and the resolved run config beside the model; the run config
    # names no env, so evaluation never takes an episode shape from an SFT model
    from verl.trainer import checkpoint
    assert checkpoint.verify(out / "checkpoints" / "step_000040")["step"] == 40
    run = load_run_config(out)
    assert run.trainer.mode == "sft" and run.trainer.total_steps == 40 and run.env is None
    assert run.actor.lr == 5e-3 and run.actor.sft_context_loss_weight == 1.0 and run.data.train_batch_size == 8

    # the saved dir is what PPO loads (model.path=DIR, model.tokenizer=DIR) and it generates
    again = AutoTokenizer.from_pretrained(out)
    assert again.get_vocab() == tok.get_vocab() and again.chat_template == tok.chat_template
    ours = load_model(str(out))
    state = {k: v for k, v in model.state_dict().items()}
    assert all(torch.equal(v, state[k]) for k, v in ours.state_dict().items())
    prompt = tokenize_example(tok, rows[0]["prompt"], rows[0]["segments"][:1]).ids[:-1]
    out_ids = HFRollout(ours, again).generate([prompt], SamplingParams(greedy=True, max_new_tokens=8))[0].token_ids
    assert len(out_ids) >= 1


def test_time_limit_and_max_steps_stop_early_and_still_save(tmp_path, oracle, capsys):
    out = tmp_path / "sft"
    inline = json.dumps(SMALL)
    assert sft_main(["--data", str(oracle / "oracle.parquet"), "--model", inline, "--tokenizer",
                     str(oracle / "tokenizer"), "--out", str(out), "--epochs", "3", "--max-steps", "2",
                     "--batch-size", "4"]) == 0
    assert json.loads((out / "sft_summary.json").read_text())["steps"] == 2
    assert (out / "config.json").is_file()
    assert sft_main(["--data", str(oracle / "oracle.parquet"), "--model", inline, "--tokenizer",
                     str(oracle / "tokenizer"), "--out", str(out), "--time-limit-s", "0", "--batch-size", "4"]) == 0
    summary = json.loads((out / "sft_summary.json").read_text())
    assert summary["steps"] == 1 and summary["stopped"].startswith("time limit")
    printed = capsys.readouterr()  # a cut run says so where it stops and in the final table's first line
    assert (f"sft STOPPED EARLY at step 1 of {summary['planned_steps']}: trainer.time_limit_s=0 reached (the "
            "learning-rate schedule did not finish)") in printed.out + printed.err  # SFT's cosine was cut
    assert f"finished 1 of {summary['planned_steps']} steps - STOPPED EARLY (time limit 0s)" in printed.out


def test_cli_errors_are_clear(tmp_path, oracle, capsys):
    assert sft_main(["--data", str(tmp_path / "nope.parquet"), "--model", "{}", "--tokenizer",
                     str(oracle / "tokenizer"), "--out", str(tmp_path / "o")]) == 1
    assert "nope.parquet not found" in capsys.readouterr().err  # the preflight, before anything loads
    small = {**SMALL, "vocab_size": 10}
    assert sft_main(["--data", str(oracle / "oracle.parquet"), "--model", json.dumps(small), "--tokenizer",
                     str(oracle / "tokenizer"), "--out", str(tmp_path / "o")]) == 1
    assert "vocab_size 10 <" in capsys.readouterr().err
    pd.DataFrame([{"prompt": [{"role": "user", "content": "q"}]}]).to_parquet(tmp_path / "noseg.parquet")
    assert sft_main(["--data", str(tmp_path / "noseg.parquet"), "--model", json.dumps(SMALL), "--tokenizer",
                     str(oracle / "tokenizer"), "--out", str(tmp_path / "o")]) == 1
    assert "row 0: field 'segments'" in capsys.readouterr().err


def test_a_diverging_run_skips_bad_steps_then_stops_without_saving(tmp_path, oracle, capsys, monkeypatch):
    """Non-finite gradients: the update is skipped (weights stay finite); ten in a row end the run, named, unsaved."""
    import verl.workers.actor as actor

    out = tmp_path / "sft"
    real = actor.token_nll
    calls = []

    def poisoned(*args, **kw):  # steps 3.. produce a NaN loss, as a bf16 overflow would
        nll = real(*args, **kw)
        calls.append(1)
        return nll * float("nan") if len(calls) >= 3 else nll

    monkeypatch.setattr(actor, "token_nll", poisoned)
    seen = []
    monkeypatch.setattr(torch.optim.AdamW, "step", lambda self, *a, **k: seen.append(
        all(torch.isfinite(p.grad).all() for g in self.param_groups for p in g["params"] if p.grad is not None)))
    assert sft_main(["--data", str(oracle / "oracle.parquet"), "--model", json.dumps(SMALL), "--tokenizer",
                     str(oracle / "tokenizer"), "--out", str(out), "--epochs", "8", "--batch-size", "4"]) == 1
    err = capsys.readouterr().err
    assert "sft diverged: 10 steps in a row" in err and "up to step 12" in err
    assert seen == [True, True]  # only the two finite steps reached the optimizer
    assert not (out / "config.json").exists()
