"""The main window's actions, toolbar and menus: every command has a shortcut and a tooltip."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QComboBox, QLabel, QLineEdit, QMenu, QSizePolicy, QToolButton, QWidget

from app.window.help_dialogs import show_getting_started, show_shortcuts
from app.window.resources import example_scripts, icon
from widgets.graph.direction import DIRECTION_NAMES, set_direction
from widgets.graph.teaching import set_show_slots, set_show_values
from widgets.storage.export import export_storage_dialog


def make_action(w, text: str, slot, shortcut=None, tip: str = "", icon_name: str | None = None,
            checkable: bool = False) -> QAction:
    action = QAction(text, w)
    if shortcut:
        action.setShortcut(QKeySequence(shortcut))
    if icon_name:
        action.setIcon(icon(icon_name))
    keys = f" ({action.shortcut().toString(QKeySequence.SequenceFormat.NativeText)})" if shortcut else ""
    action.setToolTip(f"{tip or text.replace('&', '')}{keys}")
    action.setStatusTip(tip or text.replace("&", ""))
    action.setCheckable(checkable)
    if checkable:
        action.toggled.connect(slot)
    else:
        action.triggered.connect(slot)
    w.addAction(action)
    return action


def build_actions(w) -> None:
    w.act_open = make_action(w, "&Open…", w.open_dialog, QKeySequence.StandardKey.Open,
                                 "Open a PyTorch script or model file", "open")
    w.act_open_folder = make_action(w, "Open &Model Folder…", w.open_folder_dialog, "Ctrl+Alt+O",
                                    "Open a Hugging Face model folder (config.json and weights)")
    w.act_run = make_action(w, "&Run", w.run_script, "Ctrl+R", "Run the script again", "run")
    w.act_stop = make_action(w, "&Stop", w.stop, "Shift+F5", "Stop the running script", "stop")
    w.act_rerun_on_change = make_action(w, "Re-run When the File &Changes", w._set_watch, None,
                                            "Run again whenever the script is saved", checkable=True)
    w.act_nan_check = make_action(w, "Check for &NaN/Inf", lambda on: setattr(w.session, "nan_check", on), None,
                                  "The next runs check each op's output and each gradient: the first NaN or "
                                  "infinity is marked on the graph and listed in Problems", checkable=True)
    w.act_fit = make_action(w, "&Fit to Window", lambda: w.graph.fit(), "Ctrl+0", "Fit the graph to the window",
                                "fit")
    w.act_zoom_in = make_action(w, "Zoom &In", lambda: w.graph.zoom_in(), QKeySequence.StandardKey.ZoomIn,
                                    "Zoom in")
    w.act_zoom_out = make_action(w, "Zoom &Out", lambda: w.graph.zoom_out(),
                                     QKeySequence.StandardKey.ZoomOut, "Zoom out")
    w.act_find = make_action(w, "&Find…", w.focus_search, QKeySequence.StandardKey.Find,
                                 "Find a node by op or variable name")
    w.act_saved = make_action(w, "Show &Saved Tensors", w.graph.set_show_saved, "Ctrl+Shift+S",
                                  "Draw each node's saved tensors", "saved", checkable=True)
    w.act_shapes = make_action(w, "Show S&hapes on Edges", w.graph.set_show_shapes, "Ctrl+Shift+H",
                                   "Write tensor shapes on the edges", "shapes", checkable=True)
    w.act_sharing = make_action(w, "Show Storage &Sharing", w.graph.set_show_sharing, "Ctrl+Shift+M",
                                "Link tensors that share memory (same storage) and mark views with their base",
                                "sharing", checkable=True)
    w.act_slots = make_action(w, "Show &next_functions Entries", lambda on: set_show_slots(w.graph, on), None,
                              "Label each edge with its next_functions entry: (node, input_nr)", checkable=True)
    w.act_norm_colours = make_action(w, "&Colour by Gradient Norm", w.graph.set_colour_by_norm, "Ctrl+Shift+G",
                                     "Colour each edge by the norm of the gradient it carried in this call and each "
                                     "leaf by its ‖grad‖₂, on a log scale", checkable=True)
    w.act_export_storage = make_action(w, "Export S&torage View…", lambda: export_storage_dialog(w), None,
                                       "Save the Storage view of the selected tensor as SVG, PNG or PDF")
    w.act_values = make_action(w, "Show &Values", lambda on: set_show_values(w.graph, on), "Ctrl+Shift+V",
                               "Leaves show their data and .grad, edges the gradient they carried, "
                               "roots the seed gradient", checkable=True)
    w.act_replay = make_action(w, "&Replay Forward", w.replay.set_active, "Ctrl+Shift+R",
                               "Replay the forward pass op by op, as it wove the graph", checkable=True)
    w.replay.sig_active.connect(w.act_replay.setChecked)
    s = w.session
    w.act_debug = make_action(w, "&Debug", w.debug_script, "F9",
                              "Run the script and pause at each backward call, or before each breakpoint's "
                              "line (set in the Source gutter; in forward too), with its graph shown", "debug")
    w.act_step = make_action(w, "&Step", s.step, "F10",
                             "Run backward one node at a time: the next node", "step")
    w.act_step_to = make_action(w, "Step to Se&lected Node", w.step_to_selected, "Ctrl+F10",
                                "Run backward until the selected node is next")
    w.act_continue = make_action(w, "&Continue", s.continue_, "F5",
                                 "Run on: a debug run goes on to its next breakpoint or backward call",
                                 "continue")
    w.act_next_call = make_action(w, "Run to &Next Call", s.next_call, "Shift+F11",
                                  "Finish this backward and pause at the script's next backward call", "next_call")
    w.act_resume = make_action(w, "Resume &Without Pausing", s.resume_all, "Ctrl+F5",
                               "Run the rest of the script without pausing again")
    w.act_restart = make_action(w, "Res&tart Stepping", s.restart, "Ctrl+Shift+F5",
                                "Start stepping this call again from its first node, in a new run", "restart")
    w.act_show_graph = make_action(w, "&Graph", lambda: w.center.setCurrentWidget(w.graph), "Ctrl+1",
                                   "Show the autograd graph")
    w.act_show_storage = make_action(w, "S&torage", lambda: w.center.setCurrentWidget(w.storage), "Ctrl+2",
                                     "Show the selected tensor's storage, element by element")
    for action, short in ((w.act_saved, "Saved"), (w.act_shapes, "Shapes"), (w.act_sharing, "Sharing"),
                          (w.act_values, "Values"), (w.act_fit, "Fit"), (w.act_restart, "Restart"),
                          (w.act_next_call, "Next Call")):
        action.setIconText(short)
    w.act_quit = make_action(w, "&Quit", w.close, QKeySequence.StandardKey.Quit, "Quit Backprop Studio")
    w.act_getting_started = make_action(w, "&Getting Started", lambda: show_getting_started(w), "F1",
                                        "A tour of the bundled examples and what each teaches")
    w.act_shortcuts = make_action(w, "&Keyboard Shortcuts", lambda: show_shortcuts(w), "Ctrl+/",
                                  "Every keyboard shortcut of the window")
    w.act_about = make_action(w, "&About Backprop Studio", w.about, None, "About")


def build_toolbar(w) -> None:
    bar = w.addToolBar("Main")
    bar.setObjectName("toolbar_main")
    bar.setMovable(False)
    bar.setIconSize(QSize(18, 18))
    bar.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
    bar.addAction(w.act_open)
    w.examples_button = QToolButton(w)
    w.examples_button.setText("Examples")
    w.examples_button.setIcon(icon("examples"))
    w.examples_button.setToolTip("Open a bundled example")
    w.examples_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
    w.examples_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
    w.examples_menu = examples_menu(w)
    w.examples_button.setMenu(w.examples_menu)
    bar.addWidget(w.examples_button)
    bar.addSeparator()
    bar.addWidget(QLabel(" Device: "))
    w.device_box = QComboBox(w)
    w.device_box.setToolTip("The device the script runs on (reported by the worker)")
    w.device_box.setMinimumContentsLength(12)
    # A host's devices are longer ("gpu-box: cuda:0 (NVIDIA H100, 80 GB)"): the box grows to show
    # the one picked, up to a width the toolbar keeps room for on a laptop; the list shows all.
    w.device_box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
    w.device_box.setMaximumWidth(w.fontMetrics().horizontalAdvance("x") * 40)
    w.device_box.addItem("CPU", "cpu")
    bar.addWidget(w.device_box)
    bar.addAction(w.act_run)
    bar.addAction(w.act_debug)
    bar.addAction(w.act_stop)
    bar.addSeparator()
    bar.addAction(w.act_step)
    bar.addAction(w.act_continue)
    bar.addAction(w.act_next_call)
    bar.addAction(w.act_restart)
    bar.addSeparator()
    bar.addAction(w.act_saved)
    bar.addAction(w.act_shapes)
    bar.addAction(w.act_sharing)
    bar.addAction(w.act_values)
    bar.addAction(w.act_fit)
    spacer = QWidget(w)
    spacer.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
    bar.addWidget(spacer)
    w.search_box = QLineEdit(w)
    w.search_box.setPlaceholderText("Find node or variable (Ctrl+F)")
    w.search_box.setClearButtonEnabled(True)
    w.search_box.setFixedWidth(240)
    w.search_box.returnPressed.connect(w.search)
    bar.addWidget(w.search_box)


def examples_menu(w) -> QMenu:
    menu = QMenu("Open &Example", w)
    for path, title in example_scripts():
        action = menu.addAction(f"{path.stem.split('_', 1)[0]}  {title}")
        action.setToolTip(str(path))
        action.triggered.connect(lambda _=False, p=str(path): w.open_script(p))
    return menu


def direction_menu(w, view) -> None:
    """View > Direction: top down, left to right or forward order, for the graph on screen."""
    menu = view.addMenu("&Direction")
    group = QActionGroup(w)
    w.direction_actions = {}
    for key, name in DIRECTION_NAMES.items():
        act = menu.addAction(name)
        act.setCheckable(True)
        act.setChecked(key == w.graph.direction)
        act.triggered.connect(lambda _=False, k=key: set_direction(w.graph, k))
        group.addAction(act)
        w.direction_actions[key] = act


def build_menus(w) -> None:
    file_menu = w.menuBar().addMenu("&File")
    file_menu.addAction(w.act_open)
    file_menu.addAction(w.act_open_folder)
    file_menu.addMenu(examples_menu(w))
    w.recent_menu = file_menu.addMenu("Open &Recent")
    file_menu.addSeparator()
    file_menu.addAction(w.act_export_storage)
    file_menu.addAction(w.act_quit)
    view = w.menuBar().addMenu("&View")
    for action in (w.act_fit, w.act_zoom_in, w.act_zoom_out, w.act_find):
        view.addAction(action)
    view.addSeparator()
    view.addAction(w.act_show_graph)
    view.addAction(w.act_show_storage)
    view.addSeparator()
    view.addAction(w.act_saved)
    view.addAction(w.act_shapes)
    view.addAction(w.act_sharing)
    view.addAction(w.act_values)
    view.addAction(w.act_slots)
    view.addAction(w.act_replay)
    view.addAction(w.act_norm_colours)
    view.addSeparator()
    theme_menu = view.addMenu("&Theme")
    group = QActionGroup(w)
    for name in ("light", "dark"):
        act = theme_menu.addAction(name.title())
        act.setCheckable(True)
        act.setChecked(name == "light")
        act.triggered.connect(lambda _=False, n=name: w.graph.set_theme(n))
        group.addAction(act)
    direction_menu(w, view)
    view.addSeparator()
    for dock in w.docks.values():
        view.addAction(dock.toggleViewAction())
    run = w.menuBar().addMenu("&Run")
    run.addAction(w.act_run)
    run.addAction(w.act_debug)
    run.addAction(w.act_stop)
    run.addAction(w.act_rerun_on_change)
    run.addAction(w.act_nan_check)
    run.addSeparator()
    for action in (w.act_step, w.act_step_to, w.act_continue, w.act_next_call, w.act_resume, w.act_restart):
        run.addAction(action)
    help_menu = w.menuBar().addMenu("&Help")
    help_menu.addAction(w.act_getting_started)
    help_menu.addAction(w.act_shortcuts)
    help_menu.addSeparator()
    help_menu.addAction(w.act_about)
