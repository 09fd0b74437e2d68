"""Fixtures shared by the test modules."""
import pytest

from verl.utils.tiny import tiny_tokenizer


@pytest.fixture(scope="session")
def tok():
    """The tiny BPE tokenizer (routing tags as added tokens) that most tests encode with; a module that needs
    another one defines its own `tok`."""
    return tiny_tokenizer()
