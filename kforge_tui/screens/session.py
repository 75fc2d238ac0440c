"""One session in four panes: the op profile, the live search tree of the selected op, the selected
node's kernel and launch plan, and its logs beside the session log. The screen composes one widget
per pane, routes what its workers report (by message) to them, and carries the keys' actions."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.events import Resize
from textual.widgets import DataTable, Tree

from kforge.core.candidate import Candidate
from kforge.errors import KforgeError
from kforge.eval.process.cluster import workers_of
from kforge.store import CardStatus, CommandKind, SessionStatus, Store
from kforge.store.commands import HELD_STATUSES, NoRunningSearch, issue
from kforge.store.events import LogLine
from kforge.store.records import CardRow, NodeDetail
from kforge_tui.commands import PaletteCommand
from kforge_tui.diffing import candidate_diff
from kforge_tui.follow import follow_session, log_line, poll_wait
from kforge_tui.format import focus_of, no_best_text, node_name, op_facts
from kforge_tui.header import session_header
from kforge_tui.legend import HEADER, OPS, TREE, Legend
from kforge_tui.messages import (
    ErrorRaised,
    NodeLoaded,
    Notice,
    SearchNotRunning,
    SessionChanged,
    SessionSnapshot,
    SessionState,
)
from kforge_tui.screens.backdrop import Backdrop
from kforge_tui.screens.dialogs import Ask, Choose, DiffView, Reading, facts_table
from kforge_tui.search_model import NodeFilter, SearchModel
from kforge_tui.widgets.footer import KeysFooter
from kforge_tui.widgets.node_view import NodeCode, NodeLogs
from kforge_tui.widgets.panes import PANE_TITLES, PANES, Pane, PaneGrid
from kforge_tui.widgets.search_tree import SearchTree
from kforge_tui.widgets.status_bar import StatusBar
from kforge_tui.widgets.tables import OpTable
from kforge_tui.widgets.workers import WorkersBar

REPAINT_S = 0.25  # how often changed tree figures are redrawn
NO_NODE_YET = "select a node in the search tree (2)"
# Where what a key acts on shows: a search node on its tree line, or by its number atop its
# kernel; an op on its row, or atop its search tree. There the key acts at once; in another
# pane it names what it would act on and asks first, and the footer does not offer it.
SHOWN_IN = {"node": frozenset({"tree", "code"}), "op": frozenset({"ops", "tree"})}
ACTS_ON = {"prune": "node", "unprune": "node", "diff": "node", "focus_op": "op"}
# Keys that work in some panes only: the footer offers them there.
WORKS_IN = {"filter": frozenset({"ops", "tree"})}
LEGENDS = {"ops": OPS, "tree": TREE}  # the legend of the symbols a pane shows


async def read_node(store: Store, node_id: int) -> tuple[NodeDetail, Candidate | None]:
    """A node's detail and its parent's candidate (to diff against)."""
    detail = await store.get_node(node_id)
    parent = (await store.get_node(detail.row.parent_id)).candidate \
        if detail.row.parent_id else None
    return detail, parent


class SessionScreen(Backdrop):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "back", id="back"),
        # 1-4 choose the panes in their numbered order.
        *(Binding(str(number), f"pane('{name}')", PANE_TITLES[name].split(" ", 1)[1],
                  show=False, id=f"pane_{name}") for number, name in enumerate(PANES, 1)),
        Binding("tab", "cycle_pane(1)", "next pane", show=False, id="next_pane"),
        Binding("shift+tab", "cycle_pane(-1)", "previous pane", show=False, id="prev_pane"),
        Binding("right_square_bracket", "cycle_tab(1)", "next tab", show=False, id="next_tab"),
        Binding("left_square_bracket", "cycle_tab(-1)", "previous tab", show=False,
                id="prev_tab"),
        Binding("x", "prune", "prune", id="prune"),
        Binding("u", "unprune", "unprune", show=False, id="unprune"),
        Binding("p", "pause", "pause", id="pause"),
        Binding("r", "resume", "resume", show=False, id="resume"),
        Binding("S", "stop", "stop", show=False, id="stop"),
        Binding("b", "best", "best", id="best"),
        Binding("d", "diff", "diff", id="diff"),
        Binding("f", "focus_op", "focus", id="focus"),
        Binding("slash", "filter", "filter", id="filter"),
    ]

    def __init__(self, session_id: int) -> None:
        super().__init__()
        self.session_id = session_id
        self.model = SearchModel()
        self.state: SessionState | None = None
        self.detail: NodeDetail | None = None
        self.parent_candidate: Candidate | None = None
        self.engine_dead = False  # the engine was seen dead (and the user told so)

    def compose(self) -> ComposeResult:
        yield StatusBar(f"session {self.session_id}: loading…", id="topbar")
        yield WorkersBar(id="workers")
        # The op column stays put where even the columns the table keeps do not fit (a
        # terminal under 80 columns) and it scrolls sideways.
        yield PaneGrid(Pane("ops", OpTable(id="ops", fixed_columns=1)),
                       Pane("code", NodeCode(id="code-tabs")),
                       Pane("tree", SearchTree(self.model, id="tree")),
                       Pane("logs", NodeLogs(id="log-tabs")), id="panes")
        yield KeysFooter()

    def on_mount(self) -> None:
        self.query_one(NodeCode).show_hint(NO_NODE_YET)
        self.query_one(NodeLogs).show_hint(NO_NODE_YET)
        self.grid.fit(self.size.width, self.size.height)
        self.set_interval(REPAINT_S, self.query_one(SearchTree).repaint_if_dirty)
        self.app.gpu_known_signal.subscribe(self, lambda _gpu: self.show_bar())
        self.app.engine_starting_signal.subscribe(
            self, lambda session_id: session_id == self.session_id and self.show_bar())
        self.follow()
        self.action_pane("ops")

    # ----- panes -----

    @property
    def grid(self) -> PaneGrid:
        return self.query_one(PaneGrid)

    @property
    def active(self) -> str:
        return self.grid.active

    @property
    def compact(self) -> bool:
        return self.grid.compact

    def on_resize(self, event: Resize) -> None:
        self.grid.fit(event.size.width, event.size.height)
        self.show_bar()

    def action_pane(self, name: str) -> None:
        self.grid.choose(name)

    def action_cycle_pane(self, step: int) -> None:
        self.grid.step(step)

    def action_cycle_tab(self, step: int) -> None:
        self.grid.cycle_tab(step)

    def footer_label(self, action: str, words: str) -> str | None:
        """What the footer says for a key here (None: it leaves the key out): only the keys
        that act on what the focused pane shows, in the words of what they do now."""
        panes = SHOWN_IN[ACTS_ON[action]] if action in ACTS_ON else WORKS_IN.get(action)
        if panes is not None and self.active not in panes:
            return None
        return "resume" if action == "pause" and self.paused else words

    @property
    def paused(self) -> bool:
        return self.state is not None and self.state.session.status == SessionStatus.PAUSED

    # ----- following the store -----

    @work(exclusive=True, group="follow")
    async def follow(self) -> None:
        store = await self.app.open_store()
        if store is None:
            return
        try:
            await follow_session(store, self.session_id, self.post_message,
                                 lambda: poll_wait(self, self.app.poll_s))
        except KforgeError as exc:
            self.post_message(ErrorRaised(str(exc)))
            if self.state is None:  # nothing of it to show (no such session): back to the list
                self.app.pop_screen()

    @on(SessionSnapshot)
    def attach(self, message: SessionSnapshot) -> None:
        self.model.load(message.nodes)
        self.show_state(message.state)
        self.query_one(NodeLogs).restart_log(message.log)
        table = self.query_one(OpTable)
        cards = table.visible_cards()
        focus = focus_of(message.state.session)
        first = next((c for c in cards if c.id == focus), cards[0] if cards else None)
        if first is not None:
            table.select_card(first.id)
            self.show_card(first)

    @on(SessionChanged)
    def apply_changes(self, message: SessionChanged) -> None:
        changes = message.changes
        if changes.gone:
            self.app.report(f"session {self.session_id} was deleted")
            self.app.pop_screen()
            return
        added = [self.model.nodes[row.id] for row in changes.nodes if self.model.upsert(row)]
        for node_id in changes.deleted:
            self.model.remove(node_id)
        self.query_one(SearchTree).nodes_changed(added, changes.deleted)
        if added or changes.deleted:
            self.show_filters()
        if changes.state is not None:
            self.show_state(changes.state)
        if changes.log:
            self.query_one(NodeLogs).add_log(changes.log)
        for result in changes.results:
            self.app.notify(f"search: {result}", timeout=4)
        if changes.ended is not None:
            status, why = changes.ended
            self.app.notify(f"the search of session {self.session_id} ended, {status}"
                            + (f": {why}" if why else ""), timeout=8)
        shown = self.detail.row.id if self.detail else None
        if shown is not None and any(row.id == shown for row in changes.nodes):
            self.load_detail(shown, delay_s=0.0)

    def show_state(self, state: SessionState) -> None:
        paused = self.paused
        focus = focus_of(self.state.session) if self.state is not None else None
        self.state = state
        if self.paused != paused:
            self.refresh_bindings()  # the footer's p says what it does now
        self.tell_focus_cleared(focus)
        self.query_one(OpTable).show(state.cards, focus_of(state.session),
                                     self.model.best_trends(), self.model.confirming_cards())
        tree = self.query_one(SearchTree)
        if tree.card is not None:
            tree.update_card(self.card(tree.card.id) or tree.card)
            if tree.selected_id is None and tree.card.best_node is not None:
                # Nothing chosen yet: follow the search to its first best kernel.
                tree.select_id(tree.card.best_node, focus_only=True)
                self.show_selected_node()
        self.watch_engine(state)
        self.show_bar()

    def tell_focus_cleared(self, before: int | None) -> None:
        """Say when the search let go of the op it was focused on because nothing is left to
        search there: it goes on with every op."""
        card = self.card(before) if before is not None else None
        if card is not None and focus_of(self.state.session) is None \
                and card.status in (CardStatus.DONE, CardStatus.SKIPPED):
            self.app.notify(f"{card.card.label} is {card.status}: the search goes on with "
                            "every op", title="focus cleared", timeout=8)

    def watch_engine(self, state: SessionState) -> None:
        """Say once, in a notice and in the session log, that the engine of a search died."""
        dead = state.session.status in HELD_STATUSES and not state.alive and not self.app.demo
        if dead and not self.engine_dead:
            pid = state.session.engine_pid
            text = f"the engine{f' (process {pid})' if pid else ''} stopped; r resumes the search"
            self.app.notify(text, title="engine stopped", severity="warning", timeout=10)
            line = log_line(self.app.clock(), LogLine(message=text, level="warning"))
            self.query_one(NodeLogs).add_log([line])
        self.engine_dead = dead

    def show_bar(self) -> None:
        if self.state is not None:
            self.query_one(StatusBar).show(session_header(
                self.state.session, self.state.cards, self.state.alive, self.app.gpu_label,
                self.size.width - 2, self.app.demo, self.state.measured, self.app.read_only,
                self.app.starting.get(self.session_id)))
            self.query_one(WorkersBar).show(workers_of(self.state.session.settings),
                                            self.state.alive, self.size.width - 2)

    def card(self, card_id: int) -> CardRow | None:
        if self.state is None:
            return None
        return next((c for c in self.state.cards if c.id == card_id), None)

    def selected_card(self) -> CardRow | None:
        """The op under the op list's cursor."""
        card_id = self.query_one(OpTable).selected_card
        return self.card(card_id) if card_id is not None else None

    # ----- selection -----

    @on(DataTable.RowHighlighted, "#ops")
    def op_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is not None:
            card = self.card(OpTable.card_id(event.row_key.value))
            tree = self.query_one(SearchTree)
            if card is not None and (tree.card is None or tree.card.id != card.id):
                self.show_card(card)

    def show_card(self, card: CardRow) -> None:
        """Show an op's search tree, and the kernel of the node its cursor starts on."""
        tree = self.query_one(SearchTree)
        tree.move_cursor(None)  # the cursor starts afresh: on the best node, or on none
        tree.show_card(card)
        self.show_selected_node()
        self.show_filters()

    def show_selected_node(self) -> None:
        """Load the node under the tree's cursor; the tree announces only a moved cursor line,
        and a new op's best node may sit on the line the old one's did."""
        node_id = self.query_one(SearchTree).selected_id
        if node_id is not None and (self.detail is None or self.detail.row.id != node_id):
            self.load_detail(node_id, delay_s=0.0)
        elif node_id is None:
            self.detail = self.parent_candidate = None
            self.query_one(NodeCode).show_hint(NO_NODE_YET)
            self.query_one(NodeLogs).show_hint(NO_NODE_YET)
            self.grid.pane("code").title_with(None)

    @on(DataTable.RowSelected, "#ops")
    def op_selected(self) -> None:
        self.action_pane("tree")

    @on(Tree.NodeHighlighted, "#tree")
    def node_highlighted(self, event: Tree.NodeHighlighted) -> None:
        if event.node.data is not None:
            self.load_detail(event.node.data.id)

    @on(Tree.NodeSelected, "#tree")
    def node_selected(self) -> None:
        if self.compact:
            self.action_pane("code")

    @work(exclusive=True, group="detail")
    async def load_detail(self, node_id: int, delay_s: float = 0.05) -> None:
        await asyncio.sleep(delay_s)  # a held j key moves on before anything is read
        store = await self.app.open_store()
        if store is None:
            return
        try:
            detail, parent = await read_node(store, node_id)
        except KforgeError as exc:
            self.post_message(ErrorRaised(str(exc)))
            return
        self.post_message(NodeLoaded(detail, parent))

    @on(NodeLoaded)
    def show_node(self, message: NodeLoaded) -> None:
        self.detail, self.parent_candidate = message.detail, message.parent
        self.query_one(NodeCode).show_node(message.detail)
        self.query_one(NodeLogs).show_node(message.detail)
        self.grid.pane("code").title_with(f"node #{message.detail.row.id}")

    # ----- commands to the search -----

    def selected_node(self) -> int | None:
        node_id = self.query_one(SearchTree).selected_id
        if node_id is None:
            self.app.report("select a node in the search tree first (2, then j/k)")
        return node_id

    def on_node(self, verb: str, act: Callable[[int], object], writes: bool = True) -> None:
        """Run ``act`` on the tree's selected node: at once where the focused pane shows it,
        else after a question that names it (the pane in sight shows another thing); one that
        ``writes`` the store is refused, before any question, where nothing can be written."""
        node_id = self.selected_node()
        tree = self.query_one(SearchTree)
        if node_id is None or tree.card is None or writes and self.app.refused_read_only(
                verb.lower()):
            return
        if self.active in SHOWN_IN["node"]:
            act(node_id)
            return
        name = node_name(self.model.nodes[node_id].row, tree.card)
        # a diff only shows: yes is the safe answer there
        self.app.confirm(f"{verb} {name}?", lambda: act(node_id), default_yes=not writes)

    def action_prune(self) -> None:
        self.on_node("Prune", lambda node_id: self.command(CommandKind.PRUNE, node_id))

    def action_unprune(self) -> None:
        self.on_node("Unprune", lambda node_id: self.command(CommandKind.UNPRUNE, node_id))

    def action_pause(self) -> None:
        self.command(CommandKind.RESUME if self.paused else CommandKind.PAUSE)

    def action_resume(self) -> None:
        if self.state is not None and self.state.alive:
            if self.state.session.status == SessionStatus.PAUSED:
                self.command(CommandKind.RESUME)
            else:
                self.app.notify(f"session {self.session_id} is already searching")
            return
        self.app.resume_session(self.session_id)

    def action_stop(self) -> None:
        self.app.confirm(f"Stop the search of session {self.session_id}? (r resumes it later)",
                         lambda: self.command(CommandKind.STOP))

    def action_focus_op(self) -> None:
        """Focus the search on the selected op, or clear the focus on it; where the focused
        pane shows another thing, after a question that names the op."""
        card = self.selected_card()
        if card is None or self.state is None or self.app.refused_read_only("focus"):
            return
        clear = focus_of(self.state.session) == card.id
        focus = partial(self.command, CommandKind.FOCUS, None if clear else card.id)
        if self.active in SHOWN_IN["op"]:
            focus()
        else:
            question = "Clear the focus on" if clear else "Focus the search on"
            self.app.confirm(f"{question} {card.card.label}?", focus)

    @work(group="command")
    async def command(self, kind: CommandKind, arg: int | None = None) -> None:
        store = await self.app.open_store()
        if store is None or self.app.refused_read_only(f"{kind}"):
            return
        try:
            said = await issue(store, self.session_id, kind, arg)
        except NoRunningSearch as exc:
            # Stopping what does not run needs no offer to start it.
            self.post_message(ErrorRaised(str(exc)) if kind is CommandKind.STOP
                              else SearchNotRunning(str(exc)))
            return
        except KforgeError as exc:
            self.post_message(ErrorRaised(str(exc)))
            return
        self.post_message(Notice(said))

    @on(SearchNotRunning)
    def offer_to_start(self, message: SearchNotRunning) -> None:
        why = (f"The engine of session {self.session_id} has stopped." if self.engine_dead
               else f"{message.text[:1].upper()}{message.text[1:]}.")
        self.app.confirm(f"{why} Resume the search now?",
                         lambda: self.app.resume_session(self.session_id), default_yes=True)

    # ----- looking around -----

    def action_op_details(self) -> None:
        """Everything the op list says of the selected op, in full and with its basis: why it
        has its status, its figures and who timed them, its call's shapes, dtypes and strides."""
        card = self.selected_card()
        if card is None or self.state is None:
            return
        focused = focus_of(self.state.session) == card.id
        confirming = card.id in self.model.confirming_cards()
        self.app.push_screen(Reading(f"op {card.card.short_op}",
                                     facts_table(op_facts(card, focused, confirming))))

    def legend(self) -> Legend:
        """What the symbols and labels mean: the focused pane's first, then the other panes'
        and the top bar's."""
        panes = sorted((OPS, TREE), key=lambda legend: legend is not LEGENDS.get(self.active))
        return (*panes[0], *panes[1], *HEADER)

    def action_best(self) -> None:
        tree = self.query_one(SearchTree)
        card = tree.card
        best = card.best_kernel if card is not None else None
        if best is None:
            self.app.report(no_best_text(card) if card is not None else "no op selected")
            return
        self.action_pane("tree")
        if not tree.select_id(best):
            self.app.report(f"the best node #{best} is hidden by the filter")

    def action_diff(self) -> None:
        self.on_node("Diff", self.show_diff, writes=False)

    def show_diff(self, node_id: int) -> None:
        detail = self.detail
        if detail is None or detail.row.id != node_id:
            self.app.report("the node is still loading; try again in a moment")
            return
        if detail.candidate is None:
            self.app.report(f"node #{node_id} has no kernel ({detail.row.status})")
            return
        parent_id = detail.row.parent_id
        parent_name = f"#{parent_id}" if parent_id else "nothing"
        lines = candidate_diff(self.parent_candidate, detail.candidate, parent_name,
                               f"#{node_id}")
        self.app.push_screen(DiffView(f"node #{node_id} against its parent ({parent_name})",
                                      lines))

    def action_filter(self) -> None:
        if self.active == "ops":
            table = self.query_one(OpTable)
            self.app.push_screen(Ask("Show ops whose name contains (empty: all)",
                                     table.name_filter, "e.g. softmax"),
                                 lambda text: text is not None and self.filter_ops(text))
        elif self.active == "tree":
            tree = self.query_one(SearchTree)
            self.app.push_screen(Choose("Show nodes", [f.value for f in NodeFilter],
                                        tree.node_filter.value),
                                 lambda pick: pick is not None
                                 and self.filter_nodes(NodeFilter(pick)))
        else:
            self.app.report("filter works on the ops (1) and search tree (2) panes")

    def filter_ops(self, text: str) -> None:
        self.query_one(OpTable).set_filter(text)
        self.show_filters()

    def filter_nodes(self, node_filter: NodeFilter) -> None:
        self.query_one(SearchTree).set_filter(node_filter)
        self.show_selected_node()
        self.show_filters()

    def show_filters(self) -> None:
        """Name each active filter in its pane's title, and say so when it hides everything."""
        table = self.query_one(OpTable)
        if not table.name_filter:
            self.grid.pane("ops").title_with(None)
        elif table.row_count:
            self.grid.pane("ops").title_with(f'filter "{table.name_filter}"')
        else:
            self.grid.pane("ops").title_with(f'no ops match "{table.name_filter}" — esc to clear')
        tree = self.query_one(SearchTree)
        shown = tree.node_filter
        if shown is NodeFilter.ALL:
            self.grid.pane("tree").title_with(None)
        elif tree.card is not None and not tree.root.children:
            self.grid.pane("tree").title_with(f"no nodes match filter {shown} — esc to clear")
        else:
            self.grid.pane("tree").title_with(f"filter: {shown}")

    def clear_filter(self) -> bool:
        """Clear the active pane's filter, if it has one."""
        if self.active == "ops" and self.query_one(OpTable).name_filter:
            self.filter_ops("")
        elif self.active == "tree" and self.query_one(SearchTree).node_filter is not NodeFilter.ALL:
            self.filter_nodes(NodeFilter.ALL)
        else:
            return False
        return True

    def action_back(self) -> None:
        """Escape steps back: out of a filter, from a node's kernel or logs to the tree, and
        from the tree or the ops to the sessions."""
        if self.clear_filter():
            return
        if self.active in ("code", "logs"):
            self.action_pane("tree")
            return
        self.app.pop_screen()

    def palette_commands(self) -> list[PaletteCommand]:
        return [
            PaletteCommand("Pause or resume the search", self.action_pause, "pause"),
            PaletteCommand("Resume the search (start its engine)", self.action_resume, "resume"),
            PaletteCommand("Stop the search", self.action_stop, "stop"),
            PaletteCommand("Prune the selected subtree", self.action_prune, "prune"),
            PaletteCommand("Unprune the selected subtree", self.action_unprune, "unprune"),
            PaletteCommand("Jump to the best node", self.action_best, "best"),
            PaletteCommand("Diff the node against its parent", self.action_diff, "diff"),
            PaletteCommand("Focus the search on the selected op", self.action_focus_op, "focus"),
            PaletteCommand("Details of the selected op: why its status, its figures' basis, "
                           "its shapes", self.action_op_details, "op_details"),
            PaletteCommand("Filter ops or nodes", self.action_filter, "filter"),
            PaletteCommand("Back (out of a filter, to the tree, to the sessions)",
                           self.action_back, "back"),
        ]
