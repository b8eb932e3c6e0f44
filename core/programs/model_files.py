"""Saved models: torch.export programs, TorchScript archives, checkpoints, Hugging Face folders.

Each kind becomes a short driver script that defines ``model`` and ``example_input``; the
capture then runs it like any model file (forward, a sum of the outputs as the loss,
backward, parameters named by module path). The driver is what the Source panel shows, so
a user sees exactly how the file was opened.

Loading is safe by default: checkpoints are read with ``torch.load(..., weights_only=True)``
or safetensors; a whole pickled model (``torch.save(model)``) runs code from the file when
loaded, so it is refused unless the user trusts it (``--trust-pickle`` or the window's
confirmation). torch, safetensors and transformers are imported only inside the functions
that need them: the GUI imports this module without torch. Which kind a file is lives in
``core.programs.model_kinds``; each kind's driver is asked for by its opener (``core.programs.openers``).
"""

from __future__ import annotations

import json
import pickle
import sys
from contextlib import ExitStack, contextmanager
from pathlib import Path

from core.programs.model_kinds import SAFETENSORS_SUFFIXES, ModelFileError, model_kind, parse_shapes, recorded_shapes

SEED = 0  # example inputs are random but the same on every run


# -- drivers ------------------------------------------------------------------------------------------

_HEADER = "# Backprop Studio opens {name} ({what}) with this script and runs it as a model file:\n" \
          "# forward, a sum of the outputs as the loss, backward. {loader}() is its loader\n" \
          "# (core/programs/model_files.py), given to this script: the app's own modules stay out of sys.modules.\n"


def driver_source(path: str | Path, options: dict | None = None) -> str:
    """The script that opens the model at ``path``, by its kind; ModelFileError when it cannot be opened."""
    p = Path(path)
    drivers = {"export": export_driver, "torchscript": torchscript_driver, "huggingface": huggingface_driver,
               "safetensors": weights_driver}
    return drivers.get(model_kind(p), checkpoint_driver)(p, options or {})


def _driver(p: Path, what: str, call: str) -> str:
    # The name as a Python literal in ASCII: a newline (or any line break) in a file's name stays inside
    # the comment instead of starting a line of code.
    return (_HEADER.format(name=ascii(p.name), what=what, loader=call.split("(")[0])
            + f"\nmodel, example_input = {call}\n")


def export_driver(p: Path, options: dict) -> str:
    return _driver(p, "a torch.export program", f"open_export({str(p)!r})")


def torchscript_driver(p: Path, options: dict) -> str:
    """Input shapes from ``options`` or recorded in the archive; needs_shapes when neither has them."""
    shapes = options.get("input_shapes") or recorded_shapes(p)
    parse_shapes(shapes)
    if not shapes:
        raise ModelFileError(
            f"{p.name} is a TorchScript archive that does not record its input shapes: give them with "
            f"--input-shape (e.g. --input-shape 2,4) or in the window's dialog", "needs_shapes")
    return _driver(p, "a TorchScript archive", f"open_torchscript({str(p)!r}, {shapes!r})")


def huggingface_driver(p: Path, options: dict) -> str:
    return _driver(p, "a Hugging Face model folder", f"open_huggingface({str(p)!r})")


def weights_driver(p: Path, options: dict) -> str:
    """Weights alone run nothing: the error asks for the script that defines the model's class."""
    raise ModelFileError(_needs_code(p), "needs_code")


def checkpoint_driver(p: Path, options: dict) -> str:
    """A state_dict asks for its class (needs_code); a whole pickled model opens once trusted, with shapes."""
    shapes = options.get("input_shapes") or ""
    if check_checkpoint(p, bool(options.get("trust_pickle"))) == "weights":
        return weights_driver(p, options)
    parse_shapes(shapes)
    if not shapes:
        raise ModelFileError(f"{p.name} holds a whole pickled model: give its input shapes with "
                             f"--input-shape (e.g. --input-shape 2,4)", "needs_shapes")
    return _driver(p, "a pickled model, trusted", f"open_pickled_model({str(p)!r}, {shapes!r})")


def loaders() -> dict:
    """The functions a driver calls, bound in its namespace before it runs."""
    return {"open_export": open_export, "open_torchscript": open_torchscript,
            "open_pickled_model": open_pickled_model, "open_huggingface": open_huggingface}


def _needs_code(p: Path) -> str:
    return (f"{p.name} holds weights only (a state_dict): open the .py that defines the model with it, "
            f"e.g. `python main.py trace model.py --weights {p.name}`, or drop both files on the window")


def check_checkpoint(p: Path, trust: bool) -> str:
    """``weights`` for a state_dict, ``model`` for a trusted pickled model; refuses other pickles."""
    import torch  # lazily: the GUI imports this module without torch

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
    import torch  # lazily: the GUI imports this module without torch

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
    import torch  # lazily: the GUI imports this module without torch

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
    # lazily: the GUI imports this module without torch
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
    import torch  # lazily: the GUI imports this module without torch

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
    import torch  # lazily: the GUI imports this module without torch

    with _modes_off():
        module = torch.jit.load(path, map_location="cpu")
    return module, example_inputs(parse_shapes(shapes))


def open_pickled_model(path: str, shapes: str):
    """A whole pickled model; only reached when the user trusted the file."""
    import torch  # lazily: the GUI imports this module without torch

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
    import torch  # lazily: the GUI imports this module without torch

    p = Path(path)
    if p.suffix.lower() in SAFETENSORS_SUFFIXES:
        try:
            from safetensors.torch import load_file  # lazily: an optional package, for .safetensors only
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


def loss_terms(output) -> list:
    """The tensors a model file's loss sums: the floating-point tensors of its model's output.

    The output may be a tensor, a tuple or list of them, a mapping (a Hugging Face ``ModelOutput``
    is an OrderedDict and a dataclass: ``.logits``, ``.hidden_states``), a dataclass or any object
    with tensor attributes. An output that carries its own ``loss`` (a model given labels) gives
    that loss alone; otherwise each floating-point tensor at its top level is a term."""
    import dataclasses
    from collections.abc import Mapping

    import torch  # lazily: the GUI imports this module without torch

    def floating(v) -> bool:
        return isinstance(v, torch.Tensor) and v.is_floating_point()

    if isinstance(output, torch.Tensor):
        values, loss = [output], None
    elif isinstance(output, (tuple, list)):
        values, loss = list(output), None
    elif isinstance(output, Mapping):
        values, loss = list(output.values()), output.get("loss")
    elif dataclasses.is_dataclass(output) and not isinstance(output, type):
        values = [getattr(output, f.name, None) for f in dataclasses.fields(output)]
        loss = getattr(output, "loss", None)
    else:
        values, loss = list(getattr(output, "__dict__", {}).values()), getattr(output, "loss", None)
    if floating(loss):
        return [loss]
    return [v for v in values if floating(v)]


def apply_weights(namespace: dict, path: str) -> None:
    """After a model file ran: build it if it has ``build()``, then load ``path`` into its model."""
    import torch  # lazily: the GUI imports this module without torch

    if not isinstance(namespace.get("model"), torch.nn.Module) and callable(namespace.get("build")):
        model, example_input = namespace["build"]()
        namespace.update(model=model, example_input=example_input)
    load_weights(namespace.get("model"), path)


def open_huggingface(folder: str):
    """A Hugging Face model folder, offline, with a dummy batch built from its config."""
    try:
        import transformers  # lazily: an optional package, for Hugging Face folders only
    except ImportError:
        raise ModelFileError(f"{Path(folder).name} is a Hugging Face model folder: opening it needs the "
                             "transformers package (pip install transformers)", "missing_package") from None
    import torch  # lazily: the GUI imports this module without torch

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
