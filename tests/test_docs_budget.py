"""docs/ stays a set of records that fit (docs/results/README.md): at most 6 MiB in all, no scripts (they live under
experiments/ and tools/), and no plain JSONL or log under docs/results above 100 KB. The bound: such files gzip 5-10x
(training metrics about 10x), and keeping them plain is how docs/ had grown to 23 MB."""
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUDGET = 6 * 1024 * 1024  # bytes, all of docs/
PLAIN_MAX = 100 * 1024  # bytes, one uncompressed .jsonl or .log under docs/results
SCRIPTS = (".py", ".sh")
PLAIN_BULK = (".jsonl", ".log")


def docs_files(root: Path = ROOT) -> list[Path]:
    """The files of docs/ that git tracks (what a clone gets), or every file there outside a git checkout."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "docs"], cwd=root, capture_output=True, check=True).stdout
        files = [root / p for p in out.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        files = []
    return [p for p in files if p.is_file()] or [p for p in (root / "docs").rglob("*") if p.is_file()]


def over_budget(files: list[Path], budget: int = BUDGET) -> str:
    """'' when the files fit, else their total and the ten largest."""
    total = sum(p.stat().st_size for p in files)
    if total <= budget:
        return ""
    largest = sorted(files, key=lambda p: -p.stat().st_size)[:10]
    return f"{total:,} bytes > {budget:,}; largest: " + ", ".join(f"{p.name} {p.stat().st_size:,}" for p in largest)


def scripts(files: list[Path]) -> list[Path]:
    return [p for p in files if p.suffix in SCRIPTS]


def plain_bulk(files: list[Path], limit: int = PLAIN_MAX) -> list[Path]:
    """Uncompressed JSONL and logs under docs/results larger than `limit`: they belong gzipped (.jsonl.gz)."""
    return [p for p in files if p.suffix in PLAIN_BULK and "results" in p.parts and p.stat().st_size > limit]


def test_docs_fit_the_budget():
    assert not (msg := over_budget(docs_files())), f"docs/ is over its budget: {msg}"


def test_no_scripts_under_docs():
    found = scripts(docs_files())
    assert not found, f"scripts belong under experiments/ or tools/, not docs/: {[str(p) for p in found]}"


def test_no_large_plain_jsonl_or_log_under_docs_results():
    found = plain_bulk(docs_files())
    assert not found, f"gzip these (and update the README that cites them): {[str(p) for p in found]}"


def test_the_checks_catch_a_tree_that_breaks_them(tmp_path):
    """Outside a git checkout every file under docs/ counts; each check flags its own kind of file."""
    results = tmp_path / "docs/results/run"
    results.mkdir(parents=True)
    (results / "README.md").write_text("# run\n")
    (results / "metrics.jsonl").write_bytes(b"{}\n" * 40_000)  # 120,000 bytes
    (results / "metrics_small.jsonl").write_bytes(b"{}\n" * 100)
    (results / "run.sh").write_text("echo hi\n")
    (tmp_path / "docs/notes.log").write_bytes(b"x" * 200_000)  # outside docs/results: not bulk by this rule
    files = docs_files(tmp_path)
    assert len(files) == 5
    assert [p.name for p in scripts(files)] == ["run.sh"]
    assert [p.name for p in plain_bulk(files)] == ["metrics.jsonl"]
    assert over_budget(files) == "" and "largest: notes.log 200,000" in over_budget(files, budget=300_000)
