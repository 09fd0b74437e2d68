"""Build train/val/test parquet files from the simulated world (the embedded default's data).

    python -m sim.qa --out-dir data/sim

Same row schema as build_qa, data_source "sim_1hop" or "sim_2hop". The world seed must
match the simulated pool's (`router_r1.pool.server --backend sim`, seed 0 by default), or
the experts answer about another world. Train questions use the world's train facts; val
and test use its held-out facts, and val never uses a fact any test question uses.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Optional

from data_process.build_qa import budget_arg, make_prompter, size_arg, write_parquets
from data_process.schema import DataBuildError, make_row, validate_row
from router_r1.flags import from_args, parser_for, run_command
from router_r1.pool.registry import RegistryError
from router_r1.pool.world import SIM_POOL
from router_r1.prompts import TemplateError
from sim.world import DEFAULT_ENTITIES, SimQuestion, SimWorld


@dataclass
class SimConfig:
    """The data's settings; each field is a flag of `python -m sim.qa` (router_r1/flags.py)."""

    out_dir: str = "data/sim"  # where train/val/test.parquet are written
    pool: str = str(SIM_POOL)  # pool yaml whose models the prompt lists
    include_unseen: bool = False  # also list the models marked unseen
    turn_budget: Optional[int] = field(default=None, metadata={"type": budget_arg})  # state this turn budget in every prompt (AdaTurn data)
    prompt_template: Optional[str] = None  # template file of the prompts (the oracle's prompt_template.txt for the embedded default; default: the default template)
    world_seed: int = 0  # must match the simulated pool's seed
    world_entities: int = DEFAULT_ENTITIES  # entities per type of the world (must match the pool server's --world-entities)
    seed: int = 42  # question sampling seed
    train_size: int = field(default=2000, metadata={"type": size_arg})  # training questions
    val_size: int = field(default=100, metadata={"type": size_arg})  # validation questions
    test_size: int = field(default=300, metadata={"type": size_arg})  # test questions
    two_hop_frac: float = 0.4  # share of two-hop questions


def _fact(h) -> tuple:
    # The same fact can be worded two ways; disjointness is about facts, not wording.
    return (h.relation, h.subject)


def draw_questions(cfg: SimConfig) -> dict[str, list[SimQuestion]]:
    """Questions per output split; test first, so it does not depend on the val size."""
    world = SimWorld(seed=cfg.world_seed, n_entities_per_type=cfg.world_entities)
    test = world.questions(cfg.test_size, cfg.seed, "test", cfg.two_hop_frac)
    # Val shares no single fact with test (not only no chain): a choice made on val (a probe, the best step)
    # must not have seen a test answer. A second draw three val sizes past test leaves enough such questions.
    taken = {_fact(h) for q in test for h in q.hops}
    try:
        extra = world.questions(cfg.test_size + 3 * cfg.val_size, cfg.seed + 1, "test", cfg.two_hop_frac)
    except ValueError:  # a small world: the draw that only just holds test and val
        extra = world.questions(cfg.test_size + cfg.val_size, cfg.seed + 1, "test", cfg.two_hop_frac)
    fresh = [q for q in extra if not any(_fact(h) in taken for h in q.hops)]
    one = [q for q in fresh if len(q.hops) == 1]
    two = [q for q in fresh if len(q.hops) == 2]
    n_two = min(len(two), max(round(cfg.val_size * cfg.two_hop_frac), cfg.val_size - len(one)))
    keep = {id(q) for q in two[:n_two] + one[:cfg.val_size - n_two]}
    val = [q for q in fresh if id(q) in keep]
    if len(val) < cfg.val_size:
        raise DataBuildError(f"sim.qa: only {len(val)} validation questions share no fact with the {cfg.test_size} "
                             f"test questions, {cfg.val_size} asked; lower --val-size or --test-size, or raise "
                             f"--world-entities")
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
    p = parser_for(SimConfig, "python -m sim.qa", __doc__.split("\n\n")[0])
    return from_args(SimConfig, p.parse_args(argv))


def print_written(written: dict[str, int]) -> None:
    for path, n in written.items():
        print(f"wrote {path}: {n} rows")


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    # SimWorld's ValueError says what is too big
    return run_command(lambda: build_sim(cfg), (DataBuildError, TemplateError, RegistryError, ValueError), print_written)


if __name__ == "__main__":
    sys.exit(main())
