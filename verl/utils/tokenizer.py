"""One way to get a tokenizer from a config value."""
from __future__ import annotations

import re

# For base models (e.g. a GGUF checkpoint) that ship no chat template: role-prefixed turns after
# the model's BOS. Every stage tokenizes the rendered text with add_special_tokens=False, so the
# BOS that pretrained models expect must come from the template.
PLAIN_CHAT_TEMPLATE = (
    "{% if bos_token %}{{ bos_token }}{% endif %}"
    "{% for m in messages %}{{ m['role'] }}:\n{{ m['content'] }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:\n{% endif %}"
)


def self_encoding_share(tok, sample: int = 300) -> tuple[int, int]:
    """Of the vocabulary's plain lowercase words (4-10 letters, the `sample` lowest ids), how many
    encode to exactly their own id: (count, sampled). A sound BPE/SentencePiece tokenizer reaches
    nearly all; a conversion that lost the merge order splits them ('think' -> 'th' + 'ink')."""
    vocab = tok.get_vocab()
    words = sorted((i, t) for t, i in vocab.items() if re.fullmatch(r"[a-z]{4,10}", t))[:sample]
    return sum(tok(t, add_special_tokens=False)["input_ids"] == [i] for i, t in words), len(words)


def check_converted_tokenizer(tok, source: str, min_share: float = 0.9) -> None:
    """Refuse a tokenizer converted from a GGUF file that splits its own vocabulary's words: a
    pretrained model would then read token sequences it never saw (transformers 5.17 does this to
    Gemma 3's GGUF vocabulary: 73 of 300 words encode to themselves, 300 with 5.24)."""
    ok, n = self_encoding_share(tok)
    if n >= 10 and ok < min_share * n:
        import transformers

        raise ValueError(
            f"{source}: the tokenizer converted from this GGUF file splits its own vocabulary ({ok} of {n} plain "
            f"words encode to themselves; transformers {transformers.__version__}). Use a tokenizer directory "
            f"(tokenizer.json) saved from a transformers that converts it soundly, or the model's own tokenizer.")


def load_tokenizer(spec):
    """A tokenizer object as is; "tiny" (the small BPE of verl.utils.tiny); a "*.gguf" file (the
    tokenizer stored in it, checked by check_converted_tokenizer); else from_pretrained(spec). Without a chat
    template it gets PLAIN_CHAT_TEMPLATE."""
    if spec is None:
        raise ValueError("no tokenizer configured (model.tokenizer)")
    if not isinstance(spec, str):
        return spec
    if spec == "tiny":
        from verl.utils.tiny import tiny_tokenizer

        return tiny_tokenizer()
    import os

    from transformers import AutoTokenizer

    if spec.endswith(".gguf"):
        if not os.path.isfile(spec):
            raise FileNotFoundError(f"GGUF tokenizer file not found: {spec}")
        tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(spec)), gguf_file=os.path.basename(spec))
        check_converted_tokenizer(tok, spec)
    else:
        tok = AutoTokenizer.from_pretrained(spec)
    if tok.pad_token_id is None:  # decoder-only models often ship without one; padding needs an id
        tok.pad_token = tok.eos_token
    if not getattr(tok, "chat_template", None):
        tok.chat_template = PLAIN_CHAT_TEMPLATE  # saved with the SFT checkpoint: later stages see the same
    return tok
