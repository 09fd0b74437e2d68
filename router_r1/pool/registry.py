"""Pool registry: the explicit list of models the router may call, loaded from yaml.

A pool file holds `models` (one entry each), `defaults` (their shared fields) and, for a simulated
pool, `world`: the importable name of the world whose experts answer for it (`world: sim` in
configs/pool/sim*.yaml; router_r1/pool/world.py loads it). Any other top-level key is an error.
Name resolution is exact up to case, spaces, hyphens, underscores and dots, plus declared aliases.
There is no substring guessing: an unknown name resolves to None and the caller turns it into an
invalid action (the reference crashed with KeyError).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

_FIELDS = {
    "name", "aliases", "api_id", "base_url", "api_key_env", "price_out_per_m",
    "price_in_per_m", "temperature", "max_tokens", "descriptor", "sim", "unseen", "card", "topics",
}
_REQUIRED = ("name", "api_id", "price_out_per_m")
_TOP_KEYS = {"defaults", "models", "world"}
_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def normalize_name(name: str) -> str:
    """Key used for lookups: lower case, without spaces, hyphens, underscores, dots."""
    return re.sub(r"[\s\-_.]+", "", name.strip().lower())


@dataclass(frozen=True)
class ModelSpec:
    """One pool model. Prices are USD per 1M tokens."""

    name: str
    api_id: str
    price_out_per_m: float
    base_url: str = "http://127.0.0.1:8000/v1"
    api_key_env: str | None = None
    price_in_per_m: float = 0.0
    temperature: float = 0.0
    max_tokens: int = 512
    descriptor: str = ""
    card: str = ""  # one line of model card (family, size, what it is tuned for, context length): the card listing's text
    topics: str = ""  # what the domain listing says it is good at ("science, business"); a simulated pool derives it from `sim:`
    aliases: tuple[str, ...] = ()
    unseen: bool = False  # held out of training (the paper's generalisation test)
    sim: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)  # its `sim:` block: read by the pool's world only

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        """USD of one call as an API bills it: prompt tokens at the input price, completion tokens at the output's."""
        return (completion_tokens * self.price_out_per_m + prompt_tokens * self.price_in_per_m) / 1e6

    def output_cost(self, completion_tokens: int) -> float:
        """USD of one call as the reference Router-R1 counts it: completion tokens at the output price only."""
        return completion_tokens * self.price_out_per_m / 1e6

    def api_key(self) -> str:
        """The key from the environment; never stored on the object or logged."""
        if self.api_key_env:
            return os.environ.get(self.api_key_env, "EMPTY")
        return "EMPTY"


class RegistryError(ValueError):
    """A pool yaml that cannot be used; the message names the file and the field."""


class ModelRegistry:
    """Canonical name -> ModelSpec, with alias-aware, normalised lookup."""

    def __init__(self, models: list[ModelSpec], source: str = "<memory>", world: str | None = None):
        self.source = source
        self.world = world  # the simulated world answering for this pool (a module name), None for a real pool
        self.models: dict[str, ModelSpec] = {}
        self._lookup: dict[str, str] = {}
        for m in models:
            for key in (m.name, *m.aliases):
                if ":" in key:  # the route syntax splits "Model: question" on the first colon
                    raise RegistryError(f"{source}: model name or alias {key!r} contains a colon")
                k = normalize_name(key)
                if k in self._lookup and self._lookup[k] != m.name:
                    raise RegistryError(f"{source}: name {key!r} of {m.name!r} collides with {self._lookup[k]!r}")
                self._lookup[k] = m.name
            if m.name in self.models:
                raise RegistryError(f"{source}: model {m.name!r} listed twice")
            self.models[m.name] = m

    @classmethod
    def from_yaml(cls, path: str | os.PathLike, base_url: str | None = None) -> "ModelRegistry":
        """Load `path`; `base_url` (if given) overrides every entry's endpoint."""
        path = Path(path)
        if not path.is_file():
            raise RegistryError(f"{path}: pool file not found")
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise RegistryError(f"{path}: not valid yaml: {e}") from e
        return cls.from_dict(doc, source=str(path), base_url=base_url)

    @classmethod
    def from_dict(cls, doc: dict, source: str = "<dict>", base_url: str | None = None) -> "ModelRegistry":
        """Build from the parsed yaml: {defaults: {...}, models: [{...}, ...], world: NAME (optional)}."""
        if not isinstance(doc, dict) or not isinstance(doc.get("models"), list) or not doc["models"]:
            raise RegistryError(f"{source}: expected a mapping with a non-empty 'models' list")
        bad = set(doc) - _TOP_KEYS
        if bad:
            raise RegistryError(f"{source}: unknown top-level key(s) {sorted(bad)} (known: {sorted(_TOP_KEYS)})")
        world = doc.get("world")
        if world is not None and not (isinstance(world, str) and _MODULE_NAME.fullmatch(world)):
            raise RegistryError(f"{source}: world must be a module name (e.g. sim), got {world!r}")
        defaults = doc.get("defaults") or {}
        bad = set(defaults) - _FIELDS
        if bad:
            raise RegistryError(f"{source}: unknown key(s) in defaults: {sorted(bad)}")
        models = []
        for i, entry in enumerate(doc["models"]):
            where = f"{source}: models[{i}]"
            if not isinstance(entry, dict):
                raise RegistryError(f"{where}: expected a mapping")
            bad = set(entry) - _FIELDS
            if bad:
                raise RegistryError(f"{where}: unknown key(s) {sorted(bad)}")
            merged = {**defaults, **entry}
            for key in _REQUIRED:
                if merged.get(key) in (None, ""):
                    raise RegistryError(f"{where}: missing required field {key!r}")
            try:
                price_out = float(merged["price_out_per_m"])
                price_in = float(merged.get("price_in_per_m") or 0.0)
            except (TypeError, ValueError) as e:
                raise RegistryError(f"{where} ({merged['name']}): price is not a number") from e
            if price_out < 0 or price_in < 0:
                raise RegistryError(f"{where} ({merged['name']}): negative price")
            for key in ("card", "topics"):  # a listing shows each model on one line
                text = merged.get(key) or ""
                if not isinstance(text, str) or "\n" in text.strip():
                    raise RegistryError(f"{where} ({merged['name']}): {key} must be one line of text, got {text!r}")
            models.append(ModelSpec(
                name=str(merged["name"]),
                api_id=str(merged["api_id"]),
                price_out_per_m=price_out,
                price_in_per_m=price_in,
                base_url=base_url or str(merged.get("base_url") or ModelSpec.base_url),
                api_key_env=merged.get("api_key_env"),
                temperature=float(merged.get("temperature", 0.0)),
                max_tokens=int(merged.get("max_tokens", 512)),
                descriptor=str(merged.get("descriptor", "")).strip(),
                card=(merged.get("card") or "").strip(),
                topics=(merged.get("topics") or "").strip(),
                aliases=tuple(str(a) for a in merged.get("aliases") or ()),
                sim=dict(merged.get("sim") or {}),
                unseen=bool(merged.get("unseen", False)),
            ))
        return cls(models, source=source, world=world)

    def resolve(self, name: str | None) -> ModelSpec | None:
        """The spec for a policy-written name, or None if it names no pool model."""
        if not name or not name.strip():
            return None
        canonical = self._lookup.get(normalize_name(name))
        return self.models[canonical] if canonical else None

    def __getitem__(self, name: str) -> ModelSpec:
        spec = self.resolve(name)
        if spec is None:
            raise KeyError(f"{name!r} is not in pool {self.source} (known: {', '.join(self.names)})")
        return spec

    def __contains__(self, name: str) -> bool:
        return self.resolve(name) is not None

    def __len__(self) -> int:
        return len(self.models)

    @property
    def names(self) -> list[str]:
        return list(self.models)

    def seen(self) -> "ModelRegistry":
        """The registry without the models marked `unseen`."""
        return self.subset([m.name for m in self.models.values() if not m.unseen])

    def subset(self, names: list[str]) -> "ModelRegistry":
        """A registry holding only `names` (e.g. the six seen models without the unseen two)."""
        return ModelRegistry([self[n] for n in names], source=f"{self.source}[subset]", world=self.world)
