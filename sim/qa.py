"""Build train/val/test parquet files from the simulated world (the embedded default's data).

    python -m sim.qa --out-dir data/sim

Same row schema as build_qa, data_source "sim_1hop" or "sim_2hop". The world seed must
match the simulated pool's (`router_r1.pool.server --backend sim`, seed 0 by default), or
the experts answer about another world. Train questions use the world's train facts; val
and test use its held-out facts, and val never repeats a fact chain of test.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from data_process.build_qa import REPO_ROOT, budget_arg, make_prompter, size_arg, write_parquets
from data_process.schema import DataBuildError, make_row, validate_row
from router_r1.pool.registry import RegistryError
from sim.world import DEFAULT_ENTITIES, SimQuestion, SimWorld
from router_r1.prompts import TemplateError

DEFAULT_POOL = REPO_ROOT / "configs" / "pool" / "sim.yaml"


@dataclass
class SimConfig:
    out_dir: str | Path
    pool: str | Path = DEFAULT_POOL
    include_unseen: bool = False
    turn_budget: int | None = None
    prompt_template: str | Path | None = None
    world_seed: int = 0  # must equal the simulated pool's seed
    world_entities: int = DEFAULT_ENTITIES  # entities per type; must equal the pool's --world-entities
    seed: int = 42  # which questions are drawn
    train_size: int = 2000
    val_size: int = 100
    test_size: int = 300
    two_hop_frac: float = 0.4


def _chain(q: SimQuestion) -> tuple:
    # The same fact chain can be worded two ways; disjointness is about facts, not wording.
    return tuple((h.relation, h.subject) for h in q.hops)


def draw_questions(cfg: SimConfig) -> dict[str, list[SimQuestion]]:
    """Questions per output split; test first, so it does not depend on the val size."""
    world = SimWorld(seed=cfg.world_seed, n_entities_per_type=cfg.world_entities)
    test = world.questions(cfg.test_size, cfg.seed, "test", cfg.two_hop_frac)
    taken = {_chain(q) for q in test}
    # A second draw holds at most test_size chains of test, so val_size are always left. The
    # few two-hop held-out chains overlap most, so keep the one/two-hop mix by quota.
    extra = world.questions(cfg.test_size + cfg.val_size, cfg.seed + 1, "test", cfg.two_hop_frac)
    fresh = [q for q in extra if _chain(q) not in taken]
    one = [q for q in fresh if len(q.hops) == 1]
    two = [q for q in fresh if len(q.hops) == 2]
    n_two = min(len(two), max(round(cfg.val_size * cfg.two_hop_frac), cfg.val_size - len(one)))
    keep = {id(q) for q in two[:n_two] + one[:cfg.val_size - n_two]}
    val = [q for q in fresh if id(q) in keep]
    train = world.questions(cfg.train_size, cfg.seed, "train", cfg.two_hop_frac)
    return {"train": train, "val": val, "test": test}


def build_sim(cfg: SimConfig) -> dict[str, int]:
    """Write train/val/test.parquet; returns path -> rows."""
    prompter = make_prompter(cfg.pool, cfg.include_unseen, cfg.prompt_template, cfg.turn_budget)
    outputs = {}
    for split, questions in draw_questions(cfg).items():
        rows, counts = [], {}
        for q in questions:
            source = "sim_1hop" if len(q.hops) == 1 else "sim_2hop"
            index = counts[source] = counts.get(source, -1) + 1
            row = make_row(source, split, index, q.question, q.answers, prompter(q.question), q.split, q.uid)
            row["extra_info"]["domain"] = q.domain  # for per-domain accuracy in evaluation
            validate_row(row, f"{split}.parquet: {source} row {index}")
            rows.append(row)
        outputs[f"{split}.parquet"] = rows
    return write_parquets(cfg.out_dir, outputs)


def parse_args(argv: list[str] | None = None) -> SimConfig:
    p = argparse.ArgumentParser(prog="python -m sim.qa", description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", default="data/sim", help="where train/val/test.parquet are written")
    p.add_argument("--pool", default=str(DEFAULT_POOL), help="pool yaml whose models the prompt lists")
    p.add_argument("--include-unseen", action="store_true", help="also list the models marked unseen")
    p.add_argument("--turn-budget", type=budget_arg, default=None,
                   help="state this turn budget in every prompt (AdaTurn data)")
    p.add_argument("--prompt-template", default=None,
                   help="template file of the prompts (the oracle's prompt_template.txt for the embedded default; default: the default template)")
    p.add_argument("--world-seed", type=int, default=0, help="must match the simulated pool's seed")
    p.add_argument("--world-entities", type=int, default=DEFAULT_ENTITIES,
                   help="entities per type of the world (must match the pool server's --world-entities)")
    p.add_argument("--seed", type=int, default=42, help="question sampling seed")
    p.add_argument("--train-size", type=size_arg, default=2000, help="training questions")
    p.add_argument("--val-size", type=size_arg, default=100, help="validation questions")
    p.add_argument("--test-size", type=size_arg, default=300, help="test questions")
    p.add_argument("--two-hop-frac", type=float, default=0.4, help="share of two-hop questions")
    return SimConfig(**vars(p.parse_args(argv)))


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    try:
        written = build_sim(cfg)
    except (DataBuildError, TemplateError, RegistryError, ValueError) as e:  # SimWorld says what is too big
        print(f"error: {e}", file=sys.stderr)
        return 1
    for path, n in written.items():
        print(f"wrote {path}: {n} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
