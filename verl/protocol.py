"""DataProto: the batch container passed between the controller and the workers.

A batch is three dicts: `batch` (tensors), `non_tensor` (numpy arrays, often
dtype=object for strings/dicts), and `meta` (batch-level values such as temperature).
Every tensor and array shares the same first dimension, the batch size. Operations
return new DataProto objects that share tensor storage where possible (no copies
unless indexing requires one); only `pop` mutates in place.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

Index = int | slice | list[int] | np.ndarray | torch.Tensor


def _as_numpy_index(idx: Index) -> np.ndarray | slice:
    if isinstance(idx, slice):
        return idx
    if isinstance(idx, torch.Tensor):
        idx = idx.detach().cpu().numpy()
    idx = np.asarray(idx)
    if idx.size == 0:
        idx = idx.astype(np.int64)  # np.asarray([]) is float64
    if idx.dtype != bool and not np.issubdtype(idx.dtype, np.integer):
        raise TypeError(f"DataProto index must be integer or boolean, got dtype {idx.dtype}")
    return idx


@dataclass
class DataProto:
    batch: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensor: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.check()

    # ------------------------------------------------------------------ basics
    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor],
        non_tensors: dict[str, Any] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> DataProto:
        """Build a DataProto; lists in `non_tensors` become numpy object arrays."""
        arrays = {}
        for key, value in (non_tensors or {}).items():
            if isinstance(value, np.ndarray):
                arrays[key] = value
            elif not isinstance(value, (list, tuple)):
                raise TypeError(f"non_tensors[{key!r}] must be a numpy array, list or tuple, got {type(value).__name__}")
            else:
                # Object dtype keeps each element as-is (a list of lists stays a 1-D array of lists).
                arr = np.empty(len(value), dtype=object)
                for i, v in enumerate(value):
                    arr[i] = v
                arrays[key] = arr
        return cls(batch=dict(tensors), non_tensor=arrays, meta=dict(meta or {}))

    def check(self) -> None:
        """Raise if the first dimensions disagree; the error names the offending key."""
        size, first_key = None, None
        for kind, store, typ in (("batch", self.batch, torch.Tensor), ("non_tensor", self.non_tensor, np.ndarray)):
            for key, value in store.items():
                if not isinstance(value, typ):
                    raise TypeError(f"DataProto.{kind}[{key!r}] must be a {typ.__name__}, got {type(value).__name__}")
                if value.ndim == 0:
                    raise ValueError(f"DataProto.{kind}[{key!r}] is a scalar; it needs a batch dimension")
                n = value.shape[0]
                if size is None:
                    size, first_key = n, key
                elif n != size:
                    raise ValueError(
                        f"DataProto.{kind}[{key!r}] has first dim {n}, but {first_key!r} has {size}"
                    )

    def __len__(self) -> int:
        for value in self.batch.values():
            return value.shape[0]
        for value in self.non_tensor.values():
            return value.shape[0]
        return 0

    def __getitem__(self, idx: Index) -> DataProto:
        """Index rows; an int keeps the batch dim (returns a DataProto of length 1)."""
        if isinstance(idx, (int, np.integer)):
            n = len(self)
            if not -n <= idx < n:
                raise IndexError(f"index {idx} out of range for DataProto of length {n}")
            idx = slice(int(idx) % n, int(idx) % n + 1)
        np_idx = _as_numpy_index(idx)
        t_idx = np_idx if isinstance(np_idx, slice) else torch.from_numpy(np_idx)
        batch = {k: v[t_idx.to(v.device) if isinstance(t_idx, torch.Tensor) else t_idx] for k, v in self.batch.items()}
        non_tensor = {k: v[np_idx] for k, v in self.non_tensor.items()}
        return DataProto(batch, non_tensor, dict(self.meta))

    @staticmethod
    def concat(parts: Sequence[DataProto]) -> DataProto:
        """Concatenate along the batch dim; meta comes from the first part."""
        if not parts:
            raise ValueError("DataProto.concat needs at least one part")
        keys_t, keys_n = set(parts[0].batch), set(parts[0].non_tensor)
        for i, p in enumerate(parts[1:], start=1):
            if set(p.batch) != keys_t or set(p.non_tensor) != keys_n:
                raise ValueError(
                    f"DataProto.concat: part {i} has keys {sorted(p.batch)}/{sorted(p.non_tensor)}, "
                    f"part 0 has {sorted(keys_t)}/{sorted(keys_n)}"
                )
        batch = {k: torch.cat([p.batch[k] for p in parts]) for k in parts[0].batch}
        non_tensor = {k: np.concatenate([p.non_tensor[k] for p in parts]) for k in parts[0].non_tensor}
        return DataProto(batch, non_tensor, dict(parts[0].meta))

    # --------------------------------------------------------------- splitting
    def split(self, chunk_size: int) -> list[DataProto]:
        """Consecutive pieces of `chunk_size` rows; the last one may be shorter."""
        if chunk_size <= 0:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        return [self[i : i + chunk_size] for i in range(0, len(self), chunk_size)]

    def chunk(self, n: int) -> list[DataProto]:
        """Exactly `n` consecutive parts, order kept, sizes differing by at most one.

        When len % n = r != 0, the first r parts get one extra row (like np.array_split);
        when n > len, the trailing parts are empty.
        """
        if n <= 0:
            raise ValueError(f"chunk count must be positive, got {n}")
        base, extra = divmod(len(self), n)
        parts, start = [], 0
        for i in range(n):
            stop = start + base + (1 if i < extra else 0)
            parts.append(self[start:stop])
            start = stop
        return parts

    # ----------------------------------------------------------- key handling
    def union(self, other: DataProto) -> DataProto:
        """A new DataProto with the keys of both; a shared key must hold equal values."""
        both_have_rows = (self.batch or self.non_tensor) and (other.batch or other.non_tensor)
        if both_have_rows and len(self) != len(other):
            raise ValueError(f"DataProto.union: lengths differ ({len(self)} vs {len(other)})")
        batch = dict(self.batch)
        for k, v in other.batch.items():
            if k in batch and not (batch[k].shape == v.shape and torch.equal(batch[k], v.to(batch[k].device))):
                raise ValueError(f"DataProto.union: tensor {k!r} differs between the two batches")
            batch[k] = v
        non_tensor = dict(self.non_tensor)
        for k, v in other.non_tensor.items():
            if k in non_tensor and not _arrays_equal(non_tensor[k], v):
                raise ValueError(f"DataProto.union: non-tensor {k!r} differs between the two batches")
            non_tensor[k] = v
        meta = dict(self.meta)
        for k, v in other.meta.items():
            if k in meta and not _values_equal(meta[k], v):
                raise ValueError(f"DataProto.union: meta {k!r} differs ({meta[k]!r} vs {v!r})")
            meta[k] = v
        return DataProto(batch, non_tensor, meta)

    def select(self, tensor_keys: Sequence[str] | None = None, non_tensor_keys: Sequence[str] | None = None) -> DataProto:
        """A view with only the named keys; None keeps every key of that kind. Meta is copied."""
        batch = self.batch if tensor_keys is None else {k: self._get(self.batch, "batch", k) for k in tensor_keys}
        non_tensor = (
            self.non_tensor
            if non_tensor_keys is None
            else {k: self._get(self.non_tensor, "non_tensor", k) for k in non_tensor_keys}
        )
        return DataProto(dict(batch), dict(non_tensor), dict(self.meta))

    def pop(self, tensor_keys: Sequence[str] | None = None, non_tensor_keys: Sequence[str] | None = None) -> DataProto:
        """Remove the named keys from self and return them (None pops nothing of that kind)."""
        tensor_keys, non_tensor_keys = list(tensor_keys or []), list(non_tensor_keys or [])
        for k in tensor_keys:
            self._get(self.batch, "batch", k)
        for k in non_tensor_keys:
            self._get(self.non_tensor, "non_tensor", k)
        batch = {k: self.batch.pop(k) for k in tensor_keys}
        non_tensor = {k: self.non_tensor.pop(k) for k in non_tensor_keys}
        return DataProto(batch, non_tensor, dict(self.meta))

    @staticmethod
    def _get(store: dict, kind: str, key: str):
        if key not in store:
            raise KeyError(f"DataProto.{kind} has no key {key!r}; it has {sorted(store)}")
        return store[key]

    # ------------------------------------------------------------- reshaping
    def reorder(self, indices: Index) -> DataProto:
        """Rows permuted by `indices`, which must be a permutation of range(len)."""
        idx = _as_numpy_index(indices)
        if isinstance(idx, slice) or idx.dtype == bool or not np.array_equal(np.sort(idx), np.arange(len(self))):
            raise ValueError(f"reorder needs a permutation of range({len(self)})")
        return self[idx]

    def repeat(self, n: int, interleave: bool = True) -> DataProto:
        """Each row n times: interleave gives [a,a,b,b], otherwise [a,b,a,b]."""
        if n <= 0:
            raise ValueError(f"repeat count must be positive, got {n}")
        rows = np.arange(len(self))
        idx = np.repeat(rows, n) if interleave else np.tile(rows, n)
        return self[idx]

    def to(self, device: str | torch.device) -> DataProto:
        """Move tensors to `device`; numpy arrays and meta stay as they are."""
        return DataProto({k: v.to(device) for k, v in self.batch.items()}, dict(self.non_tensor), dict(self.meta))

    # ------------------------------------------------------------ persistence
    def save(self, path: str) -> None:
        """Save with torch.save in a weights_only-loadable layout.

        Tensors, numeric/bool/str arrays and object arrays or meta made of plain
        Python values (str, int, float, bool, None, lists/tuples/dicts of them) are
        stored directly. Anything else (e.g. numpy scalars inside object arrays, custom
        classes) is pickled into bytes, which `load` only unpickles with allow_pickle=True.
        """
        arrays, pickled = {}, {}
        for k, v in self.non_tensor.items():
            enc = _encode_array(v)
            if enc is None:
                pickled[("non_tensor", k)] = v
            else:
                arrays[k] = enc
        meta = {}
        for k, v in self.meta.items():
            if _is_plain(v):
                meta[k] = v
            else:
                pickled[("meta", k)] = v
        payload = {
            "format": "DataProto/1",
            "batch": {k: v.detach().cpu() for k, v in self.batch.items()},
            "non_tensor": arrays,
            "meta": meta,
            # A uint8 tensor, since torch pickles some bytes objects in a way weights_only rejects.
            "pickled": torch.frombuffer(bytearray(pickle.dumps(pickled)), dtype=torch.uint8) if pickled else None,
        }
        torch.save(payload, path)

    @classmethod
    def load(cls, path: str, allow_pickle: bool = False) -> DataProto:
        """Load a file written by `save`; pickled parts need allow_pickle=True (trusted files only)."""
        payload = torch.load(path, weights_only=True, map_location="cpu")
        if not isinstance(payload, dict) or payload.get("format") != "DataProto/1":
            raise ValueError(f"{path}: not a DataProto file (missing format tag 'DataProto/1')")
        non_tensor = {k: _decode_array(v) for k, v in payload["non_tensor"].items()}
        meta = dict(payload["meta"])
        if payload["pickled"] is not None:
            if not allow_pickle:
                raise ValueError(
                    f"{path}: holds pickled non-tensor/meta values; pass allow_pickle=True "
                    "only if you trust this file"
                )
            for (kind, k), v in pickle.loads(payload["pickled"].numpy().tobytes()).items():
                (non_tensor if kind == "non_tensor" else meta)[k] = v
        return cls(dict(payload["batch"]), non_tensor, meta)


def _values_equal(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, (np.ndarray, torch.Tensor)) or isinstance(b, (np.ndarray, torch.Tensor)):
        return type(a) is type(b) and a.shape == b.shape and bool((a == b).all())
    try:
        return bool(a == b)
    except Exception:  # e.g. arrays, whose == is elementwise
        return False


def _arrays_equal(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape:
        return False
    return all(_values_equal(x, y) for x, y in zip(a.flat, b.flat))


def _is_plain(v: Any) -> bool:
    # Exactly the builtin types torch's weights_only unpickler accepts (subclasses are not).
    if v is None or type(v) in (str, int, float, bool):
        return True
    if type(v) in (list, tuple):
        return all(_is_plain(x) for x in v)
    if type(v) is dict:
        return all(type(k) in (str, int) and _is_plain(x) for k, x in v.items())
    return False


def _encode_array(arr: np.ndarray) -> dict | None:
    if arr.dtype.kind in "biuf":
        return {"kind": "numeric", "dtype": arr.dtype.str, "data": torch.from_numpy(np.ascontiguousarray(arr))}
    if arr.dtype.kind == "U":
        return {"kind": "str", "dtype": arr.dtype.str, "shape": arr.shape, "items": [str(x) for x in arr.flat]}
    if arr.dtype == object:
        items = list(arr.flat)
        if _is_plain(items):
            return {"kind": "object", "shape": arr.shape, "items": items}
    return None


def _decode_array(enc: dict) -> np.ndarray:
    if enc["kind"] == "numeric":
        return enc["data"].numpy().astype(np.dtype(enc["dtype"]), copy=False)
    if enc["kind"] == "str":
        return np.array(enc["items"], dtype=np.dtype(enc["dtype"])).reshape(enc["shape"])
    arr = np.empty(len(enc["items"]), dtype=object)
    for i, v in enumerate(enc["items"]):
        arr[i] = v
    return arr.reshape(enc["shape"])
