"""Exploration memory of one episode, its subgraph summary, and context compression.

The memory records moves with the true direction of the edge that was followed (a move
from A to B along B -r-> A is "A <-r- B", not "A -r-> B"), the edges seen between
visited nodes (evidence), and what CROSS_MODAL showed (visual findings). Its summary is
short text that replaces old turns when the context outgrows its budget.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gramma.graph import Edge, KnowledgeGraph


@dataclass
class Memory:
    start: str  # entity id where the episode begins
    current: str = ""
    visited: list[str] = field(default_factory=list)  # expanded nodes, in order
    moves: list[str] = field(default_factory=list)  # "A -r-> B" / "A <-r- B" per move
    evidence: list[tuple[str, str, str]] = field(default_factory=list)  # (head, relation, tail) as in the graph
    visual: list[str] = field(default_factory=list)  # "B: red hat (A -friend_of-> B)"
    focused: list[str] = field(default_factory=list)
    known: set[str] = field(default_factory=set)  # entities the policy may name
    candidates: list[str] = field(default_factory=list)  # the latest numbered list, 1-based

    def __post_init__(self):
        self.current = self.current or self.start
        self.known.add(self.start)

    def move(self, graph: KnowledgeGraph, target: str) -> None:
        """Go to `target` (EXPAND); record the linking edges with their true direction."""
        if target != self.current:
            links = graph.edges_between(self.current, target)
            if links:
                self.moves.append(" / ".join(_arrow(graph, e) for e in links))
                self._add_evidence(links)
            else:  # a jump to an entity seen earlier, not a neighbour
                self.moves.append(f"{graph.name(self.current)} ... {graph.name(target)}")
        self.current = target
        if target not in self.visited:
            self.visited.append(target)

    def see(self, ids: list[str]) -> None:
        """A new numbered list was shown: these ids are the current candidates and become known."""
        self.candidates = list(ids)
        self.known.update(ids)

    def add_visual(self, graph: KnowledgeGraph, edges: list[Edge]) -> None:
        self._add_evidence(edges)
        for e in edges:
            for img in e.triple.images:
                self.visual.append(f"{graph.name(e.other)}: {', '.join(img.attributes) or img.caption} "
                                   f"({_arrow(graph, e)})")

    def _add_evidence(self, edges: list[Edge]) -> None:
        for e in edges:
            t = (e.triple.head, e.triple.relation, e.triple.tail)
            if t not in self.evidence:
                self.evidence.append(t)

    def summary(self, graph: KnowledgeGraph) -> str:
        """Short text of what the episode found so far."""
        lines = [f"At {graph.name(self.current)}; visited {', '.join(graph.name(v) for v in self.visited) or 'nothing'}."]
        if self.moves:
            lines.append("Path: " + "; ".join(self.moves) + ".")
        if self.visual:
            lines.append("Seen in images: " + "; ".join(self.visual) + ".")
        if self.focused:
            lines.append("Read details of " + ", ".join(graph.name(f) for f in self.focused) + ".")
        return " ".join(lines)


def _arrow(graph: KnowledgeGraph, e: Edge) -> str:
    a, b = graph.name(e.node), graph.name(e.other)
    return f"{a} -{e.relation}-> {b}" if e.outgoing else f"{a} <-{e.relation}- {b}"


def compress(prompt: list[int], summary: list[int], turns: list[list[int]], budget: int) -> tuple[list[int], int]:
    """Context within `budget` tokens: the whole prompt (it holds the question), the summary
    block, then the newest turns that fit. Returns (context ids, turns dropped).

    The caller caps the summary (see GraphEnv.summary_ids); prompt and summary are never cut.
    """
    room = budget - len(prompt) - len(summary)
    if room < 0:
        raise ValueError(f"context budget {budget} is below prompt ({len(prompt)}) + summary ({len(summary)}) tokens")
    kept: list[list[int]] = []
    for t in reversed(turns):
        if len(t) > room:
            break
        kept.append(t)
        room -= len(t)
    kept.reverse()
    return prompt + summary + [i for t in kept for i in t], len(turns) - len(kept)
