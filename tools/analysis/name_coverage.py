"""How many test questions name an entity the SFT data never shows (why a small policy miscopies names).

    python -m tools.analysis.name_coverage --oracle OUT/oracle/oracle.parquet --test OUT/data/test.parquet

A name word that never appears in the oracle trajectories has an embedding row that only ever learned
to be unlikely: a policy with whole-word name tokens cannot copy it into a sub-question or an answer.
"""
from __future__ import annotations

import argparse
import collections
import re

import pandas as pd

from sim.embedded import world_words
from sim.world import DEFAULT_ENTITIES, SimWorld


def coverage(oracle: pd.DataFrame, test: pd.DataFrame, words: set[str]) -> dict:
    """Counts of test questions (and gold answers) with a name word seen 0 / fewer than 3 times in `oracle`."""
    seen = collections.Counter(w for text in oracle["question"] + " " + oracle["response_text"]
                               for w in re.findall(r"\w+", text) if w in words)
    out = {"test": len(test), "name_words": len(words), "seen_in_sft": len(seen),
           "question_unseen": 0, "question_rare": 0, "answer_unseen": 0}
    for info, reward in zip(test["extra_info"], test["reward_model"]):
        q = [w for w in re.findall(r"\w+", info["question"]) if w in words]
        a = [w for w in re.findall(r"\w+", str(reward["ground_truth"]["target"][0])) if w in words]
        out["question_unseen"] += any(seen[w] == 0 for w in q)
        out["question_rare"] += any(seen[w] < 3 for w in q)
        out["answer_unseen"] += any(seen[w] == 0 for w in a)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--oracle", required=True, help="the SFT data (python -m sim.warm_start's oracle.parquet)")
    p.add_argument("--test", required=True, help="the test questions (sim.qa's test.parquet)")
    p.add_argument("--world-seed", type=int, default=0, help="the simulated world's seed")
    p.add_argument("--world-entities", type=int, default=DEFAULT_ENTITIES, help="entities per type of the world")
    a = p.parse_args()
    words = set(world_words(SimWorld(seed=a.world_seed, n_entities_per_type=a.world_entities)))
    c = coverage(pd.read_parquet(a.oracle), pd.read_parquet(a.test), words)
    print(f"name words {c['name_words']}, in the SFT data {c['seen_in_sft']}; of {c['test']} test questions "
          f"{c['question_unseen']} name a word the SFT data never shows ({c['question_rare']} one seen < 3 times); "
          f"{c['answer_unseen']} gold answers hold such a word")


if __name__ == "__main__":
    main()
