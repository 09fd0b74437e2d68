"""How a prompt lists the pool's models: one template placeholder per listing style, filled from the pool in use.

A template keeps its placeholder (the warm start writes it so, and every checkpoint carries that template), so
training, evaluation, infer.py and the server each list the pool they call, not the one the template was written
for. Styles:

- `descriptors`, {pool}: "- Name ($0.30 per 1M output tokens): <descriptor>" (the default template's);
- `domains`, {pool_domains}: "Name $0.30: science, business", what the model is good at from its `topics` field,
  else from its simulated world's profile (the embedded default's compact listing);
- `card`, {pool_card}: "Name $0.10 in $0.30 out: <card>", its prices per 1M input and output tokens and its one
  line of model card (family, size, what it is tuned for, context length), no domains: a listing as users have it.
"""
from __future__ import annotations

from router_r1.pool.registry import ModelRegistry, ModelSpec, RegistryError
from router_r1.pool.world import load_world

LISTINGS = {"descriptors": "pool", "domains": "pool_domains", "card": "pool_card"}  # style -> its placeholder
STYLES = tuple(LISTINGS)


def price(usd: float) -> str:
    """Two decimals unless that would hide a digit (0.035 stays 0.035)."""
    return f"{usd:.2f}" if round(usd, 2) == usd else f"{usd:g}"


def priced_name(spec: ModelSpec) -> str:
    """A model's name and output price as the domain listing shows them: "Qwen2.5-7B-Instruct $0.30"."""
    return f"{spec.name} ${spec.price_out_per_m:.2f}"


def domains_line(spec: ModelSpec, topics: str) -> str:
    """One domain-listing line: "Qwen2.5-7B-Instruct $0.30: science, business" (the name and price alone without
    topics)."""
    return f"{priced_name(spec)}: {topics}" if topics else priced_name(spec)


def card_line(spec: ModelSpec) -> str:
    """One card-listing line: "Qwen2.5-7B-Instruct $0.00 in $0.30 out: Alibaba Qwen2.5, 7.6B parameters, ..."."""
    line = f"{spec.name} ${price(spec.price_in_per_m)} in ${price(spec.price_out_per_m)} out"
    return f"{line}: {spec.card}" if spec.card else line


def descriptor_line(spec: ModelSpec) -> str:
    """One line of the default template's listing: name, output price, descriptor."""
    line = f"- {spec.name} (${price(spec.price_out_per_m)} per 1M output tokens)"
    return f"{line}: {spec.descriptor}" if spec.descriptor else line


def world_topics(registry: ModelRegistry) -> dict[str, str]:
    """Each model's topics as its simulated world words them (the world's `listing_topics`); {} for a pool without a
    world, or a world that words none."""
    if registry.world is None:
        return {}
    words = getattr(load_world(registry.world, registry.source), "listing_topics", None)
    if words is None:
        return {}
    try:
        return {s.name: words(s) for s in registry.models.values() if not s.topics}
    except ValueError as e:  # a model without the profile its world reads
        raise RegistryError(f"{registry.source}: the domain listing cannot word a model's topics: {e}") from None


def render(style: str, registry: ModelRegistry) -> str:
    """The pool's listing in `style`, one line per model in registry order."""
    specs = list(registry.models.values())
    if style == "descriptors":
        return "\n".join(descriptor_line(s) for s in specs)
    if style == "domains":
        derived = world_topics(registry)
        return "\n".join(domains_line(s, s.topics or derived.get(s.name, "")) for s in specs)
    if style == "card":
        return "\n".join(card_line(s) for s in specs)
    raise ValueError(f"listing style must be one of {', '.join(STYLES)}, got {style!r}")


def styles_in(template: str) -> list[str]:
    """The listing styles whose placeholder `template` keeps (none: its models are written into it)."""
    return [style for style, key in LISTINGS.items() if "{" + key + "}" in template]
