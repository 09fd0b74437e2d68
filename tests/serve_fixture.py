"""A tiny router trained here (a few seconds of supervised steps) that the serving tests load from disk.

It always routes one sub-question to the dearest sim model, then answers ANSWER whatever the reply
(a real one or the failure note), at every stated alpha. Its two turns are single added tokens of its
tokenizer (as the embedded default's names are), so a few dozen steps teach it. It is saved as a run would be: model,
tokenizer, prompt_template.txt and the run's config (alpha-conditioned on ALPHAS, short turns).
"""
from __future__ import annotations

from pathlib import Path

import torch
import yaml

from router_r1.pool.registry import ModelRegistry
from sim.backend import SimBackend
from router_r1.pool.messages import submodel_messages
from router_r1.prompts import build_router_prompt
from router_r1.actions import NO_REPLY_TEXT, wrap_information
from tiny import tiny_model, tiny_tokenizer

SIM = Path(__file__).resolve().parents[1] / "configs" / "pool" / "sim.yaml"
BIG = "Mixtral-8x22B-Instruct"
SUB_QUESTION = "capital of Veloria"
ANSWER = "Paris"
TEMPLATE = "Route or answer.\n{alpha}{budget}Question: {question}\n"
ALPHAS = (0.0, 0.6)
TURNS = {"max_turns": 2, "max_obs_length": 48, "response_length": 40, "max_response_length": 300}
QUESTIONS = ("What is the capital of Veloria?",)  # the tests ask it (and others)
ROUTE = f"<think>ask</think><search>{BIG}: {SUB_QUESTION}</search>"
FINAL = f"<think>done</think><answer>{ANSWER}</answer>"


def write_val_parquet(path: Path) -> Path:
    """Two validation rows asking the served question: one gold right (ANSWER), one that no reply matches."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"data_source": "sim", "prompt": [{"role": "user", "content": q}], "ability": "qa",
             "reward_model": {"style": "rule", "ground_truth": {"target": [gold]}},
             "extra_info": {"uid": f"v{i}", "question": q}}
            for i, (q, gold) in enumerate([(QUESTIONS[0], ANSWER), (QUESTIONS[0], "Tekrel Ratis")])]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _examples(tok) -> list[tuple[list[int], list[int]]]:
    registry = ModelRegistry.from_yaml(SIM).seen()
    spec = registry[BIG]
    reply = SimBackend.from_pool_yaml(SIM).respond(spec.api_id, submodel_messages(SUB_QUESTION), spec.max_tokens)[0]
    replies = [" ".join(reply.split()[:30]), NO_REPLY_TEXT]
    out = []
    for q in QUESTIONS:
        for alpha in (None, *ALPHAS):
            text = tok.apply_chat_template(build_router_prompt(q, registry, TEMPLATE, alpha=alpha),
                                           add_generation_prompt=True, tokenize=False)
            prompt = tok(text, add_special_tokens=False)["input_ids"]
            for r in replies:
                parts = [(prompt, 0), (tok(ROUTE, add_special_tokens=False)["input_ids"], 1),
                         (tok(wrap_information(r), add_special_tokens=False)["input_ids"], 0),
                         (tok(FINAL, add_special_tokens=False)["input_ids"], 1)]
                out.append(([t for p, _ in parts for t in p], [m for p, m in parts for _ in p]))
    return out


def build_trained_router(out: Path, steps: int = 60, seed: int = 0, batch: int = 6) -> Path:
    """Train the tiny router on its one behaviour and save it as an HF dir with the run's settings."""
    tok = tiny_tokenizer(extra_tokens=(ROUTE, FINAL))
    examples = _examples(tok)
    model = tiny_model(len(tok), seed=seed).train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-2)
    n = max(len(ids) for ids, _ in examples)
    ids = torch.tensor([i + [tok.pad_token_id] * (n - len(i)) for i, _ in examples])  # (B, n)
    mask = torch.tensor([m + [0] * (n - len(m)) for _, m in examples], dtype=torch.float32)  # (B, n)
    attn = torch.tensor([[1] * len(i) + [0] * (n - len(i)) for i, _ in examples])  # (B, n)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):  # full batch: the six examples
        rows = torch.randperm(len(examples), generator=g)[:batch]
        logits = model(input_ids=ids[rows], attention_mask=attn[rows]).logits[:, :-1]  # (b, n-1, V)
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[rows, 1:], reduction="none")
        loss = (nll * mask[rows, 1:]).sum() / mask[rows, 1:].sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    if loss.item() > 0.05:  # the tests below would fail for a reason that is not theirs
        raise RuntimeError(f"the tiny router did not learn its behaviour (loss {loss.item():.3f})")
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(out)
    model.save_pretrained(out)
    (out / "prompt_template.txt").write_text(TEMPLATE)
    env = {"factory": "router_r1.router_env:make_env", "alphas": list(ALPHAS), "pool": str(SIM), **TURNS}
    (out / "run_config.yaml").write_text(yaml.safe_dump({"env": env}))  # the env section of a run's resolved config
    return out
