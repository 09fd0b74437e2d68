"""The world's names in the warm start: renamed rows and whole-name tokens.

With `rename` a share of trajectories have their entities renamed to others of the world (name_swap.py), and
`whole_names` keeps each multi-word name one token: together they teach the small policy to copy any name
(docs/results/router_quality).
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass

from sim.embedded import world_words
from sim.warm_start.name_swap import EntityNames
from sim.warm_start.name_swap import apply as apply_names
from sim.world import SimWorld


@dataclass
class Names:
    """Renaming the rows' entities, and which names the tokenizer keeps whole."""

    rename: float = 0.0  # share of trajectories whose entity names are renamed, consistently, to other names of the world (so the SFT data shows every name being copied)
    whole_names: bool = False  # each multi-word entity name (a person, a company) is one token too, so copying it is one step, not name, space, name
    name_tokens: bool = True  # the world's names as whole tokens (one-step copies); --no-name-tokens leaves them to the BPE's syllables
    freeze_names: bool = False  # write the names' token ids into model.json as frozen_token_ids (their embedding rows stay at their random start: a copy circuit that generalises to names training never showed)

    def __post_init__(self):
        if not 0.0 <= self.rename <= 1.0:
            raise ValueError(f"--rename must be in [0, 1], got {self.rename}")
        if self.whole_names and not self.name_tokens:
            raise ValueError("--whole-names needs the names as whole tokens (drop --no-name-tokens)")
        if self.freeze_names and not self.name_tokens:
            raise ValueError("--freeze-names needs the names as whole tokens (drop --no-name-tokens)")

    def check(self, recipe) -> None:
        if self.rename and recipe.turn_budgets.on:
            raise ValueError("--rename: the turn-budget rows keep their questions' names "
                             "(drop --rename with --budgets)")

    def renamer(self, world: SimWorld, shown: str, seed: int) -> "Renamer":
        """The renamer of rows prompted with `shown` (the template with its pool listed)."""
        return Renamer(world, shown, self.rename, seed)

    def token_words(self, world: SimWorld, models: list[str]) -> list[str]:
        """Words the tokenizer keeps whole: the model names `models`, the world's names (name_tokens) and each
        multi-word entity name (whole_names)."""
        names = list(models) + (world_words(world) if self.name_tokens else [])
        if self.whole_names:
            names += sorted(n for n in world.entities if " " in n)
        return names

    def frozen_ids(self, tokenizer, world: SimWorld) -> list[int] | None:
        """The token ids model.json holds fixed (freeze_names), else None."""
        if not self.freeze_names:
            return None
        return sorted({tokenizer.convert_tokens_to_ids(w) for w in world_words(world)})


class Renamer:
    """A share of rows get their entities renamed to other names of the world (name_swap, drawn deck-wise over all
    rows), one mapping per row across its question, segments, answers and answer."""

    def __init__(self, world: SimWorld, shown: str, share: float, seed: int):
        self.share = share
        # its own stream, so the questions and the noise of a seed do not depend on --rename
        self.rng = random.Random(f"rename-{seed}")
        # the prompt's words besides the question (model names, tags) are never renamed
        self.names = EntityNames.from_world(world, reserved=set(re.findall(r"\w+", shown)))
        self.decks: dict[str, list[str]] = {}  # the renaming's draws, shared by all rows (EntityNames.mapping)

    def __call__(self, question: str, segments: list[dict], answers: list[str], answer: str):
        """(renamed, question, segments, answers, answer): renamed for a share of rows, else as given."""
        if not self.rng.random() < self.share:
            return False, question, segments, answers, answer
        text = "".join(seg["text"] for seg in segments)
        names = self.names.mapping([question, text, *answers], self.rng, self.decks)
        segments = [{**seg, "text": apply_names(names, seg["text"])} for seg in segments]
        return True, apply_names(names, question), segments, [apply_names(names, a) for a in answers], \
            apply_names(names, answer)
