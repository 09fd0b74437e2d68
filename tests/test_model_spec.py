"""load_model takes a config as a dict, inline JSON or a .json file (scripts pass any of the three)."""
import json

import pytest
import torch

from verl.workers.model_loader import load_model

SPEC = {"model_type": "llama", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1}


def test_inline_json_and_json_file_build_the_dict_config(tmp_path):
    path = tmp_path / "model.json"
    path.write_text(json.dumps(SPEC))
    ref = load_model(SPEC, seed=3)
    for spec in (json.dumps(SPEC), str(path), path):
        model = load_model(spec, seed=3)
        assert model.config.hidden_size == 16 and model.config.vocab_size == 64
        for (n, a), (_, b) in zip(ref.named_parameters(), model.named_parameters()):
            assert torch.equal(a, b), n  # same seeded init: the same config, not merely a similar one


def test_bad_json_file_is_named(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"model_type": "llama",')
    with pytest.raises(ValueError, match="broken.json"):
        load_model(str(path))


def test_a_json_spec_that_is_not_a_mapping_is_named(tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="list.json.*must be a mapping"):
        load_model(str(path))
