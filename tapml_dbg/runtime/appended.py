"""A file that processes append whole lines to, each in one `write`, read by another as it grows."""

from __future__ import annotations


class AppendedLines:
    """The lines appended since the last read (`new`); a line still being written waits for its end."""

    def __init__(self, path: str):
        self.path = path
        self._offset = 0

    def new(self) -> list[str]:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except OSError:
            return []
        complete = data[:data.rfind(b"\n") + 1]
        self._offset += len(complete)
        return complete.decode(errors="replace").splitlines()
