"""Test-side name for the tiny tokenizer and model (they live in verl.utils.tiny)."""
from verl.utils.tiny import CHAT_TEMPLATE, CORPUS, TAGS, tiny_model, tiny_tokenizer  # noqa: F401
