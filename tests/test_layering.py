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


def _module_level_imports(path: Path, package: str) -> set[str]:
    """The `package` modules a file imports at its top level (imports inside functions are deferred on purpose)."""
    names = set()
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names if a.name.split(".")[0] == package}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] == package:
            names.add(node.module)
    return names


def test_no_import_cycles_among_the_project_s_modules():
    """Modules import each other one way (a cycle breaks as soon as someone imports the other end first)."""
    root = VERL.parent
    for package in ("router_r1", "verl", "gramma", "data_process"):
        graph = {}
        for f in (root / package).rglob("*.py"):
            mod = ".".join(f.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
            graph[mod] = {m for m in _module_level_imports(f, package) if m != mod}
        done, path = set(), []

        def visit(mod):
            if mod in path:
                raise AssertionError(f"import cycle: {' -> '.join(path[path.index(mod):] + [mod])}")
            if mod in done or mod not in graph:
                return
            path.append(mod)
            for dep in sorted(graph[mod]):
                visit(dep)
            path.pop()
            done.add(mod)

        for mod in sorted(graph):
            visit(mod)
