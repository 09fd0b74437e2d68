"""GGUF checkpoints: the model and the tokenizer load through transformers' GGUF path exactly as
written, SFT starts from one, and a missing file is named. The file is built by the test."""
import json

import pytest
import torch

pytest.importorskip("gguf")  # the [gguf] extra; in [dev] too, so CI runs these

from gguf_tiny import tiny_llama, write_llama_gguf  # noqa: E402
from verl.trainer.sft import main as sft_main  # noqa: E402
from verl.utils.tiny import tiny_tokenizer  # noqa: E402
from verl.utils.tokenizer import PLAIN_CHAT_TEMPLATE, check_converted_tokenizer, load_tokenizer, self_encoding_share  # noqa: E402
from verl.workers.model_loader import load_model  # noqa: E402

TEXTS = ["<think>A science fact.</think><search>Qwen2.5-7B-Instruct: Who discovered Bririum?</search>",
         "\n\n<information>Mabrago Mokukul.</information>\n\n<answer>Mabrago Mokukul</answer>"]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    tok = tiny_tokenizer()
    model = tiny_llama(len(tok), seed=3)
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_llama_gguf(path, model, tok)
    return path, model, tok


def test_model_and_tokenizer_load_as_written(written):
    path, model, tok = written
    loaded = load_model(str(path))
    ids = torch.randint(4, len(tok), (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5, rtol=1e-5)
    again = load_tokenizer(str(path))
    messages = [{"role": "user", "content": "Who discovered Bririum?"}]
    for text in TEXTS + [tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)]:
        assert again(text)["input_ids"] == tok(text)["input_ids"], text
    assert (again.eos_token_id, again.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)


def test_sft_starts_from_a_gguf_checkpoint(written, tmp_path):
    path, _, tok = written
    data = tmp_path / "sft.jsonl"
    rows = [{"prompt": [{"role": "user", "content": f"Question {i}: who discovered Bririum?"}],
             "segments": [{"text": TEXTS[0], "by_policy": True}, {"text": TEXTS[1][:40], "by_policy": False},
                          {"text": "<answer>Mabrago Mokukul</answer>", "by_policy": True}]} for i in range(8)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "sft"
    assert sft_main(["--data", str(data), "--model", str(path), "--tokenizer", str(path), "--out", str(out),
                     "--max-steps", "2", "--batch-size", "4", "--lr", "1e-3"]) == 0
    trained = load_model(str(out))
    start = load_model(str(path))
    moved = [n for (n, a), (_, b) in zip(trained.named_parameters(), start.named_parameters()) if not torch.equal(a, b)]
    assert moved, "SFT changed no weight"
    assert load_tokenizer(str(out)).get_vocab() == tok.get_vocab()


def test_a_base_model_without_chat_template_gets_the_plain_one(tmp_path):
    tok = tiny_tokenizer()
    tok.chat_template = None  # as a base model's GGUF ships
    path = tmp_path / "base.gguf"
    write_llama_gguf(path, tiny_llama(len(tok), seed=4), tok)
    loaded = load_tokenizer(str(path))
    assert loaded.chat_template == PLAIN_CHAT_TEMPLATE
    messages = [{"role": "system", "content": "Route."}, {"role": "user", "content": "Who discovered Bririum?"}]
    text = loaded.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == f"{loaded.bos_token}system:\nRoute.\n\nuser:\nWho discovered Bririum?\n\nassistant:\n"
    assert loaded(text, add_special_tokens=False)["input_ids"][0] == loaded.bos_token_id


def _without_merges(tok):
    """The same vocabulary with the BPE merge list dropped: what a lossy GGUF conversion leaves."""
    from tokenizers import Tokenizer
    from verl.utils.tiny import wrap_tokenizer

    spec = json.loads(tok.backend_tokenizer.to_str())
    spec["model"]["merges"] = []
    return wrap_tokenizer(Tokenizer.from_str(json.dumps(spec)).to_str())


def test_a_tokenizer_that_splits_its_own_words_is_refused(written, monkeypatch):
    path, _, tok = written
    ok, n = self_encoding_share(tok)
    assert n >= 10 and ok == n
    broken = _without_merges(tok)
    assert self_encoding_share(broken)[0] < n // 2
    with pytest.raises(ValueError, match=r"splits its own vocabulary \(\d+ of \d+"):
        check_converted_tokenizer(broken, "x.gguf")
    import transformers

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: _without_merges(tok))
    with pytest.raises(ValueError, match="tiny.gguf"):  # load_tokenizer checks what a GGUF file converts to
        load_tokenizer(str(path))


def test_save_gguf_tokenizer_writes_a_directory_that_loads_the_same(written, tmp_path, capsys):
    from tools.convert import save_gguf_tokenizer as mod

    path, _, tok = written
    assert mod.main([str(path), str(tmp_path / "tok")]) == 0
    again = load_tokenizer(str(tmp_path / "tok"))
    for text in TEXTS:
        assert again(text)["input_ids"] == tok(text)["input_ids"]
    assert "plain vocabulary words encode to themselves" in capsys.readouterr().out


def test_missing_gguf_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        load_tokenizer(str(tmp_path / "nope.gguf"))
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        load_model(str(tmp_path / "nope.gguf"))
