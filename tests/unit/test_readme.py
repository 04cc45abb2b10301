"""The README stays a five-minute map: short, with a table of contents, every link landing (the docs' too),
every doc listed in docs/index.md, every figure it quotes stated in a doc linked from the same section
(where the figure's command and context live), and no doc naming a module or file of the tree that moved.
The checkers are plain functions, run on the real files and on small made-up ones on which they must fail."""

import re
from pathlib import Path

import pytest

from helpers import ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"
INDEX = DOCS / "index.md"
MAX_README_LINES = 200

# [text](target) and ![alt](target), an optional "title" after the target.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.I)
# A figure is a decimal (0.89, 23.1, 2.13.0) or an integer with a unit (7 minutes, 986 steps, 1 Gbit/s, 13 %, 2x).
UNITS = (
    r"Gbit/s|Mbit/s|gbit|mbit|samples/s|words/s|GiB|MiB|KiB|GB|MB|KB|ms|s|min|minutes|h|hours|"
    r"steps|epochs|cores"
)
FIGURE = re.compile(rf"(?<![\w.])(\d+(?:\.\d+)+|\d+(?:\s?(?:{UNITS})(?![\w/])|\s?%|x(?!\w)))")


def links(text: str) -> list[str]:
    """Link targets outside fenced code blocks, in order."""
    return LINK.findall(FENCE.sub("", text))


def is_relative(target: str) -> bool:
    return not re.match(r"[a-z][a-z0-9+.-]*:", target, re.I)


def slugs(text: str) -> set[str]:
    """GitHub's anchors for the headings of a Markdown file (a repeated heading gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", text).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(path: Path) -> list[str]:
    """Relative links of ``path`` whose file does not exist, or whose #anchor names no heading there."""
    bad = []
    for target in links(path.read_text()):
        if not is_relative(target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in slugs(dest.read_text()):
            bad.append(f"{target}: no heading with that anchor in {dest.name}")
    return bad


def linked_docs(path: Path, text: str | None = None) -> list[Path]:
    """The Markdown files that ``text`` (default: all of ``path``) links to directly, ``path`` excluded."""
    out = []
    for target in links(path.read_text() if text is None else text):
        file_part = target.partition("#")[0]
        if is_relative(target) and file_part.endswith(".md"):
            dest = (path.parent / file_part).resolve()
            if dest.exists() and dest != path.resolve() and dest not in out:
                out.append(dest)
    return out


def figures(text: str) -> list[str]:
    """The figures a text quotes, link targets and URLs left out (a version in a URL is not a claim)."""
    text = URL.sub(" ", LINK.sub(lambda m: m.group(0)[: m.group(0).index("](")], text))
    return [" ".join(f.split()) for f in FIGURE.findall(text)]


def figure_pattern(figure: str) -> re.Pattern:
    """Where a doc states ``figure``: the same digits (not part of a longer number), and the same unit."""
    m = re.match(r"\d+(?:\.\d+)*", figure)
    assert m, f"{figure!r}: a figure starts with digits"
    number = m.group(0)
    unit = figure[len(number) :].strip()
    tail = rf"\s?{re.escape(unit)}(?![\w/])" if unit else r"(?!\.?\d)"
    return re.compile(rf"(?<![\w.]){re.escape(number)}{tail}")


def sections(text: str) -> list[str]:
    """The text before the first ``## `` heading, then each ``## `` section with its subsections."""
    return re.split(r"^(?=## )", text, flags=re.M)


def unbacked_figures(readme: Path) -> list[str]:
    """Figures of ``readme`` that no doc linked from the same ``## `` section states: whoever reads a figure
    finds its source one link away, next to it."""
    bad = set()
    for section in sections(readme.read_text()):
        docs = " ".join(" ".join(p.read_text().split()) for p in linked_docs(readme, section))
        bad |= {f for f in figures(section) if not figure_pattern(f).search(docs)}
    return sorted(bad)


PACKAGES = ("allreduce_train", "lab", "launch", "models")
MODULE = re.compile(r"python -m ([A-Za-z_][\w.]*)")
# A file of the tree named in prose or code: a top-level folder, then a name with an extension (no glob).
TREE_FILE = re.compile(
    r"(?<![\w/.-])((?:allreduce_train|lab|launch|models|tools|tests|deploy|third_party)/"
    r"[\w./-]*\.(?:py|sh|rules|patch|toml|txt|json|yaml|png))(?![\w*])"
)


def missing_names(text: str, root: Path = ROOT) -> list[str]:
    """`python -m` modules of this project and files of the tree that ``text`` names but that do not exist:
    what a move of code leaves behind in the docs."""
    bad = []
    for module in MODULE.findall(text):
        path = root.joinpath(*module.split("."))
        if module.split(".")[0] in PACKAGES and not (
            path.with_suffix(".py").exists() or (path / "__init__.py").exists()
        ):
            bad.append(f"python -m {module}")
    bad += [f for f in TREE_FILE.findall(text) if not (root / f).exists()]
    return sorted(set(bad))


def test_the_readme_is_at_most_200_lines():
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines; move details into docs/ (limit {MAX_README_LINES})"


MARKDOWN = [README, INDEX] + sorted(p for p in DOCS.glob("*.md") if p != INDEX)


@pytest.mark.parametrize("path", MARKDOWN, ids=[str(p.relative_to(ROOT)) for p in MARKDOWN])
def test_every_relative_link_lands_on_a_file_and_heading_that_exist(path):
    if path in (README, INDEX):
        assert links(path.read_text()), f"{path.name} links nothing"
    assert broken_links(path) == []


@pytest.mark.parametrize("path", MARKDOWN, ids=[str(p.relative_to(ROOT)) for p in MARKDOWN])
def test_every_module_and_file_of_the_tree_that_a_doc_names_exists(path):
    assert missing_names(path.read_text()) == []


def test_every_doc_is_listed_in_the_index_and_the_readme_links_the_index():
    docs = {p.resolve() for p in DOCS.glob("*.md")} - {INDEX.resolve()}
    assert len(docs) >= 10
    unlisted = sorted(p.name for p in docs - set(linked_docs(INDEX)))
    assert unlisted == [], f"docs/index.md lists no line for {unlisted}"
    assert INDEX.resolve() in linked_docs(README)


def test_the_contents_link_every_section_after_them():
    text = README.read_text()
    _, _, rest = text.partition("\n## Contents\n")
    assert rest, "README.md has no '## Contents' section"
    contents, _, sections = rest.partition("\n## ")
    after = list(slugs("## " + sections))
    listed = {t[1:] for t in links(contents) if t.startswith("#")}
    assert len(after) >= 4
    assert set(after) <= listed, f"sections missing from the contents: {sorted(set(after) - listed)}"


def test_every_figure_in_the_readme_is_stated_in_a_doc_linked_from_its_section():
    quoted = figures(README.read_text())
    assert len(quoted) >= 5  # the headline result quotes figures; an empty list would test nothing
    assert unbacked_figures(README) == []


def test_the_checkers_catch_a_figure_without_a_doc_a_broken_link_and_a_wrong_anchor(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Measured: `make x`\n\nIt took 23.1 s and 986 steps, at 1 Gbit/s.\n")
    (tmp_path / "docs" / "b.md").write_text("# Other\n\nAccuracy 0.8905 after 7 minutes.\n")
    readme = tmp_path / "README.md"
    readme.write_text("Took 23.1 s in 986 steps at 1 Gbit/s ([a](docs/a.md#measured-make-x)).\n")
    assert broken_links(readme) == [] and unbacked_figures(readme) == []

    # b.md states 0.8905 and 7 minutes, but the README does not link it; 0.89 is not 0.8905; 986 epochs is
    # not 986 steps; 2.18x is nowhere.
    readme.write_text(
        "0.89 after 7 minutes, 986 epochs, 2.18x ([a](docs/a.md), [c](docs/c.md#x), [a](docs/a.md#nothing-here)).\n"
    )
    assert unbacked_figures(readme) == ["0.89", "2.18", "7 minutes", "986 epochs"]
    assert broken_links(readme) == [
        "docs/c.md#x: no such file",
        "docs/a.md#nothing-here: no heading with that anchor in a.md",
    ]

    # The doc that states 23.1 is linked, but from another section.
    readme.write_text("## One\n\nTook 23.1 s.\n\n## Two\n\n[a](docs/a.md)\n")
    assert unbacked_figures(readme) == ["23.1"]

    # A module and a file that moved away; a glob and a path outside the tree are not names of files here.
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "__init__.py").write_text("")
    (tmp_path / "lab" / "probe.py").write_text("")
    text = (
        "`python -m lab.probe bench`, `python -m lab.netns bench`, `python -m pytest`, lab/probe.py, "
        "tests/launch/test_netns.py, tools/patches/horovod-*.patch, /opt/x/lab/gone.py"
    )
    assert missing_names(text, tmp_path) == ["python -m lab.netns", "tests/launch/test_netns.py"]
