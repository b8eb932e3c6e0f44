"""DDP scripts in the window: Run > Run with torchrun… and a rank picker over the Calls list.

The dialog sets the number of processes and the rank shown first (rank 0 by default); the
script then runs under ``torchrun --standalone`` on the worker's host (``core.worker.ddp``), and Ctrl+R
keeps doing so for that script until the dialog turns it off or another file opens. The
worker sends every rank's trace; once the run is on screen, the picker ("Rank 1 of 2") above
the Calls list switches the shown trace between the ranks, on the same call, and each rank's
parameters carry its all-reduce mark (its local gradient and the reduced one).
"""

from __future__ import annotations

import logging
from pathlib import Path

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QDialogButtonBox, QFormLayout, QHBoxLayout, QLabel,
                               QSpinBox, QWidget)

from core.model.rank_files import rank_of, received_trace, sibling_ranks
from core.model.trace import Trace, TraceFormatError

log = logging.getLogger(__name__)

MAX_PROCESSES = 64


class TorchrunDialog(QDialog):
    """Number of processes, the rank shown first, and whether to launch with torchrun at all."""

    def __init__(self, parent=None, nproc: int = 2, rank: int = 0, enabled: bool = True):
        super().__init__(parent)
        self.setWindowTitle("Run with torchrun")
        self.setMinimumWidth(440)
        form = QFormLayout(self)
        intro = QLabel("Start the script as <code>torchrun --standalone --nproc_per_node=N</code> on the worker's "
                       "host (DDP on gloo for CPU, NCCL for CUDA). Every rank is captured; the rank picker "
                       "above the Calls list switches between them.", self)
        intro.setWordWrap(True)
        form.addRow(intro)
        self.use = QCheckBox("Launch this script with torchrun", self)
        self.use.setChecked(enabled)
        form.addRow(self.use)
        self.nproc = QSpinBox(self)
        self.nproc.setRange(1, MAX_PROCESSES)
        self.nproc.setValue(nproc)
        form.addRow("Processes:", self.nproc)
        self.rank = QSpinBox(self)
        self.rank.setRange(0, nproc - 1)
        self.rank.setValue(min(rank, nproc - 1))
        form.addRow("Show rank:", self.rank)
        self.nproc.valueChanged.connect(lambda n: self.rank.setMaximum(n - 1))
        self.use.toggled.connect(self.nproc.setEnabled)
        self.use.toggled.connect(self.rank.setEnabled)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel, self)
        buttons.button(QDialogButtonBox.StandardButton.Ok).setText("Run")
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)

    def options(self) -> dict | None:
        """``{"nproc", "rank"}``, or None when torchrun is turned off."""
        if not self.use.isChecked():
            return None
        return {"nproc": self.nproc.value(), "rank": self.rank.value()}


class RankPicker(QObject):
    """The ranks of the DDP run on screen, and the combo that switches between them."""

    sig_rank = Signal(int)
    """The shown rank changed (its trace is on screen)."""

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.traces: dict[int, Trace] = {}  # rank -> trace, for the run on screen
        self._arriving: dict[int, Trace] = {}  # ranks sent ahead of the run's result
        self._arriving_run = None
        self.shown: int | None = None
        self.row = QWidget(window.calls)
        layout = QHBoxLayout(self.row)
        layout.setContentsMargins(4, 2, 4, 2)
        layout.addWidget(QLabel("DDP:", self.row))
        self.combo = QComboBox(self.row)
        self.combo.setToolTip("Show the trace of another rank of this torchrun run")
        layout.addWidget(self.combo, 1)
        window.calls.layout().insertWidget(0, self.row)
        self.row.hide()
        self.combo.activated.connect(lambda i: self.show_rank(self.combo.itemData(i)))
        window.handle.sig_rank_trace.connect(self._on_rank_trace)
        window.session.sig_result.connect(self._on_result)  # after the window's own slot: the trace is shown

    # -- the run's ranks ------------------------------------------------------------------------------
    def _on_rank_trace(self, event) -> None:
        """A ``core.protocol.messages.RankTrace``: another rank's trace of the run arriving."""
        run = event.run
        if run != self._arriving_run:
            self._arriving, self._arriving_run = {}, run
        try:
            self._arriving[int(event.rank)] = received_trace(event.trace)
        except (TraceFormatError, ValueError, TypeError) as exc:
            log.warning("rank %s's trace could not be read: %s", event.rank, exc)

    def _on_result(self, result) -> None:
        others = self._arriving if self._arriving_run == result.run_id else {}
        self._arriving, self._arriving_run = {}, None
        picked = rank_of(result.trace)
        self._explain_single_process(result.trace)
        self.set_ranks({**others, picked: result.trace} if picked is not None and others else {}, picked)

    def opened(self, path: str, trace: Trace) -> None:
        """A saved trace is on screen: with the other ranks' files of its DDP run beside it
        (``core.model.rank_files``), the picker switches between them; else it goes away."""
        ranks, rank = sibling_ranks(Path(path), trace), rank_of(trace)
        self.set_ranks(ranks, rank)
        if ranks:
            self.window.state_label.setText(f"{self.window.state_label.text()}: rank {rank} of "
                                            f"{len(ranks)}, the other ranks' files beside it (pick one above "
                                            f"the Calls list)")

    def set_ranks(self, traces: dict[int, Trace], shown: int | None) -> None:
        """The ranks the picker offers, ``shown``'s trace being the one on screen; none: hidden."""
        if not traces or shown not in traces:
            self.traces, self.shown = {}, None
            self.row.hide()
            return
        self.traces, self.shown = dict(traces), shown
        self.combo.clear()
        for r in sorted(self.traces):
            self.combo.addItem(f"Rank {r} of {len(self.traces)}", r)
        self.combo.setCurrentIndex(self.combo.findData(shown))
        self.row.show()

    def others(self) -> dict[int, Trace]:
        """Every rank's trace but the one on screen (what File > Export > JSON writes beside it)."""
        return {r: t for r, t in self.traces.items() if r != self.shown}

    def _explain_single_process(self, trace: Trace) -> None:
        """A DDP script run plainly, not set to run with torchrun, fails in init_process_group: say what to do."""
        err = trace.error
        if err is None or self.window.session.torchrun_options() or rank_of(trace) is not None:
            return
        if any(word in err.message for word in ("RANK", "MASTER_ADDR", "WORLD_SIZE")):
            self.window.state_label.setText(
                "This script starts a DDP process group, which torchrun sets up: use Run > Run with torchrun… "
                "(every rank runs, you pick one; Debug then steps it as one process, rank 0 of 1).")

    def show_rank(self, rank: int) -> None:
        """Show ``rank``'s trace, on the call that is on screen now."""
        trace = self.traces.get(rank)
        if trace is None or rank == self.shown:
            return
        w = self.window
        index = w.call.index if w.call is not None else None
        self.shown = rank
        self.combo.setCurrentIndex(self.combo.findData(rank))
        w.show_trace(trace)
        same = next((c for c in trace.calls if c.index == index and c.snapshot == "full"), None)
        if same is not None:
            w.calls.select_call(same.id)
            w.show_call(same.id)
        w.state_label.setText(f"Showing rank {rank} of {len(self.traces)}")
        self.sig_rank.emit(rank)


def run_with_torchrun(window) -> None:
    """Run > Run with torchrun…: ask for the processes and the rank, then run."""
    session = window.session
    if not window.script_path:
        window.state_label.setText("Open a DDP script first: Run with torchrun starts it once per rank.")
        return
    current = session.ddp if session.ddp and session.ddp.get("script") == window.script_path else None
    dialog = TorchrunDialog(window, nproc=(current or {}).get("nproc", 2), rank=(current or {}).get("rank", 0),
                            enabled=True)
    if dialog.exec() != QDialog.DialogCode.Accepted:
        return
    set_torchrun(window, dialog.options())
    window.run_script()


def set_torchrun(window, options: dict | None) -> None:
    """Run the open script under torchrun with ``{"nproc", "rank"}`` from now on (None: plainly)."""
    window.session.ddp = {**options, "script": window.script_path} if options else None


def install(window) -> RankPicker:
    """Run > Run with torchrun… (Ctrl+Alt+R) and the rank picker over the Calls list."""
    run_menu = next((a.menu() for a in window.menuBar().actions() if a.text() == "&Run"), None)
    act = QAction("Run with &torchrun…", window)
    act.setShortcut(QKeySequence("Ctrl+Alt+R"))
    act.setToolTip("Run a DDP script once per rank with torchrun, and pick the rank to show")
    act.triggered.connect(lambda: run_with_torchrun(window))
    if run_menu is not None:
        run_menu.insertAction(window.act_debug, act)
    window.act_torchrun = act
    window.ranks = RankPicker(window)
    return window.ranks
