"""Tab completion: a pure `suggest(text, cursor, session)` and a thin prompt-toolkit adapter.

`suggest` looks only at the text before the cursor, finds the command and the argument being
typed, asks the command table what that argument is (`Command.completion_for`), and returns
typed `Suggestion`s. Matching is case-insensitive by prefix; when nothing matches by prefix,
by substring (so `gelu` finds `gelu_1` and `blocks.1` finds `blocks.1.fc`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tapml_dbg.ui.repl.commands import COMMANDS, UnknownCommand, lookup

MAX_SUGGESTIONS = 200  # per completion request; a 2000-op model must not flood the menu


@dataclass(frozen=True)
class Suggestion:
    text: str
    start: int  # where the replaced word starts, relative to the cursor (<= 0)
    kind: str  # command | op | layer | keyword | path | breakpoint
    meta: str = ""


def _current_word(before: str) -> tuple[list[str], str]:
    """The finished words before the cursor and the word being typed ('' after a space)."""
    if not before or before[-1].isspace():
        return before.split(), ""
    words = before.split()
    return words[:-1], words[-1]


def _match(candidates: list[tuple[str, str, str]], word: str) -> list[tuple[str, str, str]]:
    low = word.lower()
    prefix = [c for c in candidates if c[0].lower().startswith(low)]
    if prefix or not low:
        return prefix
    return [c for c in candidates if low in c[0].lower()]


def suggest(text: str, cursor: int | None = None, session=None, debugger=None) -> list[Suggestion]:
    """Completions for `text` with the cursor at `cursor` (default: the end)."""
    before = text[: len(text) if cursor is None else cursor]
    before = before.split(";")[-1].lstrip()  # `-c`-style lines: complete the last command
    done, word = _current_word(before)
    start = -len(word)
    if not done:
        candidates = [(c.name, "command", c.summary) for c in COMMANDS]
        candidates += [(a, "command", f"alias of {c.name}") for c in COMMANDS for a in c.aliases
                       if len(a) > 1 and a.isalpha()]
        return [Suggestion(t, start, k, m) for t, k, m in _match(candidates, word)][:MAX_SUGGESTIONS]
    try:
        command = lookup(done[0])
    except UnknownCommand:
        return []
    spec = command.completion_for(done[1:])
    candidates: list[tuple[str, str, str]] = []
    for item in spec:
        if item == "<command>":
            candidates += [(c.name, "command", c.summary) for c in COMMANDS]
        elif item == "<op>" and session is not None:
            candidates += [(op.name, "op", f"#{op.index} {op.op}") for op in session.ops]
        elif item == "<layer>" and session is not None:
            candidates += [(layer, "layer", "layer") for layer in session.op_table.layers()]
        elif item == "<breakpoint>" and debugger is not None:
            candidates += [(str(bp.number), "breakpoint", bp.describe()) for bp in debugger.breakpoints]
        elif item == "<path>":
            return _paths(word)
        elif not item.startswith("<"):
            candidates.append((item, "keyword", ""))
    seen, unique = set(), []
    for candidate in _match(candidates, word):
        if candidate[0] not in seen:
            seen.add(candidate[0])
            unique.append(candidate)
    return [Suggestion(t, start, k, m) for t, k, m in unique][:MAX_SUGGESTIONS]


def _paths(word: str) -> list[Suggestion]:
    """Directory entries completing `word` (the one completion kind that reads the disk)."""
    expanded = os.path.expanduser(word)
    folder, stem = os.path.split(expanded)
    try:
        entries = sorted(os.scandir(folder or "."), key=lambda e: e.name)
    except OSError:
        return []
    suggestions = []
    for entry in entries:
        if entry.name.startswith(stem) and (stem.startswith(".") or not entry.name.startswith(".")):
            shown = os.path.join(os.path.dirname(word), entry.name) + ("/" if entry.is_dir() else "")
            suggestions.append(Suggestion(shown, -len(word), "path", "dir" if entry.is_dir() else ""))
    return suggestions[:MAX_SUGGESTIONS]


def make_completer(session, debugger=None):
    """A prompt-toolkit `Completer` that only maps `suggest`'s results."""
    from prompt_toolkit.completion import Completer, Completion

    class ReplCompleter(Completer):
        def get_completions(self, document, complete_event):
            before = document.text_before_cursor
            for s in suggest(before, len(before), session, debugger):
                yield Completion(s.text, start_position=s.start, display_meta=s.meta)

    return ReplCompleter()
