"""One GraMMA episode at the text level: a turn's text in, the observation text out.

No tokens and no model: the environment (env.py) and the oracle (data_process/kg_oracle.py)
drive the same Session, so oracle trajectories see exactly the observations a rollout sees.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from gramma.actions import Action, parse_action, resolve
from gramma.graph import KnowledgeGraph, norm_name
from gramma.memory import Memory
from gramma.ranking import Ranker

OBS_OPEN, OBS_CLOSE = "<information>", "</information>"
# Graph text must not be able to close the block or fake an action (same idea as for pool replies).
_NEUTRAL = {"<information>": "(information)", "</information>": "(/information)", "<action>": "(action)",
            "</action>": "(/action)", "<think>": "(think)", "</think>": "(/think)"}


def neutralise(text: str) -> str:
    for tag, safe in _NEUTRAL.items():
        text = text.replace(tag, safe)
    return text


@dataclass
class Session:
    graph: KnowledgeGraph
    ranker: Ranker
    question: str
    start: str
    max_turns: int = 6  # generations; the last one must STOP
    invalid_hint: bool = True
    memory: Memory = None
    turn: int = 0
    done: bool = False
    hit_budget: bool = False
    answer: str | None = None
    evidence: list[str] = field(default_factory=list)
    cross_checked: list[str] = field(default_factory=list)  # entity ids whose edge images were read
    log: list[dict] = field(default_factory=list)  # one record per turn

    def __post_init__(self):
        if self.start not in self.graph.entities:
            raise ValueError(f"start entity {self.start!r} is not in the graph {self.graph.source}")
        self.memory = Memory(self.start)

    @property
    def well_formed(self) -> bool:
        return all(t["well_formed"] for t in self.log)

    def begin(self) -> str:
        """The first observation: the start entity's ranked neighbourhood (no turn is spent on it)."""
        return f"{OBS_OPEN}{neutralise(self._expand(self.start))}{OBS_CLOSE}"

    def step(self, text: str) -> str:
        """Apply one generated turn; the observation to append ("" when the episode ended)."""
        if self.done:
            raise RuntimeError("step() after the episode ended")
        self.turn += 1
        action = parse_action(text)
        last = self.turn >= self.max_turns
        body = self._apply(action) if action.kind != "stop" else ""
        self.log.append({"kind": action.kind, "arg": action.arg, "reason": action.reason,
                         "well_formed": action.well_formed})
        if action.kind == "stop":
            self.done, self.answer, self.evidence = True, self._answer_text(action.answer), action.evidence
            return ""
        if last:
            self.done, self.hit_budget = True, True
            return ""
        if self.turn == self.max_turns - 1:
            body += "\nLast turn: STOP now."
        return f"{OBS_OPEN}{neutralise(body)}{OBS_CLOSE}"

    # ------------------------------------------------------------------ actions
    def _apply(self, a: Action) -> str:
        if a.kind == "invalid":
            return self._invalid(a)
        target, why = resolve(a.arg, self.memory.candidates, self.memory.known, self.graph)
        if target is None:
            a.kind, a.reason = "invalid", why
            return self._invalid(a)
        if a.kind == "expand":
            return self._expand(target)
        if a.kind == "focus":
            e = self.graph.entities[target]
            self.memory.focused.append(target)
            alias = f" Also called {', '.join(e.aliases)}." if e.aliases else ""
            return f"{e.name} ({e.type}): {e.details}{alias}"
        return self._cross_modal(target, a)

    def _answer_text(self, answer: str) -> str:
        """A STOP answer that is a candidate number ("[2]") means that candidate's name; text stays text."""
        m = re.fullmatch(r"\[\s*(\d+)\s*\]", answer.strip())
        if m and 1 <= int(m.group(1)) <= len(self.memory.candidates):
            return self.graph.name(self.memory.candidates[int(m.group(1)) - 1])
        return answer

    def _invalid(self, a: Action) -> str:
        return f"Invalid action: {a.reason}." if self.invalid_hint else "Invalid action."

    def _expand(self, node: str) -> str:
        g = self.graph
        self.memory.move(g, node)
        ranked = self.ranker.rank(node, self.question, self.memory.visited)[: self.ranker.cfg.top_k]
        self.memory.see([c.entity for c in ranked])
        lines = [f"At {g.name(node)} ({g.entities[node].type}). Neighbours:"]
        for i, c in enumerate(ranked, 1):
            rels = ", ".join(e.arrow() for e in c.edges)
            images = sum(len(e.triple.images) for e in c.edges)
            pics = f" [{images} image{'s' if images > 1 else ''}]" if images else ""
            lines.append(f"[{i}] {g.name(c.entity)} ({g.entities[c.entity].type}) {rels}{pics}")
        if not ranked:
            lines.append("(none)")
        return "\n".join(lines)

    def _cross_modal(self, other: str, a: Action) -> str:
        g, here = self.graph, self.memory.current
        edges = [e for e in g.edges_between(here, other) if e.triple.images]
        if not edges:
            a.kind = "invalid"
            a.reason = (f"no edge between {g.name(here)} and {g.name(other)}" if not g.edges_between(here, other)
                        else f"no images on the edges between {g.name(here)} and {g.name(other)}")
            return self._invalid(a)
        self.memory.add_visual(g, edges)
        self.cross_checked.append(other)
        lines = []
        for e in edges:
            for img in e.triple.images:
                lines.append(f"{g.name(here)} {e.arrow()} {g.name(other)}: {img.text()}")
        return "\n".join(lines)

    # ------------------------------------------------------------------ evidence
    def evidence_ok(self, visual_attr: str = "") -> bool:
        """The evidence names a connected path from the start to an entity named like the answer;
        for a visual question the last edge carries an image with the attribute, and it was read."""
        if self.answer is None or not self.evidence:
            return False
        g = self.graph
        layers = [g.lookup(n) for n in self.evidence]
        if not all(layers) or self.start not in layers[0]:
            return False
        reach = {self.start}
        prev_of: dict[str, set[str]] = {}
        for layer in layers[1:]:
            nxt = {b for b in layer if any(g.edges_between(a, b) for a in reach)}
            for b in nxt:
                prev_of[b] = {a for a in reach if g.edges_between(a, b)}
            reach = nxt
            if not reach:
                return False
        ends = [b for b in reach if norm_name(self.answer) in {norm_name(x) for x in
                                                                [g.name(b), *g.entities[b].aliases]}]
        if not ends:
            return False
        if not visual_attr:
            return True
        for b in ends:
            for a in prev_of.get(b, set()):
                shown = any(visual_attr in img.attributes for e in g.edges_between(a, b) for img in e.triple.images)
                if shown and b in self.cross_checked:
                    return True
        return False
