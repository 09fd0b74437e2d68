"""The lab's layout: every experiment is a package with a README, its modules import by package name (none edits
sys.path) and its shell scripts parse. That docs/ holds no scripts is tests/test_docs_budget.py's check."""
import importlib
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted(p for p in (ROOT / "experiments").iterdir() if p.is_dir() and p.name != "__pycache__")
MODULES = sorted(p for p in (ROOT / "experiments").rglob("*.py") if p.name != "__init__.py")
SCRIPTS = sorted((ROOT / "experiments").rglob("*.sh"))


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def incomplete(folders: list[Path]) -> list[str]:
    """The experiment folders lacking an __init__.py (python -m) or a README.md."""
    return [rel(d) for d in folders if not (d / "__init__.py").exists() or not (d / "README.md").exists()]


def parses(script: Path) -> bool:
    return subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0


def test_each_experiment_is_a_package_with_a_readme():
    assert len(EXPERIMENTS) >= 10 and (ROOT / "experiments/__init__.py").exists()
    assert not incomplete(EXPERIMENTS)


@pytest.mark.parametrize("path", MODULES, ids=rel)
def test_module_imports_by_package_name(path):
    assert "sys.path" not in path.read_text(), f"{rel(path)} edits sys.path: import project modules by package name"
    module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
    assert callable(getattr(module, "main", None)), f"{rel(path)} has no main() for python -m"


@pytest.mark.parametrize("path", SCRIPTS, ids=rel)
def test_shell_script_parses(path):
    assert parses(path)


def test_the_checks_can_fail(tmp_path):
    """A folder without a README and a script that does not parse are each found."""
    (tmp_path / "x").mkdir()
    (tmp_path / "x/__init__.py").write_text("")
    assert incomplete([tmp_path / "x"]) == [str(tmp_path / "x")]
    (tmp_path / "bad.sh").write_text("if true; then\n")
    (tmp_path / "good.sh").write_text("echo hi\n")
    assert not parses(tmp_path / "bad.sh") and parses(tmp_path / "good.sh")
