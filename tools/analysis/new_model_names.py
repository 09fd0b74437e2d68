"""Give pool model names a router never saw an embedding like the names it was trained to copy.

    python -m tools.analysis.new_model_names --checkpoint outputs/unseen/varied2/sft \
        --like outputs/unseen/varied2/oracle/oracle.parquet --names SciGLM-6B --out outputs/unseen/varied2/sft_new

A whole-token name that no SFT row shows only learns to be unlikely (its tied embedding row is pushed away
from every hidden state), so the policy never writes it, whatever its pool line says. Offering a new model
adds a word to the router's vocabulary, and as usual for a new token its row is drawn from the distribution
of related trained rows: here of the names the SFT rows routed to (per-dimension mean and std, seeded).
Copies the checkpoint to --out with those rows replaced; the source is left as it was.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch

from verl.trainer.sft_data import SFTDataError, load_rows


class NameError_(ValueError):
    """A name that is not one token, or not new."""


def name_id(tokenizer, name: str) -> int:
    """The one token id of `name`; NameError_ if the tokenizer splits it."""
    ids = tokenizer(name, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise NameError_(f"{name!r} is {len(ids)} tokens in this tokenizer, not one: it has no row of its own")
    return ids[0]


def draw_rows(weight: torch.Tensor, like_ids: list[int], n: int, seed: int = 0) -> torch.Tensor:
    """`n` rows from the per-dimension normal of `weight`'s rows `like_ids`."""
    like = weight[like_ids].float()
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(n, weight.shape[1], generator=gen)
    return (like.mean(0) + like.std(0) * noise).to(weight.dtype)


def add_names(checkpoint: str | Path, like: str | Path, names: list[str], out: str | Path, seed: int = 0) -> dict:
    """Copy `checkpoint` to `out` with the rows of `names` drawn like the routed names of the SFT rows in `like`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    checkpoint, out = Path(checkpoint), Path(out)
    if not (checkpoint / "config.json").is_file():
        raise NameError_(f"{checkpoint}: no checkpoint (config.json) there")
    if out.resolve() == checkpoint.resolve():
        raise NameError_(f"--out {out} is the checkpoint itself: give another directory")
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    routed = sorted({m for row in load_rows(like) for m in row.get("route_models") or ()})
    if not routed:
        raise NameError_(f"{like}: no row routes to a model (column route_models): nothing to draw the rows like")
    taken = [n for n in names if n in routed]
    if taken:
        raise NameError_(f"{', '.join(taken)} appear(s) in the routes of {like}: not new to this router")
    like_ids = [name_id(tokenizer, m) for m in routed]
    new_ids = [name_id(tokenizer, n) for n in names]
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(checkpoint, out)
    model = AutoModelForCausalLM.from_pretrained(out)
    weight = model.get_input_embeddings().weight
    with torch.no_grad():
        weight[new_ids] = draw_rows(weight, like_ids, len(new_ids), seed)
    model.save_pretrained(out)
    return {"names": dict(zip(names, new_ids)), "like": len(like_ids), "out": str(out)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.analysis.new_model_names", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="HF model dir of the router (an SFT or PPO export)")
    p.add_argument("--like", required=True, help="the SFT rows (oracle.parquet): their routed names give the rows' law")
    p.add_argument("--names", required=True, nargs="+", help="the new model names (one token each)")
    p.add_argument("--out", required=True, help="where the copy with the new rows is written")
    p.add_argument("--seed", type=int, default=0, help="seed of the new rows' draw")
    a = p.parse_args(argv)
    try:
        done = add_names(a.checkpoint, a.like, a.names, a.out, a.seed)
    except (NameError_, SFTDataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {done['out']}: rows of {', '.join(done['names'])} drawn like the {done['like']} routed names")
    return 0


if __name__ == "__main__":
    sys.exit(main())
