"""The interactive front end of `tapml-dbg replay`: a thin layer over `engine.session.Session`
and `engine.stops.Debugger`.

- `commands.py`: the one command table (name, aliases, usage, help, completer, handler) and the
  handlers; each handler calls the engine and returns a result object (engine results, or the
  few REPL-only ones of `results.py`); it never prints.
- `completion.py`: a pure `suggest(text, cursor, session)` plus a thin prompt-toolkit completer.
- `parsing.py`: splitting lines, numbers and numpy-style slices (never eval).
- `app.py`: parsing a line, dispatching, catching errors by category, the prompt loop,
  the `-c` / `--script` runner, and `run_replay(args)` for the CLI.
Drawing is `tapml_dbg.ui.render` (shared with the CLI); consoles and progress bars are
`tapml_dbg.ui.console`.
"""
