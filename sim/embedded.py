"""Pieces of the embedded default (a small router trained from scratch on the simulated pool).

The compact prompt lists each model as one short line derived from its `sim:` profile,
the tokenizer is a byte-level BPE trained on our own prompts and trajectories, and
EMBEDDED_MODEL is a config for a policy small enough for SFT + PPO on two CPU cores.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from router_r1.pool.listing import LISTINGS, domains_line, priced_name  # noqa: F401 (priced_name: the sim's callers)
from router_r1.pool.registry import ModelRegistry
from sim.world import DOMAINS, SimWorld
from router_r1.prompts import fill_template, load_template

REPO_ROOT = Path(__file__).resolve().parents[1]
COMPACT_TEMPLATE = REPO_ROOT / "configs" / "prompts" / "compact.txt"

STRONG_ACCURACY = 0.9  # a domain is a model's strength from this accuracy on
GENERALIST_ACCURACY = 0.75  # right at least this often on every domain: "all topics"
FAIR_ACCURACY = 0.6  # a cheap weaker specialist's domains (configs/pool/sim_tradeoff.yaml) still get named: "fair on"

# 2 layers of width 128 (~0.4M parameters besides the tied vocab x 128 embedding). Sized so
# that SFT (~750 steps) and PPO fit the two-core CPU budget; on held-out questions it copied
# names as well as 4 layers did after the same SFT steps, at ~1.6x less compute per token.
# 1024 positions hold the compact prompt (~120 tokens) and three routing turns with their
# replies (~250 tokens) with room to spare.
EMBEDDED_MODEL = {
    "model_type": "llama",
    "vocab_size": None,  # filled from the tokenizer
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,  # the output side of a name is its input side: copying comes easily
    "rope_theta": 10000.0,
}


def domain_accuracy(spec) -> dict[str, float]:
    """P(right) per domain from a model's `sim:` profile (`default` for the domains it does not name)."""
    acc = (spec.sim or {}).get("accuracy")
    if not isinstance(acc, dict) or not acc:
        raise ValueError(f"model {spec.name!r} has no sim.accuracy profile: the compact pool text needs one")
    return {d: float(acc.get(d, acc.get("default", 0.0))) for d in DOMAINS}


def pool_line(spec, shown: str) -> str:
    """One compact pool line: "Qwen2.5-7B-Instruct $0.30: science, business"."""
    return domains_line(spec, shown)


def model_topics(spec) -> str:
    """What one model is good at, from its `sim:` profile: "science, business", "fair on arts" or "all topics"."""
    per = domain_accuracy(spec)
    strong = [d for d in DOMAINS if per[d] >= STRONG_ACCURACY]
    if min(per.values()) >= GENERALIST_ACCURACY:
        best = [d for d in strong if per[d] > min(per.values())]
        return "all topics" + (f", best at {', '.join(best)}" if best else "")
    fair = [d for d in DOMAINS if FAIR_ACCURACY <= per[d] < STRONG_ACCURACY]
    parts = [", ".join(strong)] if strong else []
    if fair:
        parts.append("fair on " + ", ".join(fair))
    return "; ".join(parts) or "no strong topic"


def compact_pool_text(registry: ModelRegistry) -> str:
    """One short line per model (pool_line): the domain listing of a simulated pool (router_r1/pool/listing.py)."""
    return "\n".join(pool_line(s, s.topics or model_topics(s)) for s in registry.models.values())


def render_compact_template(registry: ModelRegistry, template_path: str | Path = COMPACT_TEMPLATE) -> str:
    """The compact template with `registry`'s domain listing written in; {question} (and {budget}) stay.

    A template so written lists these models whatever the pool it is used with (an experiment's fixed listing, such
    as one with an unseen model); the warm start's prompt_template.txt keeps {pool_domains} instead.
    """
    return fill_template(load_template(template_path), **{LISTINGS["domains"]: compact_pool_text(registry)})


def world_words(world: SimWorld) -> list[str]:
    """Every word of every entity name, genre and symbol of the world (its lexicon)."""
    names = list(world.entities) + world.by_type.get("genre", []) + world.by_type.get("symbol", [])
    return sorted({w for name in names for w in re.findall(r"\w+", name)})


def build_tokenizer(out_dir: str | Path, corpus_texts: list[str], vocab_size: int = 1024,
                    extra_words: tuple[str, ...] | list[str] = ()):
    """Train the byte-level BPE on `corpus_texts`, save an HF tokenizer dir, return it as reloaded.

    `extra_words` (model names, the world's names) become single tokens that match whole
    words only, so a tiny model copies a name in one step instead of syllable by syllable.
    """
    from tokenizers import AddedToken, Tokenizer
    from transformers import AutoTokenizer

    from verl.utils.tiny import TAGS, train_bpe_json, wrap_tokenizer

    if not corpus_texts:
        raise ValueError("build_tokenizer: empty corpus")
    raw = Tokenizer.from_str(train_bpe_json(list(corpus_texts), vocab_size=vocab_size, tags=TAGS))
    extra = [w for w in dict.fromkeys(extra_words) if w not in TAGS]
    raw.add_tokens([AddedToken(w, single_word=True, normalized=False, special=False) for w in extra])
    tok = wrap_tokenizer(raw.to_str())
    words = tuple(TAGS) + tuple(extra)
    out_dir = Path(out_dir)
    tok.save_pretrained(out_dir)
    loaded = AutoTokenizer.from_pretrained(out_dir)  # what every later stage will see
    for word in words:
        if len(loaded(word, add_special_tokens=False)["input_ids"]) != 1:
            raise RuntimeError(f"{out_dir}: {word!r} is not a single token after reload")
    for text in corpus_texts[:200]:  # the rollout decodes what it generated: text must round-trip
        if loaded.decode(loaded(text, add_special_tokens=False)["input_ids"]) != text:
            raise RuntimeError(f"{out_dir}: text does not round-trip through the tokenizer: {text[:80]!r}")
    if loaded.chat_template is None or loaded.pad_token_id is None or loaded.eos_token_id is None:
        raise RuntimeError(f"{out_dir}: chat template, pad or eos token lost after reload")
    return loaded


def model_config(tokenizer, base: dict | None = None) -> dict:
    """EMBEDDED_MODEL (or `base`) with the tokenizer's vocabulary size and special ids."""
    from verl.workers.model_loader import spec_for_tokenizer

    spec = dict(EMBEDDED_MODEL if base is None else base)
    spec.update(vocab_size=None, pad_token_id=None, bos_token_id=None, eos_token_id=None)
    return spec_for_tokenizer(spec, tokenizer)


def write_model_config(path: str | Path, tokenizer, overrides: dict | None = None,
                       frozen_token_ids: list[int] | None = None) -> dict:
    """Write model_config(tokenizer) as JSON (what `model.path` reads), with `overrides` over EMBEDDED_MODEL
    and the embedding rows the trainer holds fixed (verl.workers.fsdp_worker.freeze_token_rows)."""
    unknown = set(overrides or {}) - set(EMBEDDED_MODEL)
    if unknown:
        raise ValueError(f"model overrides: unknown key(s) {sorted(unknown)} (known: {sorted(EMBEDDED_MODEL)})")
    spec = model_config(tokenizer, {**EMBEDDED_MODEL, **(overrides or {})})
    if frozen_token_ids:
        spec["frozen_token_ids"] = list(frozen_token_ids)
    Path(path).write_text(json.dumps(spec, indent=2) + "\n")
    return spec
