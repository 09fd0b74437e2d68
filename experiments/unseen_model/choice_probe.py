"""Teacher-forced first route of an SFT router on its own SFT rows: after the prompt and "<think>A D fact. Ask ",
is the next token the oracle's model (right) or at least a name the row lists (listed)? Varied and own listings apart.

    python docs/results/unseen_model/choice_probe.py outputs/unseen/varied2/sft outputs/unseen/varied2/oracle/oracle.parquet 400
"""
import re, sys, collections
import pandas as pd, torch
from transformers import AutoTokenizer, AutoModelForCausalLM
ck, data = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(ck); model = AutoModelForCausalLM.from_pretrained(ck).eval()
df = pd.read_parquet(data)
n = int(sys.argv[3]) if len(sys.argv) > 3 else 300
ok = collections.Counter(); tot = collections.Counter(); posok = collections.Counter()
for _, r in df.head(n).iterrows():
    m = re.match(r"<think>A (\w+) fact\. Ask (\S+)\.", r.response_text)
    if not m: continue
    kind = "varied" if r.listing else "canon"
    prompt = tok.apply_chat_template(list(r.prompt), add_generation_prompt=True, tokenize=False)
    ids = tok(prompt + f"<think>A {m.group(1)} fact. Ask ", add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad(): logits = model(ids).logits[0, -1]
    got = tok.decode([int(logits.argmax())]).strip()
    tot[kind] += 1; ok[kind] += got == m.group(2)
    # is the pick at least a listed name?
    names = re.findall(r"^(\S+) \$", r.prompt[-1]["content"], re.M)
    posok[kind] += got in names
for k in tot: print(k, tot[k], "right", ok[k] / tot[k], "a listed name", posok[k] / tot[k])
