"""A warm start whose entity-name rows RL may not move: a copy of an SFT_FROM folder (sft, oracle, data,
world.env) whose sft/config.json names every entity of the world as `frozen_token_ids`.

    python -m experiments.rl_frozen_names.freeze SRC DST [--world-seed N]   # default: SRC/world.env's

The embedded router holds each entity name as one token, with tied input and output rows; model.config's
frozen_token_ids keeps those rows at their SFT values through PPO (freeze_token_rows in verl/workers/fsdp_worker.py),
so an update cannot make a name more or less likely to be written, or read differently, because of the
training facts it appeared in (docs/rl_diagnosis.md section 12).
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

from transformers import AutoTokenizer

from sim.world import SimWorld
from verl.utils.export_manifest import write_manifest


def entity_ids(tokenizer, world: SimWorld) -> list[int]:
    """The token id of every entity name of `world`; an error if the tokenizer does not hold a name whole."""
    ids, missing = set(), []
    for name in world.entities:
        i = tokenizer.convert_tokens_to_ids(name)
        if i is None or i == tokenizer.unk_token_id:
            missing.append(name)
        else:
            ids.add(i)
    if missing:
        raise SystemExit(f"the tokenizer does not hold {len(missing)} entity names as one token (e.g. "
                         f"{missing[:3]}): a warm start built with whole_names is needed")
    return sorted(ids)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", type=Path, help="an SFT_FROM folder of train.sh (sft/, oracle/, data/, world.env)")
    p.add_argument("dst", type=Path, help="the new folder: sft copied (its checkpoints left out), the rest linked")
    p.add_argument("--world-seed", type=int, default=None,
                   help="the world the warm start was built in (default: WORLD_SEED of SRC/world.env, else 0)")
    args = p.parse_args(argv)
    if args.world_seed is None:
        env = args.src / "world.env"
        seeds = re.findall(r"^WORLD_SEED=(\d+)$", env.read_text(), re.M) if env.is_file() else []
        args.world_seed = int(seeds[0]) if seeds else 0
    if not (args.src / "sft" / "config.json").is_file():
        raise SystemExit(f"{args.src}/sft/config.json: not found (not an SFT_FROM folder)")
    ids = entity_ids(AutoTokenizer.from_pretrained(args.src / "sft"), SimWorld(seed=args.world_seed))
    args.dst.mkdir(parents=True, exist_ok=False)
    shutil.copytree(args.src / "sft", args.dst / "sft", ignore=shutil.ignore_patterns("checkpoints"))
    for name in ("oracle", "data"):
        (args.dst / name).symlink_to((args.src / name).resolve())
    shutil.copy(args.src / "world.env", args.dst / "world.env")
    cfg_path = args.dst / "sft" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["frozen_token_ids"] = ids
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    write_manifest(args.dst / "sft")  # the edited config is this copy's own: evaluation checks the export against it
    print(f"{args.dst}: {len(cfg['frozen_token_ids'])} entity rows frozen for RL")
    return 0


if __name__ == "__main__":
    sys.exit(main())
