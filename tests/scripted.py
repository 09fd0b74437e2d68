"""A scripted policy for the routing environment's tests: each turn is written by a function of the
prompt's question and the context so far."""
from verl.workers.rollout.base import GenOutput


def scripted(tok, questions, turn):
    """A batch generate for the env: each prompt's question (the one whose "Question: ..." it holds)
    and decoded context go to turn(question, context), whose text is the policy's next turn."""
    def generate(prompts, sampling):
        outs = []
        for ids in prompts:
            context = tok.decode(ids)
            q = next(q for q in questions if f"Question: {q.question}" in context)
            outs.append(GenOutput(tok(turn(q, context), add_special_tokens=False)["input_ids"], "stop"))
        return outs
    return generate
