"""The selected search node in two tabbed panes: its code (kernel and launch plan), and its details
(the evaluation report, the LLM exchange) beside the session log."""

from __future__ import annotations

from textual.widgets import TabPane

from kforge.core.inert import inert
from kforge.store.records import NodeDetail
from kforge_tui.follow import LOG_TAIL
from kforge_tui.format import eval_report, llm_report, plan_text
from kforge_tui.widgets.code_view import CodeView
from kforge_tui.widgets.panes import PaneTabs
from kforge_tui.widgets.wrapping_log import WrappingLog


class NodeCode(PaneTabs):
    """kernel.cu and plan.json of the selected node."""

    def __init__(self, id: str | None = None) -> None:
        super().__init__(TabPane("kernel.cu", CodeView("cuda", id="kernel"), id="tab-kernel"),
                         TabPane("plan.json", CodeView(id="plan"),
                                 id="tab-plan"), id=id)

    def show_hint(self, text: str) -> None:
        self.query_one("#kernel", CodeView).show_text(text)

    def show_node(self, detail: NodeDetail) -> None:
        candidate = detail.candidate
        waiting = "(no kernel: " + detail.row.status.replace("_", " ") + ")"
        self.query_one("#kernel", CodeView).show_text(candidate.source if candidate else waiting)
        self.query_one("#plan", CodeView).show_text(plan_text(candidate))


class NodeLogs(PaneTabs):
    """The selected node's evaluation report and LLM exchange, and the session log."""

    def __init__(self, id: str | None = None) -> None:
        super().__init__(TabPane("eval", CodeView(id="eval"), id="tab-eval"),
                         TabPane("llm", CodeView(id="llm"), id="tab-llm"),
                         TabPane("session log", WrappingLog(max_lines=LOG_TAIL, id="log"),
                                 id="tab-log"), id=id)

    def show_hint(self, text: str) -> None:
        self.query_one("#eval", CodeView).show_text(text)

    def show_node(self, detail: NodeDetail) -> None:
        self.query_one("#eval", CodeView).show_text(eval_report(detail))
        self.query_one("#llm", CodeView).show_text(llm_report(detail))

    def restart_log(self, lines: list[str]) -> None:
        log = self.query_one("#log", WrappingLog)
        log.clear()
        log.write_lines(map(inert, lines))

    def add_log(self, lines: list[str]) -> None:
        self.query_one("#log", WrappingLog).write_lines(map(inert, lines))
