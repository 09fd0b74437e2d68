"""The GraMMA prompt: short instructions, the question, the start entity, optional advice."""
from __future__ import annotations

INSTRUCTIONS = """Answer the question by exploring a knowledge graph, starting at the given entity.
Each turn: <think>short reasoning</think> then one action:
<action>EXPAND(x)</action> go to x and list its neighbours
<action>FOCUS(x)</action> read the details of x
<action>CROSS_MODAL(x)</action> read the images on the edges between here and x
<action>STOP(answer | A > B > C)</action> answer, with the entity path as evidence
x is a number from the last list or an entity name."""


def build_messages(question: str, start_name: str, advice: list[str] | None = None) -> list[dict[str, str]]:
    """Chat messages for one question; `advice` lines (experience bank) go after the instructions."""
    messages = [{"role": "system", "content": INSTRUCTIONS},
                {"role": "user", "content": f"Question: {question}\nStart: {start_name}"}]
    return with_advice(messages, advice or [])


def with_advice(messages: list[dict], advice: list[str]) -> list[dict]:
    """The prompt messages with advice lines appended to the system instructions."""
    if not advice:
        return messages
    if not messages or messages[0].get("role") != "system" or not messages[0]["content"].startswith(INSTRUCTIONS):
        raise ValueError("with_advice: the first message must be the GraMMA system instructions")
    extra = "\nAdvice from earlier mistakes:\n" + "\n".join(f"- {a}" for a in advice)
    return [{"role": "system", "content": messages[0]["content"] + extra}, *messages[1:]]
