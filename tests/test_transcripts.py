"""Every transcript of README.md and docs/*.md is the tool's output today (tests/transcripts.py).

Each doc's transcripts are made again in a scratch folder, in document order, and compared line
by line with what the doc shows; only timings are blanked. A drift fails with the diff; after a
change to the tool's output, `python benchmarks/docs_check.py --transcripts --write` writes the
new output into the docs (review the diff: it is what users will read).
"""

from __future__ import annotations

import difflib

import pytest

import fork_cli
import transcripts as T

DOCS_WITH_TRANSCRIPTS = [doc for doc in T.DOCS if any(not t.file for t in T.transcripts(doc))]


def test_the_docs_hold_transcripts():
    names = {doc.name for doc in DOCS_WITH_TRANSCRIPTS}
    assert {"README.md", "repl.md", "migrate.md", "dump-example.md"} <= names
    readme = [t for t in T.transcripts(T.ROOT / "README.md") if not t.file]
    assert len(readme) == 2 and all(t.made_by for t in readme), "the first command's output and the session"


@pytest.mark.parametrize("doc", DOCS_WITH_TRANSCRIPTS, ids=lambda doc: doc.name)
def test_every_transcript_is_what_the_tool_prints(doc):
    drifted = []
    for found, outputs in T.make(doc, fork_cli.SERVER.shims()):
        for command, shown, printed in T.drift(found, outputs):
            diff = "\n".join(difflib.unified_diff(shown, printed, "the doc shows", "the tool prints", lineterm="", n=1))
            drifted.append(f"{found.name}: `{command}`\n{diff}")
    assert not drifted, ("transcripts drifted from the tool's output (python benchmarks/docs_check.py --transcripts "
                         "--write refreshes them):\n" + "\n\n".join(drifted))


def test_a_transcript_is_compared_exactly_but_for_timings(tmp_path):
    """A count or a size that changes is a drift; a timing is not."""
    doc = tmp_path / "doc.md"
    doc.write_text("```\n$ echo 'ran 3 ops in 1.25 s (4.0 KiB)'\nran 3 ops in 9.99 s (4.0 KiB)\n```\n\n"
                   "<!-- transcript: echo 'two'; echo 'lines' -->\n```\n$ shown\ntwo\nlines\n```\n"
                   "```\n$ echo 'mismatched 68 of 100'\nmismatched 11 of 100\n```\n"
                   "<!-- transcript varies: read \\d+ -->\n```\n$ echo 'read 7 (oob)'\nread 3 (oob)\n```\n")
    made = T.make(doc)
    assert [bool(T.drift(found, outputs)) for found, outputs in made] == [False, False, True, False]
    assert T.write(doc, made) == 1  # the count corrected; a timing or a value that varies by nature left
    assert "mismatched 68 of 100" in doc.read_text() and "in 9.99 s" in doc.read_text()
