"""Evaluation warns when the data's prompts list models that the evaluation pool does not have."""
from pathlib import Path

import yaml
from tiny import tiny_tokenizer

from sim.qa import SimConfig, build_sim
from router_r1.eval.evaluate import EvalConfig, Policy, evaluate, load_rows, prompt_pool_mismatch
from router_r1.pool.registry import ModelRegistry
from verl.workers.rollout.base import GenOutput

SIM = Path(__file__).resolve().parents[1] / "configs" / "pool" / "sim.yaml"


def _answer_at_once(tok):
    def generate(prompts, sampling):
        return [GenOutput(tok("<think>x</think><answer>Paris</answer>", add_special_tokens=False)["input_ids"], "stop")
                for _ in prompts]
    return generate


def test_a_pool_other_than_the_data_s_is_warned_about(tmp_path):
    build_sim(SimConfig(out_dir=tmp_path / "data", train_size=1, val_size=1, test_size=2))  # prompts list sim.yaml
    test_file = tmp_path / "data" / "test.parquet"
    doc = yaml.safe_load(SIM.read_text())
    doc["models"] = doc["models"][:2]
    two = tmp_path / "two.yaml"
    two.write_text(yaml.safe_dump(doc))
    kept = [m["name"] for m in doc["models"]]
    gone = [n for n in ModelRegistry.from_yaml(SIM).seen().names if n not in kept]

    tok = tiny_tokenizer()
    for pool, warned in ((two, True), (SIM, False)):
        logged = []
        cfg = EvalConfig(data=[str(test_file)], pool=str(pool), sim=True, checkpoints=["c"],
                         out=str(tmp_path / pool.stem), response_length=16, max_response_length=64)
        evaluate(cfg, load=lambda c: Policy(tok, _answer_at_once(tok)), log=logged.append)
        warnings = [m for m in logged if m.startswith("WARNING: the data was built for another pool")]
        assert bool(warnings) == warned, logged
        if warned:
            assert all(n in warnings[0] for n in gone) and not any(f"list {n}" in warnings[0] for n in kept)
            assert f"{test_file} row 0" in warnings[0]

    rows = load_rows([test_file])
    bigger = ModelRegistry.from_yaml(SIM)  # the unseen models too: offered, but no prompt lists them
    assert "appear in no prompt" in prompt_pool_mismatch(rows, bigger)


SIX = ["Orca-Mini-3B", "Falcon-40B", "Vicuna-13B", "Dolly-12B", "Koala-13B", "Alpaca-7B"]
OWN = "You route. Models:\n" + "\n".join(f"{n} $0.{i + 1}0: everything" for i, n in enumerate(SIX)) + \
    "\n{budget}Question: {question}\n"


def test_a_template_listing_models_the_pool_lacks_warns(tmp_path):
    """Not only the default template's '- Name ($x per 1M output tokens)' lines: any 'name, then $price' line."""
    template = tmp_path / "own.txt"
    template.write_text(OWN)
    build_sim(SimConfig(out_dir=tmp_path / "data", train_size=1, val_size=1, test_size=2, prompt_template=template))
    rows = load_rows([tmp_path / "data" / "test.parquet"])
    warning = prompt_pool_mismatch(rows, ModelRegistry.from_yaml(SIM).seen())
    assert warning and all(n in warning for n in SIX), warning
    assert "appear in no prompt" in warning  # and the pool's own models are listed nowhere


def test_rows_not_built_with_the_checkpoint_s_template_are_rebuilt_with_it_naming_both(tmp_path, capsys):
    """Data built with the default template, a checkpoint trained with its own: its prompts are rebuilt from the
    questions with the checkpoint's template (was an error: the documented own-QA commands needed --prompt-template),
    never evaluated on a prompt it was not trained with."""
    from router_r1.eval.evaluate import main
    from tiny import tiny_model

    build_sim(SimConfig(out_dir=tmp_path / "data", train_size=1, val_size=1, test_size=2))  # the default template
    test_file = tmp_path / "data" / "test.parquet"
    ckpt = tmp_path / "ckpt"
    tok = tiny_tokenizer()
    tok.save_pretrained(ckpt)
    tiny_model(len(tok), seed=0).save_pretrained(ckpt)
    (ckpt / "prompt_template.txt").write_text("Route or answer.\n{budget}Question: {question}\n")
    args = ["--checkpoint", str(ckpt), "--data", str(test_file), "--sim", "--out", str(tmp_path / "out"),
            "--response-length", "4", "--max-response-length", "16", "--device", "cpu"]
    assert main(args) == 0
    note = next(line for line in capsys.readouterr().out.splitlines() if "rebuilt" in line)
    assert f"{test_file} row 0" in note and str(ckpt / "prompt_template.txt") in note
    assert "rebuilt from their questions" in note and "2 of 2 rows" in note
    # data built with the checkpoint's own template: evaluated
    build_sim(SimConfig(out_dir=tmp_path / "own", train_size=1, val_size=1, test_size=2,
                        prompt_template=ckpt / "prompt_template.txt"))
    args[args.index(str(test_file))] = str(tmp_path / "own" / "test.parquet")
    assert main(args) == 0 and (tmp_path / "out" / "summary.json").exists()
    assert "rebuilt" not in capsys.readouterr().out  # its rows' own prompts


def test_a_checkpoint_without_a_template_warns_on_rows_of_another(tmp_path):
    template = tmp_path / "own.txt"
    template.write_text("Route or answer.\n{pool}\nQuestion: {question}\n")
    build_sim(SimConfig(out_dir=tmp_path / "data", train_size=1, val_size=1, test_size=2, prompt_template=template))
    tok = tiny_tokenizer()
    logged = []
    cfg = EvalConfig(data=[str(tmp_path / "data" / "test.parquet")], sim=True, checkpoints=["c"],
                     out=str(tmp_path / "out"), response_length=16, max_response_length=64)
    evaluate(cfg, load=lambda c: Policy(tok, _answer_at_once(tok)), log=logged.append)
    assert any("WARNING" in m and "row 0: its prompt was not built with the default template" in m for m in logged)
    logged.clear()
    evaluate(cfg, load=lambda c: Policy(tok, _answer_at_once(tok), template=template.read_text()), log=logged.append)
    assert not any("not built with" in m for m in logged)  # the template it was built with: no word
