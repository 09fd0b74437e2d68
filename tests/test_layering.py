"""The dependency arrows point one way: verl never imports an environment (router_r1, gramma); router_r1 never
imports the simulated world (sim); inside router_r1 a subpackage never imports a module above it that uses it."""
import ast
from pathlib import Path

VERL = Path(__file__).resolve().parents[1] / "verl"


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, deferred imports inside functions included; `from a import b` gives a and
    a.b (b may be a module)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return names


ENVIRONMENTS = ("router_r1", "gramma")


def test_verl_does_not_import_an_environment():
    files = sorted(VERL.rglob("*.py"))
    assert len(files) > 10
    offenders = {str(f.relative_to(VERL.parent)): sorted(m for m in imported_modules(f)
                                                         if m.split(".")[0] in ENVIRONMENTS)
                 for f in files}
    assert {f: m for f, m in offenders.items() if m} == {}


def test_router_r1_does_not_import_the_simulated_world():
    """A simulated pool's yaml names its world (`world: sim`) and router_r1/pool/world.py loads it by that name."""
    files = sorted((VERL.parent / "router_r1").rglob("*.py"))
    assert len(files) > 10
    offenders = {str(f.relative_to(VERL.parent)): sorted(m for m in imported_modules(f) if m.split(".")[0] == "sim")
                 for f in files}
    assert {f: m for f, m in offenders.items() if m} == {}


def upward_imports(root: Path, package: str = "router_r1") -> list[str]:
    """Imports by a module of a subpackage (router_r1/pool/client.py) of a module above that subpackage
    (router_r1/prompts.py) that imports the subpackage in turn, directly or not: the subpackage is then no layer
    below its users, and the two cannot be read, tested or moved apart."""
    graph = {}
    for f in (root / package).rglob("*.py"):
        graph[".".join(f.relative_to(root).with_suffix("").parts).removesuffix(".__init__")] = imported_modules(f)
    graph = {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}

    def reaches(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for dep in graph[todo.pop()] - seen:
                seen.add(dep)
                todo.append(dep)
        return seen

    def package_of(mod: str) -> str:
        return mod if (root / Path(*mod.split(".")) / "__init__.py").is_file() else mod.rpartition(".")[0]

    found = []
    for mod, deps in sorted(graph.items()):
        sub = package_of(mod)
        if sub == package:
            continue
        for dep in sorted(deps):
            above = sub.startswith(package_of(dep) + ".") and not dep.startswith(sub)
            users = sorted(m for m in reaches(dep) if m == sub or m.startswith(sub + "."))
            if above and users:
                found.append(f"{mod} -> {dep} (which imports {users[0]})")
    return found


def test_no_upward_imports_inside_router_r1():
    assert upward_imports(VERL.parent) == []


def test_the_upward_import_scan_finds_one(tmp_path):
    """The scan reports a subpackage importing a module above it that imports the subpackage."""
    pkg = tmp_path / "router_r1"
    (pkg / "pool").mkdir(parents=True)
    for f, text in {"__init__.py": "", "prompts.py": "from router_r1.pool.registry import Registry\n",
                    "pool/__init__.py": "", "pool/registry.py": "class Registry: ...\n",
                    "pool/client.py": "def f():\n    from router_r1.prompts import x\n"}.items():
        (pkg / f).write_text(text)
    assert upward_imports(tmp_path) == [
        "router_r1.pool.client -> router_r1.prompts (which imports router_r1.pool.registry)"]
    (pkg / "prompts.py").write_text("x = 1\n")  # prompts no longer uses pool: pool may use it
    assert upward_imports(tmp_path) == []


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


# README's layout table: the packages each top-level package may import (deferred imports included).
ALLOWED = {
    "verl": set(),
    "router_r1": {"verl"},
    "sim": {"router_r1", "verl", "data_process"},
    "gramma": {"verl", "router_r1"},
    "data_process": {"router_r1", "verl", "gramma"},
    "tools": {"verl", "router_r1", "sim", "gramma", "data_process"},
}
PROJECT = {*ALLOWED, "experiments"}


def package_imports(package: str) -> dict[str, set[str]]:
    """For each file of a top-level package, the other project packages it imports."""
    root = VERL.parent
    return {str(f.relative_to(root)): {m.split(".")[0] for m in imported_modules(f)} & PROJECT - {package}
            for f in (root / package).rglob("*.py")}


def test_each_package_imports_only_what_the_readme_layout_allows():
    readme = (VERL.parent / "README.md").read_text()
    for package, allowed in ALLOWED.items():
        assert f"| `{package}/` |" in readme  # the table this test holds the code to
        files = package_imports(package)
        assert files, package
        offenders = {f: sorted(m - allowed) for f, m in files.items() if m - allowed}
        assert offenders == {}, f"{package} may import only {sorted(allowed)}"
