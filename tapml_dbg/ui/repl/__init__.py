"""The interactive front end of `tapml-dbg replay`.

- `commands.py`: the one command table (name, aliases, usage, help, completer, handler) and the
  handlers; each handler returns a result object from `results.py` and never prints.
- `render.py`: turns those result objects into rich output on a console.
- `console.py`: rich rendering of the CLI commands' results (record, info, bisect, dump, carve,
  compile), progress bars and the one-line `error:`.
- `completion.py`: a pure `suggest(text, cursor, session)` plus a thin prompt-toolkit completer.
- `state.py`: what the REPL remembers beyond the engine (breakpoints, mode, verdicts seen).
- `app.py`: parsing a line, dispatching, catching errors by category, the prompt loop,
  the `-c` / `--script` runner, and `run_replay(args)` for the CLI.
"""
