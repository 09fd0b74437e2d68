"""One way to get a tokenizer from a config value."""
from __future__ import annotations


def load_tokenizer(spec):
    """A tokenizer object as is; "tiny" (the small BPE of verl.utils.tiny); else from_pretrained(spec)."""
    if spec is None:
        raise ValueError("no tokenizer configured (model.tokenizer)")
    if not isinstance(spec, str):
        return spec
    if spec == "tiny":
        from verl.utils.tiny import tiny_tokenizer

        return tiny_tokenizer()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(spec)
    if tok.pad_token_id is None:  # decoder-only models often ship without one; padding needs an id
        tok.pad_token = tok.eos_token
    return tok
