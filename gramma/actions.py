"""GraMMA's action format: parse a generated turn, resolve its target entity safely.

One turn is an optional thought and exactly one action, nothing else:

    <think>free text</think><action>EXPAND(3)</action>
    <action>FOCUS(Lyon)</action>
    <action>CROSS_MODAL(2)</action>
    <action>STOP(Paris | Ana Kor > Lyon > Paris)</action>

EXPAND/FOCUS/CROSS_MODAL take one target: the number of a candidate in the latest
neighbour list ("3" or "[3]") or an entity name/alias (case-insensitive) among the
entities the episode has seen. STOP takes the answer, then optionally "|" and the
evidence path, entity names joined by ">"; an answer written as "[k]" (brackets required)
means the name of candidate k of the latest list, so a small policy can point instead of copy. A target that is unknown, out of view or
ambiguous gives an invalid action with a reason, never an exception.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from gramma.graph import KnowledgeGraph

VERBS = ("EXPAND", "FOCUS", "CROSS_MODAL", "STOP")
STOP_STRING = "</action>"  # generation of a turn ends here
_TURN = re.compile(r"^\s*(?:<think>(?P<think>.*?)</think>)?\s*<action>(?P<body>.*?)</action>\s*$", re.DOTALL)
_CALL = re.compile(r"^\s*(?P<verb>[A-Za-z_]+)\s*\((?P<arg>.*)\)\s*$", re.DOTALL)
_NUMBER = re.compile(r"^\[?\s*(\d+)\s*\]?$")


@dataclass
class Action:
    kind: str  # expand | focus | cross_modal | stop | invalid
    arg: str = ""
    answer: str | None = None
    evidence: list[str] = field(default_factory=list)
    reason: str = ""  # why it is invalid
    well_formed: bool = True  # the turn has the right syntax (the format gate)


def render(verb: str, arg: str, think: str | None = None) -> str:
    """The text of one turn (what the oracle writes)."""
    if verb not in VERBS:
        raise ValueError(f"unknown verb {verb!r}; expected one of {VERBS}")
    head = f"<think>{think}</think>" if think else ""
    return f"{head}<action>{verb}({arg})</action>"


def render_stop(answer: str, evidence: list[str] | None = None, think: str | None = None) -> str:
    arg = answer + (" | " + " > ".join(evidence) if evidence else "")
    return render("STOP", arg, think)


def parse_action(text: str) -> Action:
    """Parse one generated turn; a malformed turn is an invalid, not well-formed Action."""
    m = _TURN.match(text)
    if not m:
        why = "no complete action block" if "</action>" not in text else "text outside the think and action blocks"
        return Action("invalid", reason=why, well_formed=False)
    call = _CALL.match(m.group("body"))
    if not call:
        return Action("invalid", reason="the action must look like VERB(argument)", well_formed=False)
    verb, arg = call.group("verb").upper(), call.group("arg").strip()
    if verb not in VERBS:
        return Action("invalid", reason=f"unknown action {verb}; use {', '.join(VERBS)}", well_formed=False)
    if not arg:
        return Action("invalid", reason=f"{verb} needs an argument", well_formed=False)
    if verb != "STOP":
        return Action(verb.lower(), arg=arg)
    answer, sep, evidence = arg.rpartition("|")
    if not sep:
        answer, evidence = arg, ""
    answer = answer.strip()
    if not answer:
        return Action("invalid", reason="STOP needs an answer", well_formed=False)
    path = [p.strip() for p in evidence.split(">") if p.strip()]
    return Action("stop", arg=arg, answer=answer, evidence=path)


def resolve(ref: str, candidates: list[str], known: set[str], graph: KnowledgeGraph) -> tuple[str | None, str]:
    """(entity id, "") or (None, reason). Numbers index `candidates` (1-based); names must be in `known`."""
    m = _NUMBER.match(ref.strip())
    if m:
        k = int(m.group(1))
        if 1 <= k <= len(candidates):
            return candidates[k - 1], ""
        span = f"1-{len(candidates)}" if candidates else "none listed yet"
        return None, f"no candidate [{k}] in the latest list ({span})"
    ids = graph.lookup(ref)
    if not ids:
        return None, f"unknown entity {ref!r}"
    seen = [i for i in ids if i in known]
    if not seen:
        return None, f"{ref!r} is not in view yet; expand a neighbour first"
    if len(seen) > 1:
        return None, f"{ref!r} is ambiguous ({len(seen)} entities); use its number"
    return seen[0], ""
