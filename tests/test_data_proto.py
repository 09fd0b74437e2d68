import numpy as np
import pytest
import torch

from verl.protocol import DataProto


def make(n=5):
    return DataProto.from_dict(
        {"ids": torch.arange(n * 3).reshape(n, 3), "score": torch.arange(n, dtype=torch.float32)},
        {"uid": [f"u{i}" for i in range(n)], "gt": [{"answer": [str(i)]} for i in range(n)]},
        meta={"temperature": 1.0},
    )


def test_from_dict_validates_and_names_the_key():
    with pytest.raises(ValueError, match="'mask'"):
        DataProto.from_dict({"ids": torch.zeros(4, 2), "mask": torch.zeros(3, 2)})
    with pytest.raises(ValueError, match="'uid'"):
        DataProto.from_dict({"ids": torch.zeros(4, 2)}, {"uid": ["a", "b"]})
    with pytest.raises(TypeError, match="'uid'"):
        DataProto.from_dict({"ids": torch.zeros(4, 2)}, {"uid": 3})
    d = make()
    assert len(d) == 5 and d.non_tensor["gt"].dtype == object
    assert d.non_tensor["gt"][2] == {"answer": ["2"]}


def test_indexing_forms_agree():
    d = make()
    by_list = d[[4, 0, 2]]
    assert by_list.batch["score"].tolist() == [4, 0, 2]
    assert list(by_list.non_tensor["uid"]) == ["u4", "u0", "u2"]
    for idx in (np.array([4, 0, 2]), torch.tensor([4, 0, 2])):
        assert torch.equal(d[idx].batch["ids"], by_list.batch["ids"])
    one = d[-1]
    assert len(one) == 1 and one.non_tensor["uid"].tolist() == ["u4"] and one.meta == d.meta
    assert d[1:3].batch["score"].tolist() == [1, 2]
    assert d[np.array([True, False, False, False, True])].non_tensor["uid"].tolist() == ["u0", "u4"]
    assert len(d[[]]) == 0
    with pytest.raises(IndexError):
        d[5]


def test_split_concat_round_trip():
    d = make(7)
    parts = d.split(3)
    assert [len(p) for p in parts] == [3, 3, 1]
    back = DataProto.concat(parts)
    for k in d.batch:
        assert torch.equal(back.batch[k], d.batch[k])
    assert back.non_tensor["uid"].tolist() == d.non_tensor["uid"].tolist()
    assert back.non_tensor["gt"].tolist() == d.non_tensor["gt"].tolist()
    assert back.meta == d.meta
    bad = make(2)
    bad.pop(tensor_keys=["score"])
    with pytest.raises(ValueError, match="part 1"):
        DataProto.concat([make(2), bad])


def test_chunk_non_divisible_keeps_order():
    d = make(10)
    parts = d.chunk(3)
    assert [len(p) for p in parts] == [4, 3, 3]
    assert torch.equal(torch.cat([p.batch["score"] for p in parts]), d.batch["score"])
    assert [len(p) for p in make(2).chunk(4)] == [1, 1, 0, 0]
    assert DataProto.concat(make(6).chunk(2)).non_tensor["uid"].tolist() == [f"u{i}" for i in range(6)]


def test_repeat_interleave_and_tile():
    d = make(3)
    r = d.repeat(2, interleave=True)
    assert r.batch["score"].tolist() == [0, 0, 1, 1, 2, 2]
    assert r.non_tensor["uid"].tolist() == ["u0", "u0", "u1", "u1", "u2", "u2"]
    t = d.repeat(2, interleave=False)
    assert t.non_tensor["uid"].tolist() == ["u0", "u1", "u2", "u0", "u1", "u2"]


def test_union_adds_keys_and_rejects_conflicts():
    d = make(3)
    extra = DataProto.from_dict({"values": torch.ones(3, 3), "score": d.batch["score"].clone()}, {"uid": ["u0", "u1", "u2"]})
    u = d.union(extra)
    assert set(u.batch) == {"ids", "score", "values"} and "values" not in d.batch
    conflict = DataProto.from_dict({"score": torch.tensor([0.0, 1.0, 9.0])})
    with pytest.raises(ValueError, match="'score'"):
        d.union(conflict)
    with pytest.raises(ValueError, match="'uid'"):
        d.union(DataProto.from_dict({}, {"uid": ["u0", "x", "u2"]}))
    with pytest.raises(ValueError, match="'temperature'"):
        d.union(DataProto(meta={"temperature": 0.0}))
    with pytest.raises(ValueError, match="lengths differ"):
        d.union(make(2))


def test_select_pop_reorder():
    d = make(4)
    s = d.select(tensor_keys=["score"], non_tensor_keys=[])
    assert set(s.batch) == {"score"} and not s.non_tensor and s.meta == d.meta
    assert set(d.select().batch) == {"ids", "score"}
    with pytest.raises(KeyError, match="'nope'"):
        d.select(tensor_keys=["nope"])
    popped = d.pop(tensor_keys=["ids"], non_tensor_keys=["gt"])
    assert set(popped.batch) == {"ids"} and set(d.batch) == {"score"} and set(d.non_tensor) == {"uid"}
    r = d.reorder(torch.tensor([3, 1, 0, 2]))
    assert r.non_tensor["uid"].tolist() == ["u3", "u1", "u0", "u2"]
    with pytest.raises(ValueError, match="permutation"):
        d.reorder([0, 0, 1, 2])


def test_to_keeps_everything():
    d = make(2).to("cpu")
    assert d.batch["ids"].device.type == "cpu" and d.non_tensor["uid"].tolist() == ["u0", "u1"]


def test_save_load_round_trip_weights_only(tmp_path):
    d = make(4)
    d.non_tensor["len"] = np.array([3, 1, 4, 1], dtype=np.int32)
    d.non_tensor["name"] = np.array(["a", "bb", "c", "d"])
    d.meta["steps"] = [1, 2]
    path = tmp_path / "batch.pt"
    d.save(str(path))
    back = DataProto.load(str(path))
    for k in d.batch:
        assert torch.equal(back.batch[k], d.batch[k])
    for k in d.non_tensor:
        assert back.non_tensor[k].dtype == d.non_tensor[k].dtype
        assert back.non_tensor[k].tolist() == d.non_tensor[k].tolist()
    assert back.meta == d.meta
    # The file is loadable by torch's safe loader on its own.
    assert torch.load(str(path), weights_only=True)["format"] == "DataProto/1"


def test_save_load_pickled_parts_need_opt_in(tmp_path):
    d = make(2)
    d.non_tensor["np_scalars"] = np.array([np.float64(1.5), np.int64(2)], dtype=object)
    path = tmp_path / "batch.pt"
    d.save(str(path))
    with pytest.raises(ValueError, match="allow_pickle"):
        DataProto.load(str(path))
    back = DataProto.load(str(path), allow_pickle=True)
    assert back.non_tensor["np_scalars"].tolist() == [1.5, 2]
    torch.save({"x": torch.zeros(1)}, str(tmp_path / "other.pt"))
    with pytest.raises(ValueError, match="other.pt"):
        DataProto.load(str(tmp_path / "other.pt"))
