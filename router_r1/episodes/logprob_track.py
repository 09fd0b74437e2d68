"""The sampling engine's log-probs of an episode's generated turns, aligned to its final response."""
from __future__ import annotations

from router_r1.episodes.episode import Episode


class LogprobTrack:
    """The sampling engine's log-probs of each generated turn, aligned to the final response.

    The rules may cut a turn (no room left) or drop a refused one (forced answer), so the
    turns' log-probs are placed where their tokens ended up: a turn generated when the
    response held `start` tokens covers positions start.., kept while the token there is
    the policy's and the same id; a later turn at the same place overrides an earlier one."""

    def __init__(self, episodes: list[Episode]):
        self.turns: dict[int, list[tuple[int, list[int], list[float]]]] = {id(e): [] for e in episodes}

    def record(self, ep: Episode, out) -> None:
        if out.logprobs is None or len(out.logprobs) != len(out.token_ids):
            raise ValueError("sampling.return_logprobs is set but the engine returned "
                             f"{None if out.logprobs is None else len(out.logprobs)} log-probs for "
                             f"{len(out.token_ids)} tokens")
        self.turns[id(ep)].append((len(ep.response_ids), list(out.token_ids), list(out.logprobs)))

    def copy(self, src_turns: list, dst: Episode) -> None:
        """`dst` forked from an episode whose recorded turns were `src_turns` (a copy of turns[id(src)])."""
        self.turns[id(dst)] = list(src_turns)

    def aligned(self, ep: Episode) -> list[float]:
        lp = [0.0] * len(ep.response_ids)  # environment tokens: 0 (masked out of every loss)
        for start, ids, lps in self.turns[id(ep)]:
            for j, (t, x) in enumerate(zip(ids, lps)):
                i = start + j
                if i >= len(lp) or ep.response_mask[i] != 1 or ep.response_ids[i] != t:
                    break
                lp[i] = x
        return lp
