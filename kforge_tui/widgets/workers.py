"""The evaluation workers of a search on a Ray cluster, on one line under the status bar: each
worker's host and GPU, whether it is busy, idle or lost, and the evaluations it answered. Shown
while the engine runs and reports workers (a search on this machine's GPUs reports none)."""

from __future__ import annotations

from textual.widgets import Static

from kforge.core.inert import inert
from kforge.eval.process.cluster import WorkerStatus

SEPARATOR = " · "


def worker_label(worker: WorkerStatus) -> str:
    state = "lost" if worker.lost else "busy" if worker.busy else "idle"
    return f"{worker.node}:{worker.gpu} {state} {worker.done}"


def workers_line(workers: list[WorkerStatus], width: int) -> str:
    """``workers 2/3 busy · host-a:0 busy 12 · host-b:0 idle 9 · +1 more``, in ``width``
    columns; empty for no workers."""
    if not workers:
        return ""
    live = [w for w in workers if not w.lost]
    head = f"workers {sum(w.busy for w in live)}/{len(live)} busy"
    labels = [worker_label(w) for w in workers]
    for shown in range(len(labels), -1, -1):
        rest = len(labels) - shown
        parts = [head, *labels[:shown], *([f"+{rest} more"] if rest else [])]
        line = SEPARATOR.join(parts)
        if len(line) <= width:
            return line
    return head[:width]


class WorkersBar(Static):
    DEFAULT_CSS = """
    WorkersBar {
        dock: top; height: 1; padding: 0 1; margin-top: 1;
        background: $panel; color: $text-muted;
    }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(markup=False, **kwargs)  # worker names are stored text

    def on_mount(self) -> None:
        self.display = False

    def show(self, workers: list[WorkerStatus], engine_alive: bool, width: int) -> None:
        text = inert(workers_line(workers, width)) if engine_alive else ""
        self.display = bool(text)
        if text != self.content:
            self.update(text)
