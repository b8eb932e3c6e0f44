"""Why a tensor's ``.grad`` is None, and why a next-functions entry is None, in plain words.

Plain data only (no torch): the inspector and the exporters use it on a captured trace.
"""

from __future__ import annotations

from core.model.anatomy import hook_name
from core.model.trace import CallInfo, TensorInfo

CUT_WORDS = {
    "detach": "detached: made by .detach(), which shares memory but cuts the graph",
    "no_grad": "made under torch.no_grad(): no grad_fn was recorded",
    "number": "a Python number (a literal, or a value taken out with .item())",
    "item": "a Python number taken out with .item(): no gradient flows back through it",
    "constant": "a tensor with requires_grad=False (a constant for autograd)",
    "integer": "an integer tensor: only floating point tensors can require grad",
}
CUT_SHORT = {"detach": "made by .detach()", "no_grad": "made under no_grad", "number": "Python number",
             "constant": "requires_grad=False", "integer": "integer tensor"}


def cut_text(cut: dict, short: bool = False) -> str:
    """A None input as words: 'detached (d)', 'Python number 20'."""
    cause = cut.get("cause")
    if cause == "item":  # 'scale = (x.sum() * 2).item() → 6', the call as the script wrote it
        said = f"{cut.get('name') or '.item()'} → {cut.get('value')}"
        return said if short else f"{said} · {CUT_WORDS['item']}"
    words = (CUT_SHORT if short else CUT_WORDS).get(cause, "no gradient flows here")
    who = cut.get("name") or cut.get("value")
    if who and short:
        return f"{words} {who}" if cause == "number" else f"{who}: {words}"
    if who:
        return f"{cut.get('name') or cut.get('value')} · {words}"
    return words


NOT_ON_PATH = "not on the path to the loss: backward never reaches it"


def _own(t: TensorInfo, call: CallInfo) -> TensorInfo | None:
    """The call's record of ``t``: ``t`` itself, or (for a tensor as the script ended, whose id is of
    another table) the call's tensor of the same name; None when the call holds no such tensor."""
    same = call.tensor(t.id)
    if same is t:
        return same
    return next((c for c in call.tensors if t.name and c.name == t.name), None)


def grad_none_cause(t: TensorInfo, call: CallInfo | None = None, stepping: bool = False) -> str:
    """Why ``t.grad`` is None: unused, detached, made under no_grad, not a leaf, or not reached yet.

    ``call``: the call ``t`` is judged against (its own, or the one shown); ``stepping``: that call
    is being stepped, so a node it has not run yet is still to come."""
    if not t.requires_grad:
        if t.origin == "detach":
            return "cut by detach(): it shares memory with a tensor that requires grad, but no gradient reaches it"
        if t.origin == "no_grad":
            return "made under torch.no_grad(): it requires no grad and never gets one"
        return "requires_grad is False, so autograd computes no gradient for it"
    if not t.is_leaf and not t.retains_grad:
        return ("not a leaf: autograd keeps .grad only for leaves; call retain_grad() on it "
                "before backward to keep its gradient")
    if call is not None and call.api in ("Tensor.backward", "autograd.backward", "model", "unreached"):
        own = _own(t, call)
        on_path = own is not None and (
            any(n.variable == own.id for n in call.nodes) or (own.grad_fn is not None and own.retains_grad))
        if not on_path:
            return NOT_ON_PATH
        if call.api == "unreached":
            return "no backward call ran on this graph, so no gradient reached it"
        if stepping:
            return ".grad is None: backward has not reached it yet"
        if call.error is not None:
            return f"backward raised {call.error.type} before any gradient reached it"
        return ".grad is None: its node is in this graph, but no gradient was accumulated into it"
    if call is not None and call.api == "autograd.grad":
        return "autograd.grad() returns gradients instead of filling .grad"
    if t.retains_grad:
        return "retain_grad() was called, but no backward has reached it"
    return ".grad is None: no backward has filled it (or it was set back to None)"


FREED_MESSAGE = "backward through the graph a second time"
# Errors backward raises on its arguments before any node runs: they are the call's, at its line.
CALL_MESSAGES = (
    "grad can be implicitly created only for",  # a non-scalar output and no gradient argument
    "does not require grad and does not have a grad_fn",
    "Mismatch in shape: grad_output",
)


def blamed_nodes(call: CallInfo) -> set[str] | None:
    """The nodes a failed call's error belongs to; None when no node can be named (mark them all).

    Stale saved tensors blame their nodes; "backward through the graph a second time" blames the
    nodes whose saved tensors the first backward freed (never the leaves, which saved nothing).
    An error about backward's arguments (a non-scalar output without a gradient) blames no node.
    """
    if call.error is None or any(m in call.error.message for m in CALL_MESSAGES):
        return set()
    stale = {n.id for n in call.nodes if n.stale is not None}
    if stale:
        return stale
    if FREED_MESSAGE in call.error.message:
        freed = {n.id for n in call.nodes if any(s.freed for s in n.saved)}
        if freed:
            return freed
    return None


HOOK_NODE = "BackwardHookFunctionBackward"


def hook_lines(call: CallInfo, node) -> list[str]:
    """Short labels of the hooks that run at a node: its tensor's hooks, or a module's backward hook."""
    out = []
    t = call.tensor(node.variable or node.tensor)
    for h in (t.hooks or ()) if t is not None else ():
        out.append("hook " + h.split(" (")[0])
    if node.name == HOOK_NODE:
        out.append("module backward hooks")
    return out


def hook_tips(call: CallInfo, node) -> list[str]:
    """What each hook at a node does, in words."""
    out = []
    t = call.tensor(node.variable or node.tensor)
    for h in (t.hooks or ()) if t is not None else ():
        where = "before the gradient is accumulated into .grad" if node.kind == "accumulate_grad" else \
            "on the gradient of this node's output, before the node runs"
        out.append(f"{hook_name(call, h)}: registered with register_hook on {t.name or 'this tensor'}; runs {where} "
                   "and may replace the gradient")
    if node.name == HOOK_NODE:
        out.append("Module.register_full_backward_hook: its hooks see the module's grad_input and grad_output here")
    if node.recomputed:
        out.append("Made under torch.utils.checkpoint(use_reentrant=False): forward dropped this node's saved "
                   "tensors and backward recomputes them from the checkpoint's inputs when it needs them.")
    if node.name == CHECKPOINT_NODE:
        out.append("torch.utils.checkpoint(use_reentrant=True): this node reruns the checkpointed function and "
                   "calls backward on it, inside this backward" +
                   (f" (call{'s' if len(call.options.get('nested', [])) > 1 else ''} "
                    f"{', '.join('#' + str(i) for i in call.options.get('nested', []))})." if call.options.get("nested")
                    else "."))
    return out


CHECKPOINT_NODE = "CheckpointFunctionBackward"


def node_notes(call: CallInfo, node) -> list[str]:
    """Short notes on a node: recomputed saved tensors, the backward nested in a checkpoint."""
    out = []
    if node.recomputed:
        out.append("↻ saved tensors recomputed")
    if node.name == CHECKPOINT_NODE and not call.options.get("_nested_calls"):  # else the box lists them
        nested = call.options.get("nested") or []
        out.append("runs " + (", ".join(f"backward #{i}" for i in nested) if nested else "its own backward")
                   + " inside")
    return out
