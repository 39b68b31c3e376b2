"""`tapml-dbg report`: the engine's `ErrorReport` drawn as one self-contained HTML page.

- `chart.py`: the per-op error chart, the migration curve and a generation's per-step chart (matplotlib,
  inline SVG);
- `html.py`: the page (headline, chart, culprit card, causes, a generation's steps, migration, summary,
  op table) and its folder.
- `model_explorer.py`: `--model-explorer`: the op graph and per-op error as Model Explorer JSON.
"""
