"""One way to get a tokenizer from a config value."""
from __future__ import annotations

# For base models (e.g. a GGUF checkpoint) that ship no chat template: role-prefixed turns after
# the model's BOS. Every stage tokenizes the rendered text with add_special_tokens=False, so the
# BOS that pretrained models expect must come from the template.
PLAIN_CHAT_TEMPLATE = (
    "{% if bos_token %}{{ bos_token }}{% endif %}"
    "{% for m in messages %}{{ m['role'] }}:\n{{ m['content'] }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:\n{% endif %}"
)


def load_tokenizer(spec):
    """A tokenizer object as is; "tiny" (the small BPE of verl.utils.tiny); a "*.gguf" file (the
    tokenizer stored in it); else from_pretrained(spec). Without a chat template it gets PLAIN_CHAT_TEMPLATE."""
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
    else:
        tok = AutoTokenizer.from_pretrained(spec)
    if tok.pad_token_id is None:  # decoder-only models often ship without one; padding needs an id
        tok.pad_token = tok.eos_token
    if not getattr(tok, "chat_template", None):
        tok.chat_template = PLAIN_CHAT_TEMPLATE  # saved with the SFT checkpoint: later stages see the same
    return tok
