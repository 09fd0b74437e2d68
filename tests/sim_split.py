"""Small simulated test splits for the evaluation tests, and tiny checkpoints to evaluate on them."""
from pathlib import Path

from sim.qa import SimConfig, build_sim
from tiny import tiny_model

# A short template keeps the tiny model's prompts small; {budget} lets `direct` say "answer alone".
TEMPLATE = "Route or answer.\n{budget}Question: {question}\n"


def sim_test_split(root: Path, test_size: int, **cfg) -> Path:
    """root/test.parquet: `test_size` simulated questions prompted with TEMPLATE (written to root/template.txt)."""
    (root / "template.txt").write_text(TEMPLATE)
    build_sim(SimConfig(out_dir=root, prompt_template=root / "template.txt", train_size=1, val_size=1,
                        test_size=test_size, **cfg))
    return root / "test.parquet"


def tiny_checkpoint(path: Path, tok, seed: int = 0) -> Path:
    """`tok` and a random tiny model of its vocabulary, saved at `path`."""
    tok.save_pretrained(path)
    tiny_model(len(tok), seed=seed).save_pretrained(path)
    return path
