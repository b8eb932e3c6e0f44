"""Which kind of saved model a file is, and the input shapes typed for one: no torch.

The GUI side asks these (the Open dialog, drag and drop, the input-shape dialog) without torch;
``core.programs.model_files`` builds the drivers and loads the models in the worker. A file's kind
comes from its suffix and, for torch.save zips, from the names inside the zip: a torch.export
program holds ``archive_format`` or ``models/model.json``, a TorchScript archive ``code/__torch__/``.
"""

from __future__ import annotations

import json
import pickletools
import re
import struct
import zipfile
from pathlib import Path

EXPORT_SUFFIXES = (".pt2",)
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".tar")
SAFETENSORS_SUFFIXES = (".safetensors",)
TORCHSCRIPT_SUFFIXES = (".ts", ".jit", ".torchscript")
MODEL_SUFFIXES = EXPORT_SUFFIXES + CHECKPOINT_SUFFIXES + SAFETENSORS_SUFFIXES + TORCHSCRIPT_SUFFIXES
# Modules a state_dict's pickle names (tensors rebuilt from storages in dicts); any other, such as
# torch.nn.modules.linear or __main__, is a class of a whole pickled model.
STATE_DICT_MODULES = {"collections", "builtins", "__builtin__", "_codecs", "torch", "torch._utils",
                      "torch.serialization", "torch.storage"}
ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")  # a zip's first entry, or an empty zip's end record
SAFETENSORS_HEADER_LIMIT = 100 * 2 ** 20  # bytes: the safetensors library refuses bigger headers too
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
    if any("/code/__torch__/" in n for n in names) or (not names and suffix in TORCHSCRIPT_SUFFIXES):
        return "torchscript"
    return "checkpoint"


def _zip_names(p: Path) -> list[str]:
    try:
        with zipfile.ZipFile(p) as z:
            return z.namelist()
    except (OSError, zipfile.BadZipFile):
        return []


# -- what the first bytes say (no torch) -------------------------------------------------------------


def _head(p: Path, size: int = 16) -> bytes:
    try:
        with open(p, "rb") as f:
            return f.read(size)
    except OSError as exc:
        raise ModelFileError(f"cannot read {p}: {exc.strerror or exc}") from None


def check_model_bytes(path: str | Path, kind: str) -> None:
    """Raise ModelFileError when the file cannot be a model of ``kind`` by its first bytes: empty, or
    neither a zip (every torch.save since PyTorch 1.6, torch.export, TorchScript) nor, for a
    checkpoint, a pickle of protocol 2 or later (older torch.save). Read before anything asks
    whether to trust a pickle, so random bytes are not taken for one."""
    p = Path(path)
    head = _head(p)
    if not head:
        raise ModelFileError(f"{p.name}: the file is empty")
    if kind == "safetensors":
        safetensors_tensor_count(p)
        return
    if head.startswith(ZIP_MAGIC) or (kind == "checkpoint" and len(head) > 1 and head[0] == 0x80 and 2 <= head[1] <= 5):
        return
    saved = "a zip archive" if kind != "checkpoint" else "a zip archive (or, before PyTorch 1.6, a pickle)"
    raise ModelFileError(f"{p.name}: not a PyTorch file: it starts with bytes {head[:8].hex(' ')}, "
                         f"and what torch saves is {saved}")


def safetensors_tensor_count(path: str | Path) -> int:
    """How many tensors a safetensors file's header lists, read without the library: 8 bytes of
    little-endian header length, then that many bytes of JSON naming each tensor's dtype, shape
    and byte range. ModelFileError says what is wrong with a file that is not one."""
    p = Path(path)
    bad = f"{p.name}: not a valid safetensors file:"
    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            first = f.read(8)
            if len(first) < 8:
                raise ModelFileError(f"{bad} {size} bytes, too short for the 8-byte header length"
                                     if size else f"{p.name}: the file is empty")
            (length,) = struct.unpack("<Q", first)
            if length > size - 8:
                raise ModelFileError(f"{bad} its header length ({length:,} bytes) is past the end of the file "
                                     f"({size:,} bytes)")
            if length > SAFETENSORS_HEADER_LIMIT:
                raise ModelFileError(f"{bad} its header length ({length:,} bytes) is over 100 MiB")
            raw = f.read(length)
    except OSError as exc:
        raise ModelFileError(f"cannot read {p}: {exc.strerror or exc}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ModelFileError(f"{bad} its header is not JSON") from None
    if not isinstance(header, dict):
        raise ModelFileError(f"{bad} its header is not a JSON object")
    data = size - 8 - length
    count = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        ok = (isinstance(entry, dict) and isinstance(entry.get("dtype"), str)
              and isinstance(entry.get("shape"), list) and isinstance(entry.get("data_offsets"), list)
              and len(entry["data_offsets"]) == 2
              and all(type(v) is int and v >= 0 for v in entry["shape"] + entry["data_offsets"]))
        if not ok:
            raise ModelFileError(f"{bad} tensor {name[:80]!r} has no dtype, shape and data_offsets")
        start, end = entry["data_offsets"]
        if not start <= end <= data:
            raise ModelFileError(f"{bad} tensor {name[:80]!r} lies at bytes {start:,}-{end:,}, past the "
                                 f"{data:,} bytes of data")
        count += 1
    return count


def pickled_classes(path: str | Path) -> list[str]:
    """The classes other than a state_dict's that a torch.save zip's pickle names (``__main__.Net``,
    ``torch.nn.modules.linear.Linear``), read from its opcodes without loading anything: a whole
    pickled model names its classes, weights do not. Empty for a state_dict or a file not read."""
    try:
        with zipfile.ZipFile(path) as z:
            name = next((n for n in z.namelist() if n.endswith("/data.pkl")), None)
            data = z.read(name) if name else b""
    except (OSError, zipfile.BadZipFile):
        return []
    found: list[str] = []
    strings: list[str] = []
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name == "GLOBAL":
                module, _, attr = str(arg).partition(" ")
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                module, attr = strings[-2], strings[-1]
            else:
                if isinstance(arg, str):
                    strings.append(arg)
                continue
            if module not in STATE_DICT_MODULES and f"{module}.{attr}" not in found:
                found.append(f"{module}.{attr}")
    except Exception:  # a pickle cut short or of a newer protocol: not read, so not guessed
        return []
    return found


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
