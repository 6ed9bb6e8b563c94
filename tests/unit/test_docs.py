"""The hand-written docs stay true to the code: the README short, every path they name present, the one loop
diagram the same in the README and docs/architecture.md and agreeing with docs/topics.md, and docs/topics.md
listing every topic of shared/contracts/topics.py as it is laid out.

Docs drift silently when files move (the layout refactoring left "faust_runtime.py" and "services/loop" in
prose) and when a consumer is added without its arrow (the old diagram had the extractor reading
interactions and the trainer drawn twice). docs/settings.md is generated and checked by its own test.
"""

from __future__ import annotations

import re
from pathlib import Path

from shared.contracts.topics import SPECS

REPO = Path(__file__).resolve().parents[2]
HAND_WRITTEN = ["README.md", "SECURITY.md",
                *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md") if p.name != "settings.md")]
README_MAX_LINES = 220
"""A newcomer reads it in five minutes; the rest lives in docs/."""

ROOTS = ("services/", "shared/", "tools/", "docs/", "tests/", "load/", "protos/", "compose/", "deploy/",
         "clients/", "examples/")
PATH_TOKEN = re.compile(r"(?<![\w./-])((?:" + "|".join(map(re.escape, ROOTS)) + r")[\w./@-]*)")
LINK = re.compile(r"\]\((?!https?:|#|mailto:)([^)#\s]+)")


def _names_something(token: str) -> bool:
    """A repository path as the docs write them: a file or folder, `module.py::test`, `module.attribute`
    (`shared/rpc/grpc_util.create_server`); placeholders (`services/<name>/`) and globs pass."""
    token = token.split("::")[0].rstrip(".,;:")
    if any(c in token for c in "<*{"):
        return True
    if (REPO / token).exists():
        return True
    module = re.match(r"^(.*?\.py)\.\w+", token) or re.match(r"^(.*)\.\w+$", token)
    return module is not None and any((REPO / m).exists() for m in (module[1], module[1] + ".py"))


def test_every_path_the_docs_name_exists() -> None:
    missing = []
    for doc in HAND_WRITTEN:
        in_code = False
        for n, line in enumerate((REPO / doc).read_text().splitlines(), 1):
            in_code ^= line.startswith("```")
            missing += [f"{doc}:{n}: {t}" for t in PATH_TOKEN.findall(line) if not _names_something(t)]
            missing += [f"{doc}:{n}: link {t}" for t in ([] if in_code else LINK.findall(line))
                        if not ((REPO / doc).parent / t).exists()]   # Markdown links are relative to their page
    assert not missing, "paths named in the docs that do not exist:\n" + "\n".join(missing)


def test_the_readme_is_short_and_points_to_the_rest() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES, len(readme.splitlines())
    pages = {"docs/architecture.md", "docs/layout.md", "docs/demo.md", "docs/integration.md", "docs/topics.md",
             "docs/operations.md", "docs/deployment.md", "docs/settings.md", "SECURITY.md"}
    assert {p for p in pages if f"`{p}`" not in readme} == set()
    assert "make demo" in readme and "make test" in readme


# --- the loop diagram and the topics table ----------------------------------------------------------------
DIAGRAM = re.compile(r"```mermaid\n(.*?)```", re.S)
TOPIC_EDGE = re.compile(r'^\s*(\w+) -- "?([^"]+?)"? --> (\w+)\s*$')


def _diagram(doc: str) -> str:
    found = DIAGRAM.findall((REPO / doc).read_text())
    assert len(found) == 1, f"{doc}: {len(found)} mermaid diagrams, expected the loop's one"
    return str(found[0])


def _topic_edges(diagram: str) -> set[tuple[str, str, str]]:
    """(producer, topic short name, consumer) for each thin arrow `a -- "t1, t2" --> b`."""
    edges = set()
    for line in diagram.splitlines():
        m = TOPIC_EDGE.match(line)
        if m:
            edges |= {(m[1], t.strip(), m[3]) for t in m[2].split(",")}
    return edges


def _topics_table() -> dict[str, dict[str, str]]:
    """docs/topics.md's table: contract name -> its columns."""
    rows = {}
    for line in (REPO / "docs" / "topics.md").read_text().splitlines():
        if line.startswith("| `apprentice."):
            cells = [c.strip() for c in line.strip("|").split("|")]
            topic, key, value, layout, producers, consumers = cells
            rows[topic.strip("`")] = {"key": key, "value": value, "layout": layout,
                                      "producers": producers, "consumers": consumers}
    return rows


def _short(topic: str) -> str:
    return topic.split(".")[1]


def test_the_readme_and_the_architecture_draw_the_same_loop() -> None:
    assert _diagram("README.md") == _diagram("docs/architecture.md")


def test_the_diagram_agrees_with_the_topics_table() -> None:
    """Every arrow is a producer and a consumer of its topic in docs/topics.md, and every (producer, consumer)
    pair of that table between two boxes of the diagram has its arrow."""
    edges = _topic_edges(_diagram("README.md"))
    boxes = {e[0] for e in edges} | {e[2] for e in edges}
    table = {_short(name): row for name, row in _topics_table().items()}
    wrong = [e for e in edges if e[1] not in table or e[0] not in table[e[1]]["producers"].split(", ")
             or e[2] not in table[e[1]]["consumers"].split(", ")]
    assert not wrong, f"arrows docs/topics.md does not have: {wrong}"
    undrawn = [(p, t, c) for t, row in table.items() for p in row["producers"].split(", ")
               for c in row["consumers"].split(", ") if p != c and p in boxes and c in boxes and (p, t, c) not in edges]
    assert not undrawn, f"docs/topics.md pairs without an arrow: {undrawn}"
    # the two mistakes of the old diagram
    assert ("inference", "interactions", "extractor") not in edges
    assert ("grader", "graded", "extractor") in edges


def test_the_topics_table_lists_every_topic_as_laid_out() -> None:
    table = _topics_table()
    assert set(table) == {s.name for s in SPECS}
    for spec in SPECS:
        layout = table[spec.name]["layout"]
        assert layout.startswith(f"{spec.partitions},"), (spec.name, layout)
        assert ("compacted" in layout) == spec.compacted, (spec.name, layout)
        assert table[spec.name]["producers"] and table[spec.name]["consumers"], spec.name
