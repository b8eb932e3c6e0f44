"""Every picture the command line writes, in the one module it loads when it writes one.

``main.py export`` runs a script in a worker and then draws: the graph (and its step frames,
GIF and forward replay), a tensor's Storage view, the memory chart or the curves of a loop. Each
lives beside the view it draws; this module gathers them, so the command line loads Qt and the
renderers with a single import, only when it exports (a summary or a JSON run never loads Qt).
"""

from widgets.export.forward_frames import write_forward_frames
from widgets.export.graph_export import export_call, export_frames, export_gif, strip_call
from widgets.memory.export import MemoryExportError, export_samples
from widgets.panels.curves import CurvesExportError, export_trace_curves
from widgets.storage.export import StorageExportError, export_storage

__all__ = ["CurvesExportError", "MemoryExportError", "StorageExportError", "export_call", "export_frames", "export_gif",
           "export_samples", "export_storage", "export_trace_curves", "strip_call", "write_forward_frames"]
