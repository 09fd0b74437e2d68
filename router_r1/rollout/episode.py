"""One routing episode's state and the rules for one turn; no I/O, no model.

The manager (manager.py) decides when to generate and when to call the pool; this
module decides what a generated turn means and what gets appended to the context.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from router_r1.pool.client import PoolResult
from router_r1.pool.registry import ModelRegistry
from router_r1.protocol import Action, format_observation, invalid_observation, parse_action


@dataclass
class Episode:
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)  # 1 = policy token, 0 = environment token
    text: str = ""  # the response as text, exactly what was generated and appended
    turns: list[dict] = field(default_factory=list)
    turn: int = 0  # generations done so far
    cost_usd: float = 0.0
    route_count: int = 0
    pool_latency_s: float = 0.0
    pool_failures: int = 0
    done: bool = False
    hit_budget: bool = False  # the turn budget ran out before an answer
    truncated: bool = False  # the response token budget ran out

    def context(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def add(self, ids: list[int], text: str, by_policy: bool) -> None:
        self.response_ids += ids
        self.response_mask += [1 if by_policy else 0] * len(ids)
        self.text += text


class TurnRules:
    """What a turn means: parse, append, decide whether the pool must be called."""

    def __init__(self, tokenizer, registry: ModelRegistry, max_turns: int, max_obs_length: int,
                 max_response_length: int, invalid_hint: bool = False):
        self.tok = tokenizer
        self.registry = registry
        self.max_turns = max_turns
        self.max_obs_length = max_obs_length
        self.max_response_length = max_response_length
        self.invalid_hint = invalid_hint

    def is_final(self, ep: Episode) -> bool:
        """After max_turns generations routing is no longer executed: the answer is due."""
        return ep.turn >= self.max_turns

    def room(self, ep: Episode) -> int:
        return self.max_response_length - len(ep.response_ids)

    def after_generation(self, ep: Episode, out_ids: list[int]) -> Action | None:
        """Append the policy's turn; return the route to execute, or None."""
        final = self.is_final(ep)
        out_ids = out_ids[: max(0, self.room(ep))]
        text = self.tok.decode(out_ids, skip_special_tokens=True)
        action = parse_action(text, self.registry)
        ep.add(out_ids, text, by_policy=True)
        ep.turn += 1
        ep.turns.append({"generated": text, "action": action.kind, "model": action.model, "query": action.query,
                         "answer": action.answer, "reason": action.reason})
        if action.kind == "answer":
            ep.done = True
        elif self.room(ep) <= 0:
            ep.done, ep.truncated = True, True
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
        ep.pool_latency_s += result.latency_s
        ep.pool_failures += int(not result.ok)
        ep.turns[-1].update({"ok": result.ok, "error": result.error, "cost_usd": result.cost_usd,
                             "latency_s": result.latency_s, "information": result.text, "cached": result.cached})
        self._append_env(ep, obs)

    def _append_env(self, ep: Episode, text: str) -> None:
        if not text:
            return
        ids = self.tok(text, add_special_tokens=False)["input_ids"]
        if len(ids) >= self.room(ep):  # no room left to answer after this block
            ep.done, ep.truncated = True, True
            return
        ep.add(ids, text, by_policy=False)

    def _count(self, text: str) -> int:
        return len(self.tok(text, add_special_tokens=False)["input_ids"])

    def _truncate(self, text: str, n: int) -> str:
        return self.tok.decode(self.tok(text, add_special_tokens=False)["input_ids"][:n], skip_special_tokens=True)
