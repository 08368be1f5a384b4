"""
The documents hold together: every relative link and anchor of README.md, docs/ and bench/README.md leads somewhere,
docs/architecture.md's diagrams name modules that exist, and every measurement in docs/results.md names its date,
machine and commit.
"""

import os
import re
import subprocess

import pytest

from tests.support.paths import REPO as ROOT

DOCS = ["README.md", "bench/README.md"] + sorted(
    f"docs/{name}" for name in os.listdir(os.path.join(ROOT, "docs")) if name.endswith(".md")
)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def read(path: str) -> str:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def without_code(text: str) -> str:
    """The text outside fenced code blocks (links and headings inside them are not links and headings)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def anchors(text: str) -> set[str]:
    """GitHub's anchors of a Markdown text's headings: lower case, punctuation dropped, spaces to hyphens."""
    found, seen = set(), {}
    for heading in re.findall(r"^#{1,6} (.+)$", without_code(text), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def test_anchor_rule_is_githubs():
    text = "# Results\n## The main job: open-domain QA over Wikipedia (`make demo`)\n## Results\n"
    assert anchors(text) == {"results", "the-main-job-open-domain-qa-over-wikipedia-make-demo", "results-1"}


@pytest.mark.parametrize("doc", DOCS)
def test_relative_links_and_anchors_lead_somewhere(doc):
    text = without_code(read(doc))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
        if not os.path.exists(os.path.join(ROOT, resolved)):
            broken.append(f"{target} (no {resolved})")
        elif anchor and resolved.endswith(".md") and anchor not in anchors(read(resolved)):
            broken.append(f"{target} (no heading #{anchor} in {resolved})")
    assert not broken, f"{doc}: links that lead nowhere: {broken}"


def test_architecture_diagrams_name_existing_modules():
    text = read("docs/architecture.md")
    diagrams = re.findall(r"^```mermaid\n(.*?)^```", text, flags=re.S | re.M)
    assert len(diagrams) >= 2, "docs/architecture.md: the question's path and the index refresh, as Mermaid diagrams"
    assert any("RealmReindexCallback" in d for d in diagrams) and any("pipeline" in d for d in diagrams)
    for diagram in diagrams:
        assert diagram.lstrip().startswith(("sequenceDiagram", "flowchart", "graph"))
        for module in re.findall(r"[\w/]+\.py", diagram):
            assert os.path.exists(os.path.join(ROOT, "src", "realm_hf", module)), module


def test_architecture_keeps_no_line_counts():
    """Line counts kept by hand go stale: the size limits live in tests/architecture/test_module_sizes.py."""
    counts = re.findall(r"\b\d[\d,]* lines\b", read("docs/architecture.md"))
    assert not counts, counts


def results_sections() -> list[tuple[str, str]]:
    """(heading, body) of each section of docs/results.md that reports measurements (it holds a table or numbers)."""
    text = read("docs/results.md")
    parts = re.split(r"^(#{2,3} .+)$", text, flags=re.M)
    return [(parts[i].strip("# "), parts[i + 1]) for i in range(1, len(parts), 2)]


MACHINES = ("xeon-amx", "epyc-bf16", "epyc-avx2", "epyc")
# Sections that describe how to read or make the results rather than report one.
NOT_MEASUREMENTS = {"Pictures of a run"}
# Sections of several measurements, each a paragraph that starts with its name in bold.
SUMMARIES = {"Speed and memory"}


def measurements() -> list[tuple[str, str]]:
    found = []
    for heading, body in results_sections():
        if heading in SUMMARIES:
            found += [(f"{heading}: {part[:40]}", part) for part in re.split(r"\n\n(?=\*\*)", body)[1:]]
        elif heading not in NOT_MEASUREMENTS:
            found.append((heading, body))
    return found


def test_every_result_names_its_date_machine_and_commit():
    missing = []
    for heading, body in measurements():
        if not re.search(r"\d\.\d", body):
            continue
        if not re.search(r"\b20\d\d-\d\d-\d\d\b", body):
            missing.append(f"{heading}: no date")
        if not any(f"`{machine}`" in body for machine in MACHINES):
            missing.append(f"{heading}: no machine")
        if not re.search(r"`[0-9a-f]{7,40}`", body):
            missing.append(f"{heading}: no commit")
    assert not missing, missing


def test_the_commits_results_name_exist():
    shallow = subprocess.run(
        ["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    if shallow != "false":
        pytest.skip("a shallow clone (or no git) holds only part of the history")
    commits = set(re.findall(r"`([0-9a-f]{7,40})`", read("docs/results.md") + read("bench/README.md")))
    unknown = [
        c for c in sorted(commits) if subprocess.run(["git", "cat-file", "-e", f"{c}^{{commit}}"], cwd=ROOT).returncode
    ]
    assert not unknown, f"commits named as where a measurement was recorded that the history does not hold: {unknown}"


REPO_PATH = re.compile(
    r"(?<![\w/.-])((?:tests|src|bench|examples|scripts|docs|model_cards)/[\w/.-]+\.(?:py|md|jsonl?|sh|yaml))"
)


@pytest.mark.parametrize("doc", DOCS)
def test_files_the_docs_name_exist(doc):
    """A test, script or module a document names is where it says (tests move; the docs follow)."""
    missing = sorted({path for path in REPO_PATH.findall(read(doc)) if not os.path.exists(os.path.join(ROOT, path))})
    assert not missing, f"{doc} names files that do not exist: {missing}"
