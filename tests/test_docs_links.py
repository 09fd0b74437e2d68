"""Every relative link in README.md and the docs/ pages points to a file (and heading) that exists, and every
repo path a page names (docs/results/..., tools/..., verl/..., ...) exists: moving, renaming or trimming a
file breaks this test."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "experiments").rglob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
# a repo path named in prose or code spans (docs/results/..., tools/..., verl/..., ...), up to a space, quote,
# bracket or "::"; not one a command is told to write (--out PATH, > PATH)
TOP = "docs|tools|experiments|verl|router_r1|gramma|configs|tests|data_process"
NAMED = re.compile(rf"(?<![\w/.-])(?<!--out )(?<!--out=)(?<!> )((?:{TOP})/[\w./*-]*[\w*])")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    lines, fenced = [], False
    for line in page.read_text().splitlines():
        fenced ^= line.lstrip().startswith("```")
        if not fenced and re.match(r"#{1,6} ", line):
            lines.append(slug(line.lstrip("#")))
    return set(lines)


def links(page: Path):
    for n, line in enumerate(page.read_text().splitlines(), 1):
        for m in LINK.finditer(line):
            yield n, m.group(1) or m.group(2)


def rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_relative_links_resolve(page):
    bad = []
    for n, target in links(page):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{rel(page)}:{n}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{rel(page)}:{n}: {target} (no heading #{anchor} in {dest.name})")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_named_repo_paths_exist(page):
    bad = []
    for n, line in enumerate(page.read_text().splitlines(), 1):
        for m in NAMED.finditer(line):
            path = m.group(1).rstrip(".")
            if "<" in path or not list(ROOT.glob(path)):
                bad.append(f"{rel(page)}:{n}: {path}")
    assert not bad, "\n".join(bad)


def test_the_checker_sees_a_broken_link(tmp_path):
    """The checks above can fail: a page with a dead link, a dead anchor and a dead named path."""
    page = tmp_path / "p.md"
    page.write_text("# Top\n[ok](#top) [gone](missing.md) [bad anchor](p.md#nowhere) `tools/no_such.py`\n"
                    "python tools/x.py --out docs/results/new.json; see `verl/gone.py::f`\n")
    found = [t for _, t in links(page)]
    assert found == ["#top", "missing.md", "p.md#nowhere"]
    assert anchors(page) == {"top"} and slug("Where we differ: the `reference`!") == "where-we-differ-the-reference"
    assert [m.group(1) for m in NAMED.finditer(page.read_text())] == ["tools/no_such.py", "tools/x.py", "verl/gone.py"]


def test_ci_runs_the_test_command_the_readme_gives():
    """.ci/run's last command is, byte for byte, a line of a code block of README.md's "Set up"."""
    ci = [line for line in (ROOT / ".ci/run").read_text().splitlines() if line.strip() and not line.startswith("#")]
    readme = (ROOT / "README.md").read_text()
    setup = readme.split("## Set up", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", setup, re.S)
    assert ci[-1].startswith("pip install") and "pytest" in ci[-1]
    assert any(ci[-1] in block.splitlines() for block in blocks), ci[-1]
