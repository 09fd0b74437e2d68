"""Trainer data: a bad row is rejected when the parquet file is loaded, named by file and row."""
import re

import pandas as pd
import pytest
from tiny import tiny_tokenizer

from data_process.schema import make_row
from router_r1.router_env import RouterEnv
from router_r1.row_check import check_router_row
from verl.trainer.dataset import DataError, PromptDataset

PROMPT = [{"role": "user", "content": "Q: who wrote hamlet?"}]


def _rows(n=4):
    return [make_row("nq", "train", i, f"question {i}?", ["Shakespeare"], PROMPT, "train", f"t{i}") for i in range(n)]


def _write(tmp_path, rows, name="train.parquet"):
    path = tmp_path / name
    pd.DataFrame(rows).to_parquet(path, index=False)  # real pyarrow round trip (missing keys become None)
    return path


def _load(path):
    return PromptDataset(str(path), tiny_tokenizer(), row_check=RouterEnv.check_row)


@pytest.mark.parametrize("target, why", [
    (None, "is missing or null"),
    ([], "is empty"),
    (["The"], "holds 'The', which normalises to nothing"),
    (["Paris", "?!"], "holds '?!', which normalises to nothing"),
    ([""], "holds '', which normalises to nothing"),
])
def test_bad_golds_are_named_by_file_and_row(tmp_path, target, why):
    rows = _rows()
    rows[2]["reward_model"] = {"style": "rule", "ground_truth": {"target": target}}
    path = _write(tmp_path, rows)
    with pytest.raises(DataError, match=re.escape(f"{path}: row 2: field 'reward_model.ground_truth.target' {why}")):
        _load(path)


def test_row_without_target_is_named(tmp_path):
    rows = _rows()
    rows[1]["reward_model"] = {"style": "rule", "ground_truth": {"other": "x"}}  # struct: target read back as absent
    path = _write(tmp_path, rows)
    with pytest.raises(DataError, match=rf"{path}: row 1: field 'reward_model.ground_truth.target'"):
        _load(path)


@pytest.mark.parametrize("drop", ["role", "content"])
def test_message_without_role_or_content_is_named(tmp_path, drop):
    rows = _rows()
    rows[3]["prompt"] = [{k: v for k, v in PROMPT[0].items() if k != drop}]
    path = _write(tmp_path, rows)
    with pytest.raises(DataError, match=rf"{path}: row 3: 'prompt' message 0 has no string '{drop}'"):
        _load(path)


def test_every_bad_row_of_every_file_is_listed_and_good_files_load(tmp_path):
    good = _write(tmp_path, _rows(), "good.parquet")
    assert len(_load(good)) == 4
    rows = _rows(8)
    for i in (0, 5):
        rows[i]["reward_model"] = {"style": "rule", "ground_truth": {"target": ["a"]}}
    path = _write(tmp_path, rows, "bad.parquet")
    with pytest.raises(DataError) as err:
        PromptDataset([str(good), str(path)], tiny_tokenizer(), row_check=RouterEnv.check_row)
    assert str(err.value).startswith("2 bad row(s)")
    assert f"{path}: row 0:" in str(err.value) and f"{path}: row 5:" in str(err.value)


def test_check_router_row_accepts_real_golds():
    assert check_router_row({"reward_model": {"ground_truth": {"target": ["The Beatles", "1990"]}}}) is None
    assert check_router_row({"reward_model": {"ground_truth": {"target": "Paris"}}}) is None
    assert "holds a int" in check_router_row({"reward_model": {"ground_truth": {"target": [1990]}}})


def test_trainer_rejects_a_bad_row_before_building_workers(tmp_path, monkeypatch):
    """main_ppo hands the env's check to the dataset, so the run stops while loading the data."""
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    import verl.trainer.main_ppo as main_ppo

    rows = _rows()
    rows[2]["reward_model"] = {"style": "rule", "ground_truth": {"target": ["an"]}}
    path = _write(tmp_path, rows)
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    monkeypatch.setattr(main_ppo, "build_groups", lambda *a, **k: pytest.fail("workers built before the data check"))
    with initialize_config_dir(main_ppo.CONFIG_DIR, version_base=None):
        cfg = compose("router_r1", overrides=[f"trainer.output_dir={tmp_path}", f"data.train_files=[{path}]",
                                              "data.val_files=[]", "model.tokenizer=tiny",
                                              # past the preflight (GPU, vLLM, pool key) on a CPU machine
                                              "trainer.device=cpu", "rollout.name=hf"])
    monkeypatch.setenv("ROUTER_POOL_API_KEY", "not-used")
    with pytest.raises(DataError, match=rf"{path}: row 2: .*'an', which normalises to nothing"):
        main_ppo.run(cfg)


@pytest.mark.parametrize("source, why", [
    (b"\xff\xfe", r"'data_source' is a bytes \(b'\\xff\\xfe'\), not a string"),
    ("", "'data_source' is empty"),
    ("nq\x00", r"'data_source' 'nq\\x00' holds unprintable characters"),
])
def test_a_data_source_that_cannot_name_a_metric_is_refused_at_load(tmp_path, source, why):
    """A non-UTF-8 data_source (a binary column) became the metric name val/b'\\xff\\xfe'/reward."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = _rows()
    binary = isinstance(source, bytes)  # a binary column: what a file written with bytes for the names holds
    values = [r["data_source"].encode() if binary else r["data_source"] for r in rows]
    values[1] = source
    table = pa.Table.from_pylist(rows)
    sources = pa.array(values, pa.binary() if binary else pa.string())
    path = tmp_path / "train.parquet"
    pq.write_table(table.set_column(table.schema.get_field_index("data_source"), "data_source", sources), path)
    with pytest.raises(DataError, match=rf"{re.escape(str(path))}: row 1: {why}"):
        _load(path)
