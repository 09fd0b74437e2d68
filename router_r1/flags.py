"""Command-line flags generated from a settings dataclass: one flag per field, its default the field's, its
help the comment beside the field (verl.trainer.config.field_docs), so each setting is written once.

A field's metadata may say: `flag` (another spelling, e.g. "--checkpoint" for `checkpoints`), `choices`,
`required`, `append` (a repeatable flag collecting a list), `metavar`, `type` (the function that parses the flag,
e.g. one refusing a size below 1), `no_flag` (set by the program, not a flag). `run_command` is the rest of a
command line's main(): bad input as one `error:` line and an exit status.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from typing import Any, Callable, Optional

from verl.trainer.config import field_docs


def _base_type(tp: Any) -> tuple[Any, bool]:
    """(the type a flag parses, whether the field is a list) of an annotation such as Optional[list[int]]."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) is typing.Union and len(args) == 1:
        return _base_type(args[0])
    if typing.get_origin(tp) is list:
        return (typing.get_args(tp) or (str,))[0], True
    return tp, False


def _ordered_fields(cls: type) -> list:
    """The fields of `cls`, its own first, then those of each base in MRO order (the --help order)."""
    order = {name: i for i, name in enumerate(
        dict.fromkeys(n for c in cls.__mro__ for n in vars(c).get("__annotations__", {})))}
    return sorted(dataclasses.fields(cls), key=lambda f: order[f.name])


def add_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type, skip: tuple[str, ...] = ()) -> None:
    """One flag per field of the dataclass `cls` (but `skip`), documented by the comment beside the field."""
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    for f in _ordered_fields(cls):
        meta = f.metadata
        if f.name in skip or meta.get("no_flag"):
            continue
        if f.name not in docs:
            raise ValueError(f"{cls.__qualname__}.{f.name} has no comment beside it: its flag would have no help")
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        kw: dict[str, Any] = {"help": docs[f.name]}
        tp, is_list = _base_type(hints[f.name])
        flag = meta.get("flag", "--" + f.name.replace("_", "-"))
        names = [flag]
        kw["dest"] = f.name
        if tp is bool:
            if default:
                names = ["--no-" + flag[2:]]
                kw["action"] = "store_false"
            else:
                kw["action"] = "store_true"
        else:
            kw["type"] = meta.get("type", tp)
            if is_list:
                if meta.get("append"):
                    kw["action"] = "append"
                else:
                    kw["nargs"] = "+"
            if "choices" in meta:
                kw["choices"] = meta["choices"]
            if "metavar" in meta:
                kw["metavar"] = meta["metavar"]
        if meta.get("required"):
            kw["required"] = True
        else:
            kw["default"] = default
            if default is not None and not isinstance(default, bool) and default != [] and "default" not in kw["help"]:
                kw["help"] += f" (default: {default})"
        parser.add_argument(*names, **kw)


def from_args(cls: type, namespace: argparse.Namespace, **extra):
    """An instance of `cls` from parsed flags (fields the namespace lacks keep their defaults)."""
    values = {f.name: getattr(namespace, f.name) for f in dataclasses.fields(cls) if hasattr(namespace, f.name)}
    return cls(**{**values, **extra})


def parser_for(cls: type, prog: str, description: str, skip: tuple[str, ...] = ()) -> argparse.ArgumentParser:
    """A parser holding the flags of `cls`."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    add_flags(p, cls, skip)
    return p


def run_command(work: Callable[[], Any], errors: tuple[type[Exception], ...],
                report: Callable[[Any], Optional[int]] = lambda result: None, code: int = 1) -> int:
    """A main()'s exit status: `report(work())`'s (None: 0); an error of `errors` is bad input, printed as one line
    `error: ...` on stderr, status `code`."""
    try:
        result = work()
    except errors as e:
        print(f"error: {str(e).replace(chr(10), ' ')}", file=sys.stderr)
        return code
    return report(result) or 0
