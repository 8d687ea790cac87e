"""The docs: a short README, relative links that resolve, and a benchmark runner that writes
its results only to bench/results.* (never into the README)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "slurm" / "README.md",
        ROOT / "tests" / "tools" / "README.md"]


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)      # no headings in code
    return {slug(m) for m in re.findall(r"^#+ (.+)$", text, re.M)}


def links(path: Path):
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    for target in LINK.findall(text):
        if not re.match(r"[a-z]+:", target):                            # http:, https:, mailto:
            yield target


def test_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_slug_is_githubs():
    assert slug("Growing a running job (elastic scale-out)") == "growing-a-running-job-elastic-scale-out"
    assert slug("Layout, and reading a checkpoint with h5py") == "layout-and-reading-a-checkpoint-with-h5py"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_existing_files_and_headings(doc):
    assert doc.exists()
    bad = []
    for target in links(doc):
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists():
            bad.append(f"{target}: no file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading '#{anchor}' in {dest.name}")
    assert not bad, bad


def test_every_doc_is_linked_from_the_readme():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in links(ROOT / "README.md")}
    missing = [p.name for p in (ROOT / "docs").glob("*.md") if p.resolve() not in linked]
    assert not missing, missing


def test_a_dead_link_is_found(tmp_path):
    (tmp_path / "a.md").write_text("# Top\n[ok](b.md#there) [gone](c.md) [anchor](b.md#nowhere)\n")
    (tmp_path / "b.md").write_text("# There\n```\n# not a heading\n```\n")
    assert list(links(tmp_path / "a.md")) == ["b.md#there", "c.md", "b.md#nowhere"]
    assert anchors(tmp_path / "b.md") == {"there"}


def test_hpcps_bench_writes_no_readme():
    """``hpcps bench`` writes bench/results.* only: the README option and code are gone."""
    p = subprocess.run([sys.executable, "-m", "hpcps", "bench", "--readme", "--quick"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 2 and "unrecognized arguments: --readme" in p.stderr, p.stderr
    source = (ROOT / "hpcps" / "cli" / "bench.py").read_text()
    assert "README.md" not in source.replace("docs/benchmarks.md", "")
