"""Small, safe parsers for command lines: no `eval` anywhere.

`split_commands` splits `-c "cmd; cmd"`; `tokenize` splits one command into words;
`parse_slice` turns numpy-style text such as `0,:4` or `...,-1` into an index tuple.
"""

from __future__ import annotations

import math
import re
import shlex

from tapml_dbg.errors import UsageError


class ArgError(UsageError):
    """Bad arguments to a command; the REPL prints the message and the command's usage line."""


def split_commands(text: str) -> list[str]:
    """Split on `;` and newlines outside quotes; drop blanks and `#` comment lines."""
    commands, current, quote = [], [], ""
    for char in text:
        if quote:
            current.append(char)
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
            current.append(char)
        elif char in ";\n":
            commands.append("".join(current))
            current = []
        else:
            current.append(char)
    commands.append("".join(current))
    return [c.strip() for c in commands if c.strip() and not c.strip().startswith("#")]


def tokenize(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=False, posix=True)
    except ValueError as exc:  # "No closing quotation"
        raise UsageError(f"cannot parse the line: {exc}") from None


_INT = re.compile(r"^[+-]?\d+$")


def parse_int(text: str, what: str, minimum: int | None = None) -> int:
    if not _INT.match(text.strip()):
        raise ArgError(f"{what} must be an integer, not {text!r}")
    value = int(text)
    if minimum is not None and value < minimum:
        raise ArgError(f"{what} must be at least {minimum}, not {value}")
    return value


def parse_float(text: str, what: str, positive: bool = False) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ArgError(f"{what} must be a number, not {text!r}") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ArgError(f"{what} must be a finite {'positive' if positive else 'non-negative'} number, "
                       f"not {text!r}")
    return value


def parse_slice(text: str) -> tuple:
    """`0,:4` -> (0, slice(None, 4)); `...,-1` -> (Ellipsis, -1); `1:8:2` -> (slice(1, 8, 2),).

    Only integers, `:` slices and one `...` are accepted; anything else is an ArgError.
    """
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if not text.strip():
        raise ArgError("the slice is empty; write it numpy-style, e.g. 0,:4")
    items: list = []
    for part in text.split(","):
        part = part.strip()
        if part == "...":
            if Ellipsis in items:
                raise ArgError("a slice may hold only one `...`")
            items.append(Ellipsis)
        elif ":" in part:
            bounds = part.split(":")
            if len(bounds) > 3:
                raise ArgError(f"bad slice item {part!r}: at most start:stop:step")
            values = []
            for bound in bounds:
                bound = bound.strip()
                if not bound:
                    values.append(None)
                elif _INT.match(bound):
                    values.append(int(bound))
                else:
                    raise ArgError(f"bad slice item {part!r}: bounds must be integers")
            if len(values) == 3 and values[2] == 0:
                raise ArgError(f"bad slice item {part!r}: the step cannot be 0")
            items.append(slice(*values))
        elif _INT.match(part):
            items.append(int(part))
        else:
            raise ArgError(f"bad slice item {part!r}: use integers, start:stop[:step] or ...")
    return tuple(items)


def format_slice(index: tuple) -> str:
    parts = []
    for item in index:
        if item is Ellipsis:
            parts.append("...")
        elif isinstance(item, slice):
            text = f"{'' if item.start is None else item.start}:{'' if item.stop is None else item.stop}"
            if item.step is not None:
                text += f":{item.step}"
            parts.append(text)
        else:
            parts.append(str(item))
    return ",".join(parts)
