"""`tapml-dbg report` (and `bisect --report`): the report folder written, from the trace opened on a target.

Both verdicts of every op, `--migrate`'s curve when asked, every divergence grouped by cause (free: the
verdicts are computed), the page, and `--model-explorer`'s files. The page offers command lines to type
(the culprit's dump and compare, each cause's dump): `spell(subcommand, *words)` writes one for this
trace and target, as the user would type it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tapml_dbg.engine.report import ErrorReport, build_report, migration_points
from tapml_dbg.engine.results import BisectResult
from tapml_dbg.engine.session import Session
from tapml_dbg.engine.triage import triage
from tapml_dbg.report.html import ReportWritten, prepare_folder, write_report
from tapml_dbg.report.model_explorer import ModelExplorerWritten, write_model_explorer

REPRO_FOLDER = "repro/"  # where the commands the page offers write a repro
Spell = Callable[..., str]  # (subcommand, *words) -> a `tapml-dbg` command line


def _noop(*_args, **_kwargs) -> None:
    return None


@dataclass
class ReportFolder:
    """What `report` wrote: the page, and Model Explorer's files when asked for."""

    page: ReportWritten
    explorer: ModelExplorerWritten | None = None

    @property
    def report(self) -> ErrorReport:
        return self.page.report

    def to_json(self) -> dict:
        return {"index": str(self.page.path), "bytes": self.page.bytes, "ops": len(self.report.points),
                "culprit": self.report.culprit.index if self.report.culprit else None,
                "dump_command": self.page.dump_command or None,
                "model_explorer": str(self.explorer.folder) if self.explorer else None}


@dataclass(frozen=True)
class ReportOptions:
    """What goes into the folder besides the page: `bisect`, a bisect's result (its culprit is the
    page's); `migrate`, the output's error per migration step; `model_explorer`, its files."""

    bisect: BisectResult | None = None
    migrate: bool = False
    model_explorer: bool = False


def write_report_folder(session: Session, folder: str | Path, spell: Spell, options: ReportOptions = ReportOptions(),
                        progress: Callable[..., None] = _noop) -> ReportFolder:
    """Write `folder/index.html` (and `folder/model_explorer/`); a folder that cannot hold it is refused
    before any work."""
    out = prepare_folder(folder)
    data = build_report(session, bisect=options.bisect, progress=progress)
    if options.migrate:
        data.migration = migration_points(session.migrate(progress=progress))
    data.causes = triage(session, points=data.points)  # the verdicts are computed: grouping them is free
    page = write_report(data, out, **_offered(data, spell))
    if not options.model_explorer:
        return ReportFolder(page)
    outline = session.reader.outline
    return ReportFolder(page, write_model_explorer(page.report, session.ops, outline.input_names,
                                                   outline.param_names, out))


def _offered(data: ErrorReport, spell: Spell) -> dict:
    """The command lines the page offers: the culprit's repro and verdicts, each cause's repro."""
    culprit = data.culprit
    causes = {group.first.index: _cause_dump(spell, group.first.index, group.first.name)
              for group in data.causes.groups}
    if culprit is None:
        return {"cause_commands": causes}
    return {"dump_command": spell("dump", "--op", str(culprit.index), "-o", REPRO_FOLDER),
            "replay_command": spell("replay") + f' -c "compare {culprit.index}"', "cause_commands": causes}


def _cause_dump(spell: Spell, index: int, name: str) -> str:
    """The repro of a cause's first op, in a folder named for it."""
    return spell("dump", "--op", str(index), "-o", f"{REPRO_FOLDER}{name}/")
