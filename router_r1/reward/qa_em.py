"""Answer extraction, SQuAD-style normalisation, exact match and token F1."""
from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)
_SPECIAL = ("yes", "no", "noanswer")  # F1 gives no partial credit when these differ


def normalize_answer(s: str) -> str:
    """Lower case, drop punctuation and the articles a/an/the, collapse whitespace."""
    s = s.lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def extract_answer(response: str) -> str | None:
    """The stripped content of the last <answer> block, or None if there is none."""
    found = _ANSWER.findall(response)
    return found[-1].strip() if found else None


def _golds(golds: str | Iterable[str]) -> list[str]:
    # Parquet rows give numpy arrays, hand-written ones a bare string; accept both.
    golds = [golds] if isinstance(golds, str) else [str(g) for g in golds]
    if not golds:
        raise ValueError("no gold answers given")
    return golds


def em_score(pred: str | None, golds: str | Iterable[str]) -> float:
    """1.0 if the normalised prediction equals any normalised gold answer, else 0.0."""
    golds = _golds(golds)
    if pred is None:
        return 0.0
    p = normalize_answer(pred)
    return float(any(p == normalize_answer(g) for g in golds))


def _f1(pred: str, gold: str) -> float:
    p, g = normalize_answer(pred), normalize_answer(gold)
    if (p in _SPECIAL or g in _SPECIAL) and p != g:
        return 0.0
    common = sum((Counter(p.split()) & Counter(g.split())).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p.split()), common / len(g.split())
    return 2 * precision * recall / (precision + recall)


def f1_score(pred: str | None, golds: str | Iterable[str]) -> float:
    """Token-level F1 after normalisation, maximised over the gold answers."""
    golds = _golds(golds)
    if pred is None:
        return 0.0
    return max(_f1(pred, g) for g in golds)
