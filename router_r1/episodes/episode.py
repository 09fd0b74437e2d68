"""One routing episode's state and the rules for one turn; no I/O, no model.

The environment (router_r1/router_env.py) decides when to generate and when to call the pool; this
module decides what a generated turn means and what gets appended to the context.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from router_r1.pool.client import PoolResult
from router_r1.pool.messages import clean_text
from router_r1.pool.registry import ModelRegistry
from router_r1.prompts import budget_exhausted_message
from router_r1.actions import (
    Action, format_observation, invalid_observation, parse_action, truncate_at_first_action,
)

# What happens when the policy asks to route after its turn budget is spent:
#   end       the episode ends there (no answer; the format gate scores it -1)
#   forced    the route is refused, its turn dropped, a budget-exhausted message appended,
#             and one more generation must answer (trained with the rest)
#   mask      as end, and the whole trajectory is left out of the loss (response_mask 0)
#   penalize  as end, and the score is the format penalty whatever the gate says
BUDGET_MODES = ("end", "forced", "mask", "penalize")


@dataclass
class Episode:
    prompt_ids: list[int]
    max_turns: int | None = None  # this episode's turn budget T_max (None: the rules' max_turns)
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)  # 1 = policy token, 0 = environment token
    # what the reward reads: policy turns (each cut at the end of its first action) and
    # <information> blocks, not control messages
    text: str = ""
    turns: list[dict] = field(default_factory=list)
    turn: int = 0  # generations done so far
    cost_usd: float = 0.0  # the reference's: completion tokens at the output price
    billed_usd: float = 0.0  # as the APIs bill it: prompt tokens at the input price too
    route_count: int = 0
    pool_latency_s: float = 0.0
    pool_failures: int = 0
    done: bool = False
    hit_budget: bool = False  # the turn budget ran out before an answer
    truncated: bool = False  # the response token budget ran out
    forced: bool = False  # a route was refused at the budget and an answer was asked for
    branch_from: int | None = None  # forked prompt groups: where this episode left the shared trunk (response index)

    def context(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def add(self, ids: list[int], text: str, by_policy: bool) -> None:
        self.response_ids += ids
        self.response_mask += [1 if by_policy else 0] * len(ids)
        self.text += text

    def branch_mask(self) -> list[int]:
        """1 on the policy tokens of the turn generated right after the fork (the one its siblings share a prefix
        with and differ from), 0 elsewhere and everywhere when the episode was not forked."""
        mask = [0] * len(self.response_ids)
        i = len(mask) if self.branch_from is None else self.branch_from
        while i < len(mask) and self.response_mask[i] == 1:
            mask[i] = 1
            i += 1
        return mask

    def rollback(self, n_ids: int, n_chars: int) -> None:
        """Cut the response back to its first `n_ids` tokens and `n_chars` characters of text."""
        del self.response_ids[n_ids:], self.response_mask[n_ids:]
        self.text = self.text[:n_chars]


class TurnRules:
    """What a turn means: parse, append, decide whether the pool must be called."""

    def __init__(self, tokenizer, registry: ModelRegistry, max_turns: int, max_obs_length: int,
                 max_response_length: int, invalid_hint: bool = False, budget_mode: str = "end"):
        if budget_mode not in BUDGET_MODES:
            raise ValueError(f"env.budget_mode must be one of {'|'.join(BUDGET_MODES)}, got {budget_mode!r}")
        self.budget_mode = budget_mode
        self.tok = tokenizer
        self.registry = registry
        self.max_turns = max_turns
        self.max_obs_length = max_obs_length
        self.max_response_length = max_response_length
        self.invalid_hint = invalid_hint

    def is_final(self, ep: Episode) -> bool:
        """After T_max generations routing is no longer executed: the answer is due."""
        return ep.turn >= (self.max_turns if ep.max_turns is None else ep.max_turns)

    def room(self, ep: Episode) -> int:
        return self.max_response_length - len(ep.response_ids)

    def after_generation(self, ep: Episode, out_ids: list[int]) -> Action | None:
        """Append the policy's turn; return the route to execute, or None.

        The ids stay as sampled; the text is cut at the end of the first action. Backends
        keep the whole token in which a stop string ends, and byte-level BPE merges
        characters after a tag into it (`>.`, `>,`): read whole, `</answer>.` would break
        the format of a right answer.
        """
        final = self.is_final(ep)
        out_ids = out_ids[: max(0, self.room(ep))]
        decoded = self.tok.decode(out_ids, skip_special_tokens=True)
        text = truncate_at_first_action(decoded)
        action = parse_action(text, self.registry)
        before = (len(ep.response_ids), len(ep.text))  # the last valid prefix, if this turn is refused
        ep.add(out_ids, text, by_policy=True)
        ep.turn += 1
        ep.turns.append({"generated": text, "action": action.kind, "model": action.model, "query": action.query,
                         "answer": action.answer, "reason": action.reason})
        if len(decoded) > len(text):
            ep.turns[-1]["past_action"] = decoded[len(text):]  # in the ids, never read by the reward
        if action.kind == "answer":
            ep.done = True
        elif self.room(ep) <= 0:
            ep.done, ep.truncated = True, True
        elif final and action.kind == "route" and self.budget_mode == "forced" and not ep.forced:
            self._refuse(ep, *before)
        elif final:
            ep.done, ep.hit_budget = True, True
        elif action.kind == "route":
            return action
        else:
            self._append_env(ep, invalid_observation(action, self.invalid_hint, self.registry.names))
        return None

    def after_pool(self, ep: Episode, result: PoolResult) -> None:
        """Append the pool's reply (or the failure note) as an `<information>` block."""
        obs = format_observation(result.text if result.ok else None, self.max_obs_length,
                                 count_tokens=self._count, truncate=self._truncate)
        ep.route_count += 1
        ep.cost_usd += result.cost_usd
        ep.billed_usd += result.billed_usd
        ep.pool_latency_s += result.latency_s
        ep.pool_failures += int(not result.ok)
        ep.turns[-1].update({"ok": result.ok, "error": result.error, "cost_usd": result.cost_usd,
                             "billed_usd": result.billed_usd,
                             "latency_s": result.latency_s, "server_s": result.server_s, "cached": result.cached,
                             "prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
                             "cut": result.cut, "usage_capped": result.usage_capped,
                             "information": None if result.text is None else clean_text(result.text)})
        self._append_env(ep, obs)

    def _refuse(self, ep: Episode, n_ids: int, n_chars: int) -> None:
        """Forced answer: drop the refused turn, append the budget-exhausted message, generate once more."""
        ep.rollback(n_ids, n_chars)
        ep.forced = True
        ep.turns[-1]["refused"] = True
        # The message is context for the policy but not part of the trajectory the reward
        # checks: after it, the answer turn must read as if it followed the prefix directly.
        self._append_env(ep, budget_exhausted_message(), in_text=False)

    def _append_env(self, ep: Episode, text: str, in_text: bool = True) -> None:
        if not text:
            return
        ids = self.tok(text, add_special_tokens=False)["input_ids"]
        if len(ids) >= self.room(ep):  # no room left to answer after this block
            ep.done, ep.truncated = True, True
            return
        ep.add(ids, text if in_text else "", by_policy=False)

    def _count(self, text: str) -> int:
        return len(self.tok(text, add_special_tokens=False)["input_ids"])

    def _truncate(self, text: str, n: int) -> str:
        return self.tok.decode(self.tok(text, add_special_tokens=False)["input_ids"][:n], skip_special_tokens=True)
