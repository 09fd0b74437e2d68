"""Answer extraction, SQuAD-style normalisation, exact match and token F1."""
from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable

_OPEN, _CLOSE = "<answer>", "</answer>"
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)
_SPECIAL = ("yes", "no", "noanswer")  # F1 gives no partial credit when these differ


def normalize_answer(s: str) -> str:
    """Lower case, drop punctuation and the articles a/an/the, collapse whitespace."""
    s = s.lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def extract_answer(response: str) -> str | None:
    """The stripped content of the last <answer> block, or None if there is none.

    Blocks as `re.findall(r"<answer>(.*?)</answer>", DOTALL)` finds them (leftmost, lazy,
    not overlapping), but in one pass: that regex is quadratic in the number of unclosed
    <answer> tags (8,000 took 3.9 s).
    """
    last, pos = None, 0
    while (start := response.find(_OPEN, pos)) >= 0:
        end = response.find(_CLOSE, start + len(_OPEN))
        if end < 0:
            break
        last, pos = response[start + len(_OPEN):end], end + len(_CLOSE)
    return None if last is None else last.strip()


def usable_golds(golds) -> list[str]:
    """The golds an answer can match: strings (numbers as text), without None or golds that normalise to "".

    Parquet rows give numpy arrays, hand-written ones a bare string; accept both. A gold
    like "The", "?!" or "" normalises to nothing and would give EM 1 to an empty answer,
    so it is dropped. Data loading rejects such rows (router_r1/row_check.py);
    here such a row is scored as wrong rather than crashing a run.
    """
    if golds is None:
        return []
    golds = [golds] if isinstance(golds, str) else [str(g) for g in golds if g is not None]
    return [g for g in golds if normalize_answer(g)]



def em_score(pred: str | None, golds: str | Iterable[str]) -> float:
    """1.0 if the normalised prediction equals any normalised gold answer, else 0.0 (also with no usable gold)."""
    golds = usable_golds(golds)
    if pred is None or not golds:
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
    """Token-level F1 after normalisation, maximised over the gold answers (0.0 with no usable gold)."""
    golds = usable_golds(golds)
    if pred is None or not golds:
        return 0.0
    return max(_f1(pred, g) for g in golds)
