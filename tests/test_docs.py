"""The documentation speaks of the product (versions, dates, commits), points
at files that exist, and maps every module."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]
SOURCES = sorted(p for d in ("placer", "gnn", "evolution", "scripts", "examples", "tests")
                 for p in (ROOT / d).rglob("*.py") if p.name != "test_docs.py")
SOURCES.append(ROOT / "train_policy.py")

# "session" as software says it: pytest fixture scopes, HTTP/database/Optuna
# sessions and the like. Anything else speaks of how the project was made.
TECHNICAL = re.compile(
    r"""scope\s*=\s*["']session["']"""
    r"|session[- ]scoped"
    r"|\b(?:HTTP|http|SQLAlchemy|sqlalchemy|database|DB|SSH|ssh|tmux|TLS|requests|login"
    r"|interactive|Ray|ray|optuna|Optuna)\s+sessions?\b"
    r"|\w+\.Session\b|\bSession\(",
)
WORKSHOP = re.compile(r"session", re.IGNORECASE)
BRANCH = re.compile(r"\bs\d+-(?:runtime|learned|cost|dtfm|numba|serial|docs)\w*")


def workshop_words(text: str) -> list[str]:
    """Each use of 'session' outside the technical uses, and branch names
    such as ``s3-runtime``, with a little context."""
    allowed = [m.span() for m in TECHNICAL.finditer(text)]
    found = [m for m in WORKSHOP.finditer(text)
             if not any(a <= m.start() and m.end() <= b for a, b in allowed)]
    found += list(BRANCH.finditer(text))
    return [text[max(m.start() - 30, 0):m.end() + 30].replace("\n", " ") for m in found]


def test_workshop_words_are_found_and_technical_uses_are_not():
    assert workshop_words('@pytest.fixture(scope="session")\nan HTTP session') == []
    assert workshop_words("figures of session 9") and workshop_words("this Session's run")
    assert workshop_words("merged from branch s3-runtime2")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_pages_speak_of_versions_and_dates_not_sessions(page):
    hits = workshop_words(page.read_text())
    assert not hits, f"{page.relative_to(ROOT)}: say the date, version or commit instead: {hits}"


def test_sources_and_result_files_speak_of_versions_and_dates_not_sessions():
    files = SOURCES + sorted((ROOT / "docs" / "bench").glob("*.json"))
    hits = {str(p.relative_to(ROOT)): workshop_words(p.read_text()) for p in files}
    hits = {k: v for k, v in hits.items() if v}
    assert not hits, hits
    names = [p.name for p in (ROOT / "docs" / "bench").iterdir() if WORKSHOP.search(p.name)]
    assert not names, f"name result files by date or version: {names}"


def test_result_files_the_pages_cite_exist():
    cited = set()
    for page in (ROOT / "README.md", ROOT / "docs" / "BENCHMARKS.md"):
        cited |= set(re.findall(r"(?<![\w/.-])(docs/bench[\w./-]*\.(?:json|png))", page.read_text()))
    assert any(c.startswith("docs/bench/") for c in cited)
    missing = sorted(c for c in cited if not (ROOT / c).exists())
    assert not missing, missing


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_relative_links_in_docs_exist(page):
    targets = re.findall(r"\]\(([^)#\s]+)\)", page.read_text())
    missing = [t for t in targets if "://" not in t and not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(ROOT)}: {missing}"


def test_every_benchmark_section_has_a_date_and_a_command():
    text = (ROOT / "docs" / "BENCHMARKS.md").read_text()
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    assert len(sections) >= 4
    for section in sections:
        title = section.splitlines()[0]
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", section), f"BENCHMARKS.md, {title}: no date"
        assert re.search(r"`(?:sudo )?(?:placer|python|OMP_NUM_THREADS)[^`]*`|```bash", section), \
            f"BENCHMARKS.md, {title}: no command"


def test_architecture_names_every_module():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    named = set(re.findall(r"[\w./-]+\.(?:py|sh)", text))
    folder = None
    for line in text.splitlines():
        heading = re.match(r"#+ .*`([\w/]+/)`", line)
        if line.startswith("#"):
            folder = heading.group(1) if heading else None
            continue
        row = re.match(r"\| `([\w/]+\.py)`", line)
        if row and folder:
            named.add(folder + row.group(1))
    modules = [str(p.relative_to(ROOT)) for d in ("placer", "gnn", "evolution", "scripts")
               for p in sorted((ROOT / d).rglob("*")) if p.suffix in (".py", ".sh")]
    modules.append("train_policy.py")
    missing = [m for m in modules if m not in named]
    assert not missing, f"docs/ARCHITECTURE.md: add a line for each of {missing}"
