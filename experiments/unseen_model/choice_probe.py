"""Teacher-forced first route of an SFT router on its own SFT rows: after the prompt and "<think>A D fact. Ask ",
is the next token the oracle's model (right) or at least a name the row lists (listed)? Varied and own listings apart.

    python -m experiments.unseen_model.choice_probe outputs/unseen/varied2/sft outputs/unseen/varied2/oracle/oracle.parquet 400
"""
from __future__ import annotations

import argparse
import collections
import re

import pandas as pd
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", help="the SFT router's directory")
    p.add_argument("data", help="its oracle.parquet")
    p.add_argument("n", type=int, nargs="?", default=300, help="the first N rows")
    a = p.parse_args(argv)
    tok = AutoTokenizer.from_pretrained(a.checkpoint)
    model = AutoModelForCausalLM.from_pretrained(a.checkpoint).eval()
    ok, tot, listed = collections.Counter(), collections.Counter(), collections.Counter()
    for _, r in pd.read_parquet(a.data).head(a.n).iterrows():
        m = re.match(r"<think>A (\w+) fact\. Ask (\S+)\.", r.response_text)
        if not m:
            continue
        kind = "varied" if r.listing else "canon"
        prompt = tok.apply_chat_template(list(r.prompt), add_generation_prompt=True, tokenize=False)
        ids = tok(prompt + f"<think>A {m.group(1)} fact. Ask ", add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            logits = model(ids).logits[0, -1]
        got = tok.decode([int(logits.argmax())]).strip()
        tot[kind] += 1
        ok[kind] += got == m.group(2)
        listed[kind] += got in re.findall(r"^(\S+) \$", r.prompt[-1]["content"], re.M)  # at least a listed name?
    for k in tot:
        print(k, tot[k], "right", ok[k] / tot[k], "a listed name", listed[k] / tot[k])


if __name__ == "__main__":
    main()
