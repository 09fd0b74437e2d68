"""gramma.graph_eval on a real (random, tiny) HF checkpoint; its records feed the experience bank."""
from pathlib import Path

import pandas as pd

from data_process.kg_synth import question_row, questions_for
from gramma.graph_env import GraphEnvConfig
from gramma.graph_eval import evaluate
from gramma.experience import TAXONOMY, bank_from_records
from gramma.graph import KnowledgeGraph
from tiny import tiny_model, tiny_tokenizer

KG = Path(__file__).resolve().parent / "data" / "kg"


def test_evaluate_a_checkpoint_and_diagnose_its_failures(tmp_path):
    g = KnowledgeGraph.load(KG)
    persons = sorted(e for e in g.entities if g.entities[e].type == "person")[:2]
    rows = [question_row(g, q, "val", i) for i, q in enumerate(q for p in persons for q in questions_for(g, p))]
    pd.DataFrame(rows).to_parquet(tmp_path / "val.parquet")
    tok = tiny_tokenizer()
    model = tiny_model(len(tok), hidden=32, layers=1, heads=2, max_position_embeddings=4096)
    model.save_pretrained(tmp_path / "ckpt")
    tok.save_pretrained(tmp_path / "ckpt")
    cfg = GraphEnvConfig(graph_dir=str(KG), max_turns=2, response_length=8, max_response_length=2048,
                         max_obs_tokens=1000)
    summary, records = evaluate(str(tmp_path / "ckpt"), cfg, str(tmp_path / "val.parquet"), batch_size=3)
    assert summary["n"] == len(rows) == len(records)
    assert set(summary["per_kind_em"]) == {r["data_source"] for r in rows}
    assert 0.0 <= summary["em"] <= 1.0 and summary["turns"] <= 2
    assert {r["uid"] for r in records} == {r["extra_info"]["uid"] for r in rows}
    bank = bank_from_records(records)  # a random policy fails: every record gets a class
    assert sum(bank.kinds.values()) == sum(r["em"] < 1 or not r["evidence_ok"] for r in records)
    assert set(bank.kinds) <= set(TAXONOMY)
