"""The dependency arrow points one way: verl never imports an environment (router_r1, gramma)."""
import ast
from pathlib import Path

VERL = Path(__file__).resolve().parents[1] / "verl"


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


ENVIRONMENTS = ("router_r1", "gramma")


def test_verl_does_not_import_an_environment():
    files = sorted(VERL.rglob("*.py"))
    assert len(files) > 10
    offenders = {str(f.relative_to(VERL.parent)): sorted(m for m in imported_modules(f)
                                                         if m.split(".")[0] in ENVIRONMENTS)
                 for f in files}
    assert {f: m for f, m in offenders.items() if m} == {}
