"""The random-weight policy of the 3B pipeline figure: a Qwen2.5-shaped model saved once (both runs load the same
weights) with a tokenizer whose extra tokens are whole router actions, so random sampling still routes.

A random model samples nearly uniformly over its vocabulary, so plain garbage would never write
`<search>Model: question</search>` and the pool would never be called. Here 1 id in --turn-tokens is an action
token (a whole route to a pool model, or 1 in 4 a whole answer): a turn then runs ~--turn-tokens tokens
(geometric, capped by rollout.response_length) and ends in a pool call as a router's turn does, and the
episode's turns, pool waits and <information> blocks follow the env's rules. Most ids lie past the tokenizer and
decode to nothing: their tokens still count, their text is empty.

    python -m experiments.pipeline_3b.build --shape qwen2.5-3b --base-tokenizer OUT/oracle/tokenizer \\
        --data OUT/data/train.parquet --out OUT/model
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
import torch

from router_r1.pool.registry import ModelRegistry
from router_r1.pool.world import SIM_POOL
from tools.bench.bench_update import SHAPES as UPDATE_SHAPES

# The benchmarks' shapes (tools/bench/bench_update.py), and a tiny one for CPU tests; its vocabulary holds
# the simulated world's tokenizer (~3,300 tokens) and its action tokens.
SHAPES = {"qwen2.5-3b": UPDATE_SHAPES["qwen2.5-3b"], "qwen2.5-0.5b": UPDATE_SHAPES["qwen2.5-0.5b"],
          "tiny": dict(UPDATE_SHAPES["tiny"], vocab_size=4096, max_position_embeddings=2048)}
ANSWER_SHARE = 0.25  # of the action tokens: whole answers (the episode ends); the rest route


def action_texts(names: list[str], questions: list[str], n: int) -> list[str]:
    """`n` distinct action strings: routes of the questions to each model in turn, every 4th an answer."""
    if not names or not questions:
        raise ValueError("action_texts: needs pool model names and questions")
    out, routes = [], 0
    for i in range(n):
        if (i + 1) % round(1 / ANSWER_SHARE) == 0:
            out.append(f"<answer>{i}</answer>")
            continue
        q = questions[(routes // len(names)) % len(questions)]
        lap = routes // (len(names) * len(questions))  # more routes than pairs: a counter keeps them distinct
        out.append(f"<search>{names[routes % len(names)]}: {q}{f' ({lap})' if lap else ''}</search>")
        routes += 1
    return out


def build_tokenizer(base: str, pool: str, data: str, vocab: int, turn_tokens: int):
    """The base tokenizer plus vocab // turn_tokens action tokens (each one id that decodes to its whole text)."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base)
    n = vocab // turn_tokens
    if len(tok) + n > vocab:
        raise ValueError(f"{base}: {len(tok)} tokens + {n} action tokens exceed the model's vocabulary of {vocab}; "
                         f"raise --turn-tokens")
    names = ModelRegistry.from_yaml(pool).seen().names
    rows = pd.read_parquet(data)
    if "extra_info" not in rows:
        raise ValueError(f"{data}: no extra_info column (a sim.qa parquet has one with each row's question)")
    questions = [info["question"] for info in rows["extra_info"]]
    texts = action_texts(names, questions, n)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in texts])
    return tok, texts


def build_model(shape: str, tok, device: str, dtype: torch.dtype):
    """A random-init causal LM of `shape` with the tokenizer's special ids."""
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(SHAPES[shape])
    spec.update(pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    config = AutoConfig.for_model(**spec)
    torch.manual_seed(0)
    with torch.device(device):  # on a GPU the 3B init takes seconds, on CPU minutes
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def build(shape: str, base_tokenizer: str, data: str, out: str | Path, turn_tokens: int, pool: str = str(SIM_POOL),
          device: str = "cpu") -> dict:
    """Save the tokenizer and the model under `out` (what model.path and model.tokenizer load); returns a summary."""
    from transformers import AutoTokenizer

    if shape not in SHAPES:
        raise ValueError(f"--shape {shape!r}: one of {sorted(SHAPES)}")
    out = Path(out)
    vocab = SHAPES[shape]["vocab_size"]
    tok, texts = build_tokenizer(base_tokenizer, pool, data, vocab, turn_tokens)
    dtype = torch.float32 if shape == "tiny" else torch.bfloat16  # the trainer upcasts its master copy to fp32
    model = build_model(shape, tok, device, dtype)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    loaded = AutoTokenizer.from_pretrained(out)  # what the run will see: each action one id, decoding whole
    first = len(loaded) - len(texts)
    for i in (0, len(texts) // 2, len(texts) - 1):
        if loaded.decode([first + i]) != texts[i] or loaded(texts[i], add_special_tokens=False)["input_ids"] != [
                first + i]:
            raise RuntimeError(f"{out}: action token {texts[i]!r} does not round-trip as one id")
    summary = {"shape": shape, "params": sum(p.numel() for p in model.parameters()), "vocab": vocab,
               "tokenizer": len(loaded), "action_tokens": len(texts),
               "answer_tokens": sum(t.startswith("<answer>") for t in texts), "turn_tokens": turn_tokens}
    (out / "pipeline_3b.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="qwen2.5-3b", choices=sorted(SHAPES), help="model shape")
    p.add_argument("--base-tokenizer", required=True, help="tokenizer dir the prompts are built for (sim.warm_start's)")
    p.add_argument("--data", required=True, help="a sim.qa parquet: the routes' questions")
    p.add_argument("--out", required=True, help="where the model and tokenizer are saved")
    p.add_argument("--turn-tokens", type=int, default=64, help="1 id in this many is an action token: the mean "
                   "tokens a random policy writes per turn (before rollout.response_length cuts it)")
    p.add_argument("--pool", default=str(SIM_POOL), help="pool yaml whose seen models the routes name")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="where to init")
    args = p.parse_args(argv)
    if args.turn_tokens < 2:
        p.error("--turn-tokens must be >= 2")
    summary = build(args.shape, args.base_tokenizer, args.data, args.out, args.turn_tokens, args.pool, args.device)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
