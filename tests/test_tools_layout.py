"""tools/ is a package whose files run as `python -m tools.<group>.<file>`, and no project file edits sys.path:
imports go through packages, so a moved file breaks an import here rather than a path hack at run time."""
import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import tools

ROOT = Path(__file__).resolve().parents[1]
# not project files: caches, builds, run outputs, environments
SKIP = {"__pycache__", "outputs", "runs", "data", "venv", "wandb", "build", "dist"}
GROUPS = {"bench", "check", "analysis", "convert"}


def project_files() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if not any(
        part.startswith(".") or part in SKIP or part.endswith(".egg-info") for part in p.relative_to(ROOT).parts[:-1]))


def _is_sys_path(node: ast.AST) -> bool:
    """`sys.path`, or a subscript or method of it (`sys.path[:0]`, `sys.path.insert`)."""
    while isinstance(node, (ast.Subscript, ast.Attribute)) and not (
            isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
            and node.value.id == "sys"):
        node = node.value
    return isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) \
        and node.value.id == "sys"


def sys_path_edits(source: str) -> list[int]:
    """Lines that change sys.path: a call on it (insert, append, extend...), an assignment to it or a slice of it,
    or `from sys import path`."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _is_sys_path(node.func.value):
            lines.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_is_sys_path(t) for t in targets):
                lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "sys" and any(a.name == "path" for a in node.names):
            lines.append(node.lineno)
    return lines


def tools_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(tools.__path__, "tools.") if not m.ispkg)


def test_no_project_file_edits_sys_path():
    files = project_files()
    assert len(files) > 100 and ROOT / "tests" / "test_tools_layout.py" in files  # the walk sees tests too
    bad = [f"{p.relative_to(ROOT)}:{n}" for p in files for n in sys_path_edits(p.read_text())]
    assert not bad, "import by package instead of editing sys.path:\n" + "\n".join(bad)


@pytest.mark.parametrize("source", [
    "import sys\nsys.path.insert(0, 'x')\n",
    "import sys\nsys.path.append('x')\n",
    "import sys\nsys.path[:0] = ['x']\n",
    "import sys\nsys.path += ['x']\n",
    "import sys\nsys.path = ['x']\n",
    "from sys import path\n",
])
def test_the_sys_path_check_sees_each_kind_of_edit(source):
    assert sys_path_edits(source)


def test_the_sys_path_check_lets_reads_and_prose_pass():
    assert not sys_path_edits('"""we never edit sys.path here"""\nimport sys\nprint(sys.path[0], list(sys.path))\n')


def test_tools_groups_and_nothing_left_in_scripts():
    """Every tool sits in one of the four groups; the old flat folder is gone; train.sh's pool helper moved too."""
    assert not (ROOT / "scripts").exists()
    assert {m.split(".")[1] for m in tools_modules()} == GROUPS
    assert all(m.count(".") == 2 for m in tools_modules()), tools_modules()
    assert (ROOT / "tools" / "sim_pool.sh").is_file() and "source tools/sim_pool.sh" in (ROOT / "train.sh").read_text()


@pytest.mark.parametrize("module", tools_modules())
def test_every_tool_imports_as_a_package_module(module):
    """Import only: a tool does its work under `if __name__ == "__main__"`, never at import."""
    mod = importlib.import_module(module)
    assert callable(getattr(mod, "main", None)), f"{module} has no main()"
