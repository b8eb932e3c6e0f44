"""Saved models: torch.export programs, TorchScript archives, checkpoints, Hugging Face folders.

Each kind becomes a short driver script that defines ``model`` and ``example_input``; the
capture then runs it like any model file (forward, a sum of the outputs as the loss,
backward, parameters named by module path). The driver is what the Source panel shows, so
a user sees exactly how the file was opened.

Loading is safe by default: checkpoints are read with ``torch.load(..., weights_only=True)``
or safetensors; a whole pickled model (``torch.save(model)``) runs code from the file when
loaded, so it is refused unless the user trusts it (``--trust-pickle`` or the window's
confirmation). torch, safetensors and transformers are imported only inside the functions:
the GUI imports this module's file-kind functions without torch.
"""

from __future__ import annotations

import json
import re
import sys
import zipfile
from contextlib import ExitStack, contextmanager
from pathlib import Path

EXPORT_SUFFIXES = (".pt2",)
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".tar")
SAFETENSORS_SUFFIXES = (".safetensors",)
MODEL_SUFFIXES = EXPORT_SUFFIXES + CHECKPOINT_SUFFIXES + SAFETENSORS_SUFFIXES + (".ts", ".jit", ".torchscript")
SEED = 0  # example inputs are random but the same on every run
DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")


class ModelFileError(ValueError):
    """A model file that cannot be opened as asked. ``reason`` lets the window offer a fix:
    ``unsafe_pickle`` (confirm to trust it), ``needs_shapes`` (ask for input shapes),
    ``needs_code`` (weights without the code of the model), ``missing_package``."""

    def __init__(self, message: str, reason: str = "load"):
        super().__init__(message)
        self.reason = reason


# -- which kind of file (no torch) -------------------------------------------------------------------


def is_huggingface_folder(path: str | Path) -> bool:
    p = Path(path)
    return p.is_dir() and (p / "config.json").is_file()


def model_kind(path: str | Path) -> str:
    """export, torchscript, checkpoint (torch.save zip or pickle), safetensors or huggingface."""
    p = Path(path)
    if is_huggingface_folder(p):
        return "huggingface"
    suffix = p.suffix.lower()
    if suffix in SAFETENSORS_SUFFIXES:
        return "safetensors"
    names = _zip_names(p)
    if any(n.endswith("/models/model.json") or n.endswith("archive_format") for n in names) or (
        not names and suffix in EXPORT_SUFFIXES
    ):
        return "export"
    if any("/code/__torch__/" in n for n in names) or (not names and suffix in (".ts", ".jit", ".torchscript")):
        return "torchscript"
    return "checkpoint"


def _zip_names(p: Path) -> list[str]:
    try:
        with zipfile.ZipFile(p) as z:
            return z.namelist()
    except (OSError, zipfile.BadZipFile):
        return []


def recorded_shapes(p: Path) -> str:
    """Input shapes saved in a TorchScript archive as the extra file ``input_shapes``
    (``torch.jit.save(m, path, _extra_files={"input_shapes": "2,4"})``); empty when absent."""
    try:
        with zipfile.ZipFile(p) as z:
            name = next((n for n in z.namelist() if n.endswith("/extra/input_shapes")), None)
            return z.read(name).decode("utf-8").strip() if name else ""
    except (OSError, zipfile.BadZipFile, UnicodeDecodeError):
        return ""


def parse_shapes(text: str | list[str] | None) -> list[tuple[list[int], str]]:
    """``"2,4"``, ``"2x4:int64"`` or ``"2,4; 3"`` (one per input) as [(shape, dtype)].

    Raises ModelFileError naming the bad part."""
    if not text:
        return []
    parts = text if isinstance(text, list) else re.split(r"[;\s]+", text.strip())
    shapes = []
    for part in (p.strip() for p in parts):
        if not part:
            continue
        dims, _, dtype = part.partition(":")
        dtype = dtype or "float32"
        if dtype not in DTYPES:
            raise ModelFileError(f"input shape {part!r}: unknown dtype {dtype!r} (one of {', '.join(DTYPES)})",
                                 "needs_shapes")
        try:
            shape = [int(d) for d in re.split(r"[,x×]", dims) if d.strip()]
        except ValueError:
            raise ModelFileError(f"input shape {part!r}: write the sizes as numbers, e.g. 2,4 or 2x4:int64",
                                 "needs_shapes") from None
        if any(d < 0 for d in shape):
            raise ModelFileError(f"input shape {part!r}: sizes cannot be negative", "needs_shapes")
        shapes.append((shape, dtype))
    return shapes


# -- drivers ------------------------------------------------------------------------------------------

_HEADER = "# Backprop Studio opens {name} ({what}) with this script and runs it as a model file:\n" \
          "# forward, a sum of the outputs as the loss, backward. {loader}() is its loader\n" \
          "# (core/programs/model_files.py), given to this script: the app's own modules stay out of sys.modules.\n"


def driver_source(path: str | Path, options: dict | None = None) -> str:
    """The script that opens the model at ``path``; ModelFileError when it cannot be opened."""
    options = options or {}
    p = Path(path)
    kind = model_kind(p)
    shapes = options.get("input_shapes") or ""
    trust = bool(options.get("trust_pickle"))
    if kind == "export":
        what, call = "a torch.export program", f"open_export({str(p)!r})"
    elif kind == "torchscript":
        shapes = shapes or recorded_shapes(p)
        parse_shapes(shapes)
        if not shapes:
            raise ModelFileError(
                f"{p.name} is a TorchScript archive that does not record its input shapes: give them with "
                f"--input-shape (e.g. --input-shape 2,4) or in the window's dialog", "needs_shapes")
        what, call = "a TorchScript archive", f"open_torchscript({str(p)!r}, {shapes!r})"
    elif kind == "huggingface":
        what, call = "a Hugging Face model folder", f"open_huggingface({str(p)!r})"
    elif kind == "safetensors":
        raise ModelFileError(_needs_code(p), "needs_code")
    else:
        state = check_checkpoint(p, trust)
        if state == "weights":
            raise ModelFileError(_needs_code(p), "needs_code")
        parse_shapes(shapes)
        if not shapes:
            raise ModelFileError(f"{p.name} holds a whole pickled model: give its input shapes with "
                                 f"--input-shape (e.g. --input-shape 2,4)", "needs_shapes")
        what, call = "a pickled model, trusted", f"open_pickled_model({str(p)!r}, {shapes!r})"
    return (_HEADER.format(name=p.name, what=what, loader=call.split("(")[0])
            + f"\nmodel, example_input = {call}\n")


def loaders() -> dict:
    """The functions a driver calls, bound in its namespace before it runs."""
    return {"open_export": open_export, "open_torchscript": open_torchscript,
            "open_pickled_model": open_pickled_model, "open_huggingface": open_huggingface}


def _needs_code(p: Path) -> str:
    return (f"{p.name} holds weights only (a state_dict): open the .py that defines the model with it, "
            f"e.g. `python main.py trace model.py --weights {p.name}`, or drop both files on the window")


def check_checkpoint(p: Path, trust: bool) -> str:
    """``weights`` for a state_dict, ``model`` for a trusted pickled model; refuses other pickles."""
    import pickle

    import torch

    try:
        obj = torch.load(p, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, AttributeError) as exc:
        if "Weights only load failed" not in str(exc) and not isinstance(exc, pickle.UnpicklingError):
            raise ModelFileError(f"{p.name}: not a PyTorch checkpoint: {exc}") from None
        if not trust:
            raise ModelFileError(
                f"{p.name} is a whole pickled model (saved with torch.save(model)), not weights. Loading it "
                f"runs Python code stored in the file, so it is refused by default. Open it only if you trust "
                f"where it came from: confirm in the window or pass --trust-pickle.", "unsafe_pickle") from None
        return "model"
    except (OSError, EOFError) as exc:
        raise ModelFileError(f"cannot read {p}: {exc}") from None
    if _state_dict_of(obj) is None:
        raise ModelFileError(f"{p.name}: a checkpoint of {type(obj).__name__}, with no tensors to load as weights")
    return "weights"


def _state_dict_of(obj):
    """The tensor dict in a checkpoint: itself, or under ``state_dict`` / ``model`` (Lightning, many repos)."""
    import torch

    if isinstance(obj, dict) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return obj
    if isinstance(obj, dict):
        for key in ("state_dict", "model_state_dict", "model"):
            inner = obj.get(key)
            if isinstance(inner, dict) and inner and all(isinstance(v, torch.Tensor) for v in inner.values()):
                return inner
    return None


# -- loaders (run in the worker, from the driver) ----------------------------------------------------------


def example_inputs(shapes: list[tuple[list[int], str]]):
    """Random tensors of the given shapes and dtypes, the same on every run."""
    import torch

    gen = torch.Generator().manual_seed(SEED)
    out = []
    for shape, dtype in shapes:
        dt = getattr(torch, dtype)
        if dt.is_floating_point:
            out.append(torch.randn(shape, generator=gen).to(dt))
        elif dt == torch.bool:
            out.append(torch.zeros(shape, dtype=dt))
        else:
            out.append(torch.randint(0, 2, shape, generator=gen, dtype=dt))
    return out[0] if len(out) == 1 else tuple(out)


@contextmanager
def _modes_off():
    """Load outside the capture: its torch function mode popped (the loader's own modes, such
    as transformers' device mode, then work as they do elsewhere) and its trace function off."""
    from torch.overrides import _get_current_function_mode_stack, _pop_mode_temporarily

    # The capture's trace function sees every Python call; loading a big program makes millions.
    tracer = sys.gettrace()
    sys.settrace(None)
    try:
        with ExitStack() as stack:
            for _ in _get_current_function_mode_stack():
                stack.enter_context(_pop_mode_temporarily())
            yield
    finally:
        sys.settrace(tracer)


def open_export(path: str):
    """A torch.export program as (module, example inputs made from its input specs)."""
    import torch

    with _modes_off():
        program = torch.export.load(path)
        module = program.module()
    shapes = []
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    for spec in program.graph_signature.input_specs:
        if spec.kind != torch.export.graph_signature.InputKind.USER_INPUT:
            continue
        val = placeholders[spec.arg.name].meta.get("val") if hasattr(spec.arg, "name") else None
        if not isinstance(val, torch.Tensor):
            raise ModelFileError(f"{Path(path).name}: input {getattr(spec.arg, 'name', '?')} is not a tensor; "
                                 "only programs whose inputs are tensors can be opened")
        shapes.append(([_concrete(d) for d in val.shape], str(val.dtype).replace("torch.", "")))
    return module, example_inputs(shapes)


def _concrete(dim) -> int:
    try:
        return int(dim)
    except Exception:  # a dynamic size: its example value when recorded
        hint = getattr(getattr(dim, "node", None), "hint", None)
        return int(hint) if hint is not None else 2


def open_torchscript(path: str, shapes: str):
    import torch

    with _modes_off():
        module = torch.jit.load(path, map_location="cpu")
    return module, example_inputs(parse_shapes(shapes))


def open_pickled_model(path: str, shapes: str):
    """A whole pickled model; only reached when the user trusted the file."""
    import torch

    try:
        with _modes_off():
            model = torch.load(path, map_location="cpu", weights_only=False)
    except (AttributeError, ModuleNotFoundError) as exc:
        raise ModelFileError(f"{Path(path).name}: the model's class cannot be found ({exc}); pickled models "
                             "need the code that defined them importable") from None
    if not isinstance(model, torch.nn.Module):
        raise ModelFileError(f"{Path(path).name} holds a {type(model).__name__}, not an nn.Module")
    return model, example_inputs(parse_shapes(shapes))


def load_weights(model, path: str | Path) -> None:
    """Load a state_dict or safetensors file into ``model``; the error names missing and extra keys."""
    import torch

    p = Path(path)
    if p.suffix.lower() in SAFETENSORS_SUFFIXES:
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise ModelFileError(f"{p.name}: reading .safetensors needs the safetensors package "
                                 "(pip install safetensors)", "missing_package") from None
        try:
            state = load_file(str(p))
        except Exception as exc:
            raise ModelFileError(f"{p.name}: not a readable safetensors file: {exc}") from None
    else:
        if check_checkpoint(p, trust=False) != "weights":
            raise ModelFileError(f"{p.name}: not a state_dict")
        state = _state_dict_of(torch.load(p, map_location="cpu", weights_only=True))
    if not isinstance(model, torch.nn.Module):
        raise ModelFileError(f"--weights {p.name}: the script defines no `model` (an nn.Module) to load them into")
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    extra = [k for k in state if k not in own]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)}: {', '.join(missing[:5])}")
        if extra:
            parts.append(f"unexpected {len(extra)}: {', '.join(extra[:5])}")
        raise ModelFileError(f"{p.name} does not match the model's parameters ({'; '.join(parts)})")
    for k, v in state.items():
        if tuple(own[k].shape) != tuple(v.shape):
            raise ModelFileError(f"{p.name}: {k} has shape {list(v.shape)} in the file, "
                                 f"{list(own[k].shape)} in the model")
    model.load_state_dict(state)


def apply_weights(namespace: dict, path: str) -> None:
    """After a model file ran: build it if it has ``build()``, then load ``path`` into its model."""
    import torch

    if not isinstance(namespace.get("model"), torch.nn.Module) and callable(namespace.get("build")):
        model, example_input = namespace["build"]()
        namespace.update(model=model, example_input=example_input)
    load_weights(namespace.get("model"), path)


def open_huggingface(folder: str):
    """A Hugging Face model folder, offline, with a dummy batch built from its config."""
    try:
        import transformers
    except ImportError:
        raise ModelFileError(f"{Path(folder).name} is a Hugging Face model folder: opening it needs the "
                             "transformers package (pip install transformers)", "missing_package") from None
    import torch

    config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    # Loading runs outside the capture's op tagging: transformers builds modules under its own
    # device mode, and the tagging mode stacked under it breaks in-place initialisation.
    with _modes_off():
        model = transformers.AutoModel.from_pretrained(folder, local_files_only=True)
    model.config.return_dict = False  # a tuple of tensors: the loss sums them
    gen = torch.Generator().manual_seed(SEED)
    if getattr(model, "main_input_name", "input_ids") == "pixel_values":
        size = int(config.get("image_size", 32))
        channels = int(config.get("num_channels", 3))
        return model, torch.randn(2, channels, size, size, generator=gen)
    vocab = int(config.get("vocab_size", 100))
    length = min(8, int(config.get("max_position_embeddings", 8) or 8))
    return model, torch.randint(0, max(1, vocab), (2, length), generator=gen)
