"""tools/convert/gguf_to_hf.py: a GGUF file becomes a transformers directory with the same model and tokenizer."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("gguf")
from gguf_tiny import write_llama_gguf  # noqa: E402
from tiny import tiny_model, tiny_tokenizer  # noqa: E402
from tools.convert import gguf_to_hf as script  # noqa: E402


def test_a_gguf_becomes_a_directory_with_the_same_model_and_tokenizer(tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = tiny_tokenizer()
    model = tiny_model(len(tok), seed=5)
    write_llama_gguf(tmp_path / "m.gguf", model, tok)
    assert script.main([str(tmp_path / "m.gguf"), str(tmp_path / "hf")]) == 0
    assert "logits equal" in capsys.readouterr().out
    assert not (tmp_path / "hf" / "config.json").read_text().count("quantization_config")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    tok_again = AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "<think>Ask a bigger model.</think><answer>Paris</answer>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok_again(text, add_special_tokens=False)["input_ids"] == ids
    x = torch.tensor([ids])
    with torch.no_grad():  # the GGUF held F32 weights: the directory is the original model exactly
        assert torch.equal(again(x).logits, model(x).logits)
    with pytest.raises(SystemExit, match="not empty"):
        script.main([str(tmp_path / "m.gguf"), str(tmp_path / "hf")])
