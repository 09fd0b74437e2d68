"""The pool registry: yaml loading, exact name resolution, prices, clear errors."""
from pathlib import Path

import pytest

from router_r1.pool.registry import ModelRegistry, RegistryError

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "configs" / "pool" / "paper.yaml"

PAPER_PRICES = {  # USD per 1M output tokens, from the Router-R1 paper
    "Qwen2.5-7B-Instruct": 0.30,
    "LLaMA-3.1-8B-Instruct": 0.18,
    "LLaMA-3.1-70B-Instruct": 0.88,
    "Mistral-7B-Instruct": 0.20,
    "Mixtral-8x22B-Instruct": 1.20,
    "Gemma-2-27B-Instruct": 0.80,
    "Palmyra-Creative-122B": 1.80,
    "LLaMA3-ChatQA-1.5-8B": 0.18,
}


def test_paper_pool_prices_and_split():
    reg = ModelRegistry.from_yaml(PAPER)
    assert {n: reg[n].price_out_per_m for n in reg.names} == PAPER_PRICES
    assert reg.seen().names == list(PAPER_PRICES)[:6]
    assert reg["Gemma-2-27B-Instruct"].temperature == pytest.approx(0.1)
    assert all(reg[n].temperature == 0.0 for n in reg.names if n != "Gemma-2-27B-Instruct")
    assert all(reg[n].descriptor for n in reg.names)


@pytest.mark.parametrize("written", [
    "LLaMA-3.1-70B-Instruct", "llama-3.1-70b-instruct", "LLaMA 3.1 70B Instruct",
    " llama3.1-70b-instruct ", "Llama-3.1-70B",
])
def test_resolution_is_exact_up_to_case_spaces_hyphens_and_aliases(written):
    assert ModelRegistry.from_yaml(PAPER).resolve(written).name == "LLaMA-3.1-70B-Instruct"


@pytest.mark.parametrize("written", ["LLaMA", "70B", "gpt-4o", "", "   ", None, "Qwen2.5-7B-Instruct-Turbo"])
def test_unknown_or_partial_names_resolve_to_none(written):
    # The reference guessed by substring and crashed with KeyError on ids without a price.
    reg = ModelRegistry.from_yaml(PAPER)
    assert reg.resolve(written) is None
    assert written not in reg if written is not None else True


def test_cost_uses_output_and_input_prices():
    reg = ModelRegistry.from_dict({"models": [
        {"name": "A", "api_id": "a", "price_out_per_m": 2.0, "price_in_per_m": 0.5}]})
    assert reg["A"].cost(prompt_tokens=1000, completion_tokens=500) == pytest.approx((500 * 2.0 + 1000 * 0.5) / 1e6)


def test_base_url_override_and_key_from_env(monkeypatch):
    reg = ModelRegistry.from_yaml(PAPER, base_url="http://127.0.0.1:9/v1")
    assert {reg[n].base_url for n in reg.names} == {"http://127.0.0.1:9/v1"}
    monkeypatch.setenv("ROUTER_POOL_API_KEY", "sk-secret")
    spec = reg["Qwen2.5-7B-Instruct"]
    assert spec.api_key() == "sk-secret"
    assert "sk-secret" not in repr(spec)


@pytest.mark.parametrize("doc, needle", [
    ({}, "models"),
    ({"models": [{"name": "A", "api_id": "a"}]}, "price_out_per_m"),
    ({"models": [{"name": "A", "api_id": "a", "price_out_per_m": "cheap"}]}, "not a number"),
    ({"models": [{"name": "A", "api_id": "a", "price_out_per_m": 1, "colour": "red"}]}, "colour"),
    ({"models": [{"name": "A", "api_id": "a", "price_out_per_m": 1},
                 {"name": "a", "api_id": "b", "price_out_per_m": 1}]}, "collides"),
    ({"models": [{"name": "A:1", "api_id": "a", "price_out_per_m": 1}]}, "colon"),
])
def test_bad_pool_files_name_the_field(tmp_path, doc, needle):
    assert needle in pool_error(tmp_path, doc)


def pool_error(tmp_path, doc: dict) -> str:
    """The RegistryError of a pool file holding `doc`, which must name the file."""
    import yaml
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(RegistryError) as err:
        ModelRegistry.from_yaml(path)
    assert str(path) in str(err.value)
    return str(err.value)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(RegistryError, match="not found"):
        ModelRegistry.from_yaml(tmp_path / "nope.yaml")
