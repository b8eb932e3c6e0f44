"""What capturing each bundled example must produce (measured on torch 2.13.0, CPU).

Plain data, no tests and no torch import. Keys of each example's entry:

``calls``
    The captured backward calls, in order. For training loops (``same_graph_every_call`` is True)
    only the first call is listed, since every epoch builds the same graph; ``call_count`` gives
    how many calls the script makes in all. Each call has:

    - ``api``: "Tensor.backward" or "autograd.grad";
    - ``root``: the name of the node the call starts from;
    - ``node_names``: every node reachable from the root, as a sorted list (a multiset). For the big
      graphs, ``node_count`` and ``node_counts`` (name -> count) replace it;
    - ``line``: the script line of the call;
    - ``leaf_grads``: ``.grad`` of the leaves in that graph right after the call (None where unset),
      by variable name; floats or nested lists. When ``grad_tol`` is present, compare with that
      absolute tolerance; otherwise the values are exact;
    - ``outputs``: for "autograd.grad", the returned gradients;
    - ``leaf_grad_norms``: instead of ``leaf_grads`` for the big graphs, the norm of one leaf's grad;
    - ``retained_grads``: ``.grad`` of named non-leaf tensors after the call;
    - ``raised``: the exception type, when this call raised.

    Node names are ``grad_fn.name()`` with the C++ namespace removed: torch 2.13 reports leaves as
    "torch::autograd::AccumulateGrad", listed here as "AccumulateGrad". Leaves are named by the
    script's variable; a parameter of a module held in a global is named
    ``<global>.<name in named_parameters()>``, e.g. "model.fc1.weight".

``call_count``
    Number of backward / autograd.grad calls the script makes when run as a script.

``error``
    None, or ``{"type", "message", "line"}``: the exception the script ends with, a fragment of its
    message and the script line that raised it.

``final``
    Values after the script has run, as ``(expected, absolute tolerance)``.

``values``
    Exact values of global tensors at the end of the script (``tolist()``).

``shares_numpy_memory``
    Whether a global tensor uses the memory of the NumPy array ``array``.

``tensors``
    Tensor anatomy at the end of the script, by global variable name: shape, stride,
    storage_offset, contiguous, is_view (``_base is not None``), version (``_version``) and the other
    globals sharing its storage.

``memory``
    For the leak examples, at the end of the script: ``graphs_in_losses`` (elements of ``losses``
    that still hold a grad_fn), and ``saved_storages`` / ``saved_bytes``: the distinct storages of
    saved tensors still readable in graphs reachable from the globals (lists included), leaving out
    the storages of parameters and of global tensors.

``model``
    For model files: where ``model`` / ``example_input`` come from ("globals" or "build"), and the
    graph of ``model(example_input)`` before any loss (root, sorted node names), the output shape
    and the parameter names. Opened as a model, the app's own call (api "model") contains these
    nodes plus those of its loss. Run as a script, these files make no backward call.
"""

from tests.example_expectations_more import TENSORS_MEMORY_AND_MODELS

AUTOGRAD = {  # 01-19: graphs, gradients and the errors autograd raises
    "01_multiply.py": {
        "calls": [
            {
                "api": "Tensor.backward",
                "root": "MulBackward0",
                "node_names": ["AccumulateGrad", "AccumulateGrad", "MulBackward0"],
                "line": 15,
                "leaf_grads": {"a": 3.0, "b": 2.0},
            }
        ],
        "call_count": 1,
        "error": None,
    },
    "02_polynomial.py": {
        "calls": [
            {
                "api": "Tensor.backward",
                "root": "AddBackward0",
                "node_names": ["AccumulateGrad", "AddBackward0", "AddBackward0", "MulBackward0", "PowBackward0"],
                "line": 12,
                "leaf_grads": {"x": 8.0},
            }
        ],
        "call_count": 1,
        "error": None,
    },
    "03_second_order.py": {
        "calls": [
            {
                "api": "autograd.grad",
                "root": "PowBackward0",
                "node_names": ["AccumulateGrad", "PowBackward0"],
                "line": 11,
                "leaf_grads": {"x": None},
                "outputs": [12.0],
            },
            {
                "api": "autograd.grad",
                "root": "MulBackward0",
                "node_names": ["AccumulateGrad", "MulBackward0", "MulBackward1", "PowBackward0"],
                "line": 15,
                "leaf_grads": {"x": None},
                "outputs": [12.0],
            },
        ],
        "call_count": 2,
        "error": None,
    },
    "04_non_scalar.py": {
        "calls": [
            {
                "api": "Tensor.backward",
                "root": "MulBackward0",
                "node_names": ["AccumulateGrad", "MulBackward0"],
                "line": 12,
                "leaf_grads": {"x": [2.0, 2.0, 2.0]},
            }
        ],
        "call_count": 1,
        "error": None,
    },
    "05_breaking_the_graph.py": {
        "calls": [
            {
                "api": "Tensor.backward",
                "root": "AddBackward0",
                "node_names": ["AccumulateGrad", "AddBackward0", "AddBackward0", "AddBackward0", "PowBackward0"],
                "line": 21,
                "leaf_grads": {"x": 12.0},
            }
        ],
        "call_count": 1,
        "error": None,
    },
    "06_retain_grad.py": {
        "calls": [
            {
                "api": "Tensor.backward",
                "root": "MulBackward0",
                "node_names": ["AccumulateGrad", "AddBackward0", "MulBackward0", "MulBackward0"],
                "line": 13,
                "leaf_grads": {"x": 15.0},
                "retained_grads": {"hidden": 3.0, "other_hidden": None},
            }
        ],
        "call_count": 1,
        "error": None,
    },
    "07_grad_accumulation.py": {
        "calls": [
            {
                "api": "Tensor.backward",
                "root": "PowBackward0",
                "node_names": ["AccumulateGrad", "PowBackward0"],
                "line": 10,
                "leaf_grads": {"x": 4.0},
            },
            {
                "api": "Tensor.backward",
                "root": "PowBackward0",
                "node_names": ["AccumulateGrad", "PowBackward0"],
                "line": 14,
                "leaf_grads": {"x": 8.0},
            },
            {
                "api": "Tensor.backward",
                "root": "PowBackward0",
                "node_names": ["AccumulateGrad", "PowBackward0"],
                "line": 21,
                "leaf_grads": {"x": 4.0},
            },
        ],
        "call_count": 3,
        "error": None,
    },
    "08_inplace_error.py": {
        "calls": [
            {
                "api": "Tensor.backward",
                "root": "SumBackward0",
                "node_names": ["AccumulateGrad", "MulBackward0", "SigmoidBackward0", "SumBackward0"],
                "line": 14,
                "leaf_grads": {"a": None},
                "raised": "RuntimeError",
            }
        ],
        "call_count": 1,
        "error": {"type": "RuntimeError", "message": "modified by an inplace operation", "line": 14},
    },
    "09_backward_twice.py": {
        "calls": [
            {
                "api": "Tensor.backward",
                "root": "MulBackward0",
                "node_names": ["AccumulateGrad", "AccumulateGrad", "MulBackward0"],
                "line": 11,
                "leaf_grads": {"w": 2.0, "x": 5.0},
            },
            {
                "api": "Tensor.backward",
                "root": "MulBackward0",
                "node_names": ["AccumulateGrad", "AccumulateGrad", "MulBackward0"],
                "line": 15,
                "leaf_grads": {"w": 2.0, "x": 5.0},
                "raised": "RuntimeError",
            },
        ],
        "call_count": 2,
        "error": {
            "type": "RuntimeError",
            "message": "Trying to backward through the graph a second time",
            "line": 15,
        },
    },
    "10_straight_through.py": {
        "calls": [
            {
                "api": "Tensor.backward",
                "root": "SumBackward0",
                "node_names": ["AccumulateGrad", "RoundSTEBackward", "SumBackward0"],
                "line": 22,
                "leaf_grads": {"x": [1.0, 1.0, 1.0, 1.0]},
            },
            {
                "api": "autograd.grad",
                "root": "SumBackward0",
                "node_names": ["AccumulateGrad", "RoundBackward0", "SumBackward0"],
                "line": 26,
                "leaf_grads": {"x": [1.0, 1.0, 1.0, 1.0]},
                "outputs": [[0.0, 0.0, 0.0, 0.0]],
            },
        ],
        "call_count": 2,
        "error": None,
    },
    "11_linear_regression_scratch.py": {
        "calls": [
            {
                "api": "Tensor.backward",
                "root": "MeanBackward0",
                "node_names": [
                    "AccumulateGrad", "AccumulateGrad", "AddBackward0", "MeanBackward0",
                    "MulBackward0", "PowBackward0", "SubBackward0",
                ],
                "line": 19,
                "leaf_grads": {"b": [-2.00743], "w": [-1.36018]},
                "grad_tol": 1e-4,
            }
        ],
        "call_count": 200,
        "same_graph_every_call": True,
        "error": None,
        "final": {"w": (2.0, 0.05), "b": (1.0, 0.05), "loss": (0.0105, 0.002)},
    },
    "12_linear_regression_nn.py": {
        "calls": [
            {
                "api": "Tensor.backward",
                "root": "MseLossBackward0",
                "node_names": ["AccumulateGrad", "AccumulateGrad", "AddmmBackward0", "MseLossBackward0", "TBackward0"],
                "line": 21,
                "leaf_grads": {"model.bias": [-1.91718], "model.weight": [[-1.52945]]},
                "grad_tol": 1e-4,
            }
        ],
        "call_count": 200,
        "same_graph_every_call": True,
        "error": None,
        "final": {"model.weight": (2.0, 0.05), "model.bias": (1.0, 0.05), "loss": (0.0105, 0.002)},
    },
    "13_mlp_classifier.py": {
        "calls": [
            {
                "api": "Tensor.backward",
                "root": "NllLossBackward0",
                "node_names": [
                    "AccumulateGrad", "AccumulateGrad", "AccumulateGrad", "AccumulateGrad",
                    "AddmmBackward0", "AddmmBackward0", "LogSoftmaxBackward0", "NllLossBackward0",
                    "ReluBackward0", "TBackward0", "TBackward0",
                ],
                "line": 34,
                # Only the smallest gradient is listed; the others have shapes
                # model.fc1.weight [16, 4], model.fc1.bias [16], model.fc2.weight [3, 16].
                "leaf_grads": {"model.fc2.bias": [-0.0772816, 0.0789037, -0.00162206]},
                "grad_tol": 1e-4,
            }
        ],
        "call_count": 10,
        "same_graph_every_call": True,
        "error": None,
        "final": {"loss": (0.1695, 0.01), "accuracy": (0.983, 0.02)},
    },
    "14_checkpointing.py": {
        "calls": [
            {  # call #1, nested: run by CheckpointFunctionBackward inside call #0 on the recomputed
                # block; it finishes first, so it is stored first
                "api": "autograd.backward",
                "root": "ReluBackward0",
                "node_names": ["AccumulateGrad", "AccumulateGrad", "AccumulateGrad", "AddmmBackward0",
                               "ReluBackward0", "TBackward0"],
                "line": 24,
                "leaf_grads": {"layer1.bias": [0.181609, 0.830388, 0.0, 0.0]},
                "grad_tol": 1e-5,
            },
            {
                "api": "Tensor.backward",
                "root": "SumBackward0",
                "node_names": ["AccumulateGrad", "AccumulateGrad", "AccumulateGrad", "AddmmBackward0",
                               "CheckpointFunctionBackward", "SumBackward0", "TBackward0"],
                "line": 24,
                "leaf_grads": {"layer2.bias": 2.0, "layer2.weight": [0.940697, 1.128237, 0.0, 0.0]},
                "grad_tol": 1e-5,
            },
            {
                "api": "Tensor.backward",
                "root": "SumBackward0",
                "node_names": ["AccumulateGrad", "AccumulateGrad", "AccumulateGrad", "AccumulateGrad",
                               "AccumulateGrad", "AddmmBackward0", "AddmmBackward0", "ReluBackward0",
                               "SumBackward0", "TBackward0", "TBackward0"],
                "line": 30,
                "leaf_grads": {"layer1.bias": [0.181609, 0.830388, 0.0, 0.0], "layer2.bias": 4.0},
                "grad_tol": 1e-5,
            },
            # calls #4 to #6, nested in #3: each block recomputed, the last block first
            *[{"api": "autograd.backward", "root": "AddmmBackward0", "line": 51, "leaf_grads": {},
               "node_names": ["AccumulateGrad"] * 5 + ["AddmmBackward0"] * 2 + ["ReluBackward0"]
               + ["TBackward0"] * 2}] * 3,
            {  # call #3: the deeper model, checkpointed block by block
                "api": "Tensor.backward",
                "root": "SumBackward0",
                "node_names": ["AccumulateGrad", "AccumulateGrad", "AccumulateGrad", "AddmmBackward0",
                               "CheckpointFunctionBackward", "CheckpointFunctionBackward",
                               "CheckpointFunctionBackward", "SumBackward0", "TBackward0"],
                "line": 51,
                "leaf_grads": {"head.bias": 256.0},
            },
            {  # call #7: the same model without checkpointing
                "api": "Tensor.backward",
                "root": "SumBackward0",
                "node_names": ["AccumulateGrad"] * 15 + ["AddmmBackward0"] * 7 + ["ReluBackward0"] * 3
                + ["SumBackward0"] + ["TBackward0"] * 7,
                "line": 53,
                "leaf_grads": {"head.bias": 512.0},
            },
        ],
        "call_count": 8,
        "error": None,
    },
    "15_hooks.py": {
        "calls": [
            {
                "api": "Tensor.backward",
                "root": "AddBackward0",
                "node_names": ["AccumulateGrad", "AccumulateGrad", "AccumulateGrad", "AccumulateGrad",
                               "AddBackward0", "AddmmBackward0", "BackwardHookFunctionBackward",
                               "BackwardHookFunctionBackward", "MulBackward0", "SumBackward0", "TBackward0"],
                "line": 23,
                "leaf_grads": {"x": 12.0, "layer.bias": 1.0, "layer.weight": [1.0, 1.0]},
            }
        ],
        "call_count": 1,
        "error": None,
    },
    "16_requires_grad_propagation.py": {
        "calls": [
            {
                "api": "Tensor.backward",
                "root": "AddBackward0",
                "node_names": ["AccumulateGrad", "AccumulateGrad", "AddBackward0", "MulBackward0", "SumBackward0"],
                "line": 16,
                "leaf_grads": {"a": [3.0, 4.0], "b": [1.0, 2.0]},
            }
        ],
        "call_count": 1,
        "error": None,
    },
    "17_why_grad_is_none.py": {
        "calls": [
            {
                "api": "Tensor.backward",
                "root": "SumBackward0",
                "node_names": ["AccumulateGrad", "AddBackward0", "MulBackward0", "MulBackward0", "SumBackward0"],
                "line": 16,
                "leaf_grads": {"x": [2.0, 2.0], "w": None},
            }
        ],
        "call_count": 1,
        "error": None,
    },
    "18_inplace_on_leaf.py": {
        "calls": [
            {
                "api": "Tensor.backward",
                "root": "SumBackward0",
                "node_names": ["AccumulateGrad", "MulBackward0", "SumBackward0"],
                "line": 14,
                "leaf_grads": {"x": [4.0, 6.0]},
            }
        ],
        "call_count": 1,
        "error": {"type": "RuntimeError", "message": "a leaf Variable that requires grad is being used in an "
                  "in-place operation", "line": 17},
    },
    "19_backward_needs_a_scalar.py": {
        "calls": [
            {
                "api": "Tensor.backward",
                "root": "MeanBackward1",
                "node_names": ["AccumulateGrad", "MeanBackward1"],
                "line": 10,
                "leaf_grads": {"x": [1 / 3] * 6},
                "grad_tol": 1e-6,
            },
            {
                "api": "Tensor.backward",
                "root": "MeanBackward1",
                "node_names": ["AccumulateGrad", "MeanBackward1"],
                "line": 15,
                "leaf_grads": {"x": None},
                "raised": "RuntimeError",
            },
        ],
        "call_count": 2,
        "error": {"type": "RuntimeError", "message": "grad can be implicitly created only for scalar outputs",
                  "line": 15},
    },
}


# 20 on: tensor anatomy, memory, model files and the big graphs (tests.example_expectations_more).
EXPECTATIONS = {**AUTOGRAD, **TENSORS_MEMORY_AND_MODELS}
