"""What capturing bundled examples 20 on must produce: tensor anatomy, memory, model files and the
big graphs (the keys are described in tests.example_expectations)."""

TENSORS_MEMORY_AND_MODELS = {
    "20_views_and_strides.py": {
        "calls": [],
        "call_count": 0,
        "error": None,
        "tensors": {
            "x": {"shape": [3, 4], "stride": [4, 1], "storage_offset": 0, "contiguous": True, "is_view": True,
                  "version": 1, "shares_storage_with": ["flat", "permuted", "row", "transposed"]},
            "transposed": {"shape": [4, 3], "stride": [1, 4], "storage_offset": 0, "contiguous": False,
                           "is_view": True, "version": 1, "shares_storage_with": ["flat", "permuted", "row", "x"]},
            "row": {"shape": [4], "stride": [1], "storage_offset": 4, "contiguous": True, "is_view": True,
                    "version": 1, "shares_storage_with": ["flat", "permuted", "transposed", "x"]},
            "flat": {"shape": [12], "stride": [1], "storage_offset": 0, "contiguous": True, "is_view": True,
                     "version": 1, "shares_storage_with": ["permuted", "row", "transposed", "x"]},
            "permuted": {"shape": [4, 3], "stride": [1, 4], "storage_offset": 0, "contiguous": False,
                         "is_view": True, "version": 1, "shares_storage_with": ["flat", "row", "transposed", "x"]},
            "reshaped": {"shape": [12], "stride": [1], "storage_offset": 0, "contiguous": True, "is_view": False,
                         "version": 0, "shares_storage_with": []},
            "compact": {"shape": [4, 3], "stride": [3, 1], "storage_offset": 0, "contiguous": True,
                        "is_view": False, "version": 0, "shares_storage_with": []},
        },
    },
    "21_contiguous_copy.py": {
        "calls": [],
        "call_count": 0,
        "error": None,
        "tensors": {
            "x": {"shape": [3, 4], "stride": [4, 1], "storage_offset": 0, "contiguous": True, "is_view": True,
                  "version": 1, "shares_storage_with": ["transposed"]},
            "transposed": {"shape": [4, 3], "stride": [1, 4], "storage_offset": 0, "contiguous": False,
                           "is_view": True, "version": 1, "shares_storage_with": ["x"]},
            "transposed_copy": {"shape": [4, 3], "stride": [3, 1], "storage_offset": 0, "contiguous": True,
                                "is_view": False, "version": 0, "shares_storage_with": []},
        },
    },
    "22_indexing_views.py": {
        "calls": [],
        "call_count": 0,
        "error": None,
        "tensors": {
            "x": {"shape": [3, 4], "stride": [4, 1], "storage_offset": 0, "contiguous": True, "is_view": True,
                  "version": 1, "shares_storage_with": ["every_other_row", "first_row", "second_column"]},
            "first_row": {"shape": [4], "stride": [1], "storage_offset": 0, "contiguous": True, "is_view": True,
                          "version": 1, "shares_storage_with": ["every_other_row", "second_column", "x"]},
            "second_column": {"shape": [3], "stride": [4], "storage_offset": 1, "contiguous": False,
                              "is_view": True, "version": 1,
                              "shares_storage_with": ["every_other_row", "first_row", "x"]},
            "every_other_row": {"shape": [2, 4], "stride": [8, 1], "storage_offset": 0, "contiguous": False,
                                "is_view": True, "version": 1,
                                "shares_storage_with": ["first_row", "second_column", "x"]},
            "cloned": {"shape": [3, 4], "stride": [4, 1], "storage_offset": 0, "contiguous": True,
                       "is_view": False, "version": 1, "shares_storage_with": []},
            "picked_rows": {"shape": [2, 4], "stride": [4, 1], "storage_offset": 0, "contiguous": True,
                            "is_view": False, "version": 1, "shares_storage_with": []},
            "masked": {"shape": [6], "stride": [1], "storage_offset": 0, "contiguous": True, "is_view": False,
                       "version": 0, "shares_storage_with": []},
        },
    },
    "23_numpy_sharing.py": {
        "calls": [],
        "call_count": 0,
        "error": None,
        "tensors": {
            "shared": {"shape": [3], "stride": [1], "storage_offset": 0, "contiguous": True, "is_view": False,
                       "version": 1, "shares_storage_with": []},
            "copied": {"shape": [3], "stride": [1], "storage_offset": 0, "contiguous": True, "is_view": False,
                       "version": 0, "shares_storage_with": []},
        },
        # shared.data_ptr() == array.ctypes.data == back_to_numpy.ctypes.data; copied has its own memory.
        "shares_numpy_memory": {"shared": True, "copied": False},
        "values": {"shared": [100.0, -5.0, 3.0], "copied": [1.0, 2.0, 3.0]},
    },
    "24_detach_shares.py": {
        "calls": [],
        "call_count": 0,
        "error": None,
        "tensors": {
            "x": {"shape": [3], "stride": [1], "storage_offset": 0, "contiguous": True, "is_view": False,
                  "version": 1, "shares_storage_with": ["detached"], "requires_grad": True},
            "detached": {"shape": [3], "stride": [1], "storage_offset": 0, "contiguous": True, "is_view": False,
                         "version": 1, "shares_storage_with": ["x"], "requires_grad": False},
        },
    },
    "25_inplace_safe_and_unsafe.py": {
        "calls": [
            {
                "api": "Tensor.backward",
                "root": "SumBackward0",
                "node_names": ["AccumulateGrad", "AddBackward0", "MulBackward0", "SumBackward0"],
                "line": 12,
                "leaf_grads": {"x": [2.0, 2.0, 2.0]},
            },
            {
                "api": "Tensor.backward",
                "root": "SumBackward0",
                "node_names": ["AccumulateGrad", "AddBackward0", "ExpBackward0", "SumBackward0"],
                "line": 17,
                "leaf_grads": {"x": [2.0, 2.0, 2.0]},
                "raised": "RuntimeError",
            },
        ],
        "call_count": 2,
        "error": {"type": "RuntimeError", "message": "modified by an inplace operation", "line": 17},
    },
    "26_device_mismatch.py": {
        "calls": [],
        "call_count": 0,
        "error": {"type": "RuntimeError", "message": "Tensor on device cpu is not on the expected device meta",
                  "line": 16},
    },
    "27_dtype_promotion.py": {
        "calls": [
            {
                "api": "Tensor.backward",
                "root": "SumBackward0",
                "node_names": ["AccumulateGrad", "AccumulateGrad", "MulBackward0", "MulBackward0", "SumBackward0"],
                "line": 13,
                "leaf_grads": {"w": [1.5, 1.0], "scale": [3.0, 8.0]},
            }
        ],
        "call_count": 1,
        "error": None,
    },
    "28_broadcasting_backward.py": {
        "calls": [
            {
                "api": "Tensor.backward",
                "root": "SumBackward0",
                "node_names": ["AccumulateGrad", "AccumulateGrad", "AccumulateGrad", "AddBackward0", "MmBackward0",
                               "MulBackward0", "SumBackward0"],
                "line": 13,
                "leaf_grads": {"b": [8.0, 8.0, 8.0], "s": 86.4, "w": [[8.0, 8.0, 8.0], [8.0, 8.0, 8.0]]},
                "grad_tol": 1e-4,
            }
        ],
        "call_count": 1,
        "error": None,
    },
    "30_graph_leak.py": {
        "calls": [
            {
                "api": "Tensor.backward",
                "root": "MseLossBackward0",
                "node_names": [
                    "AccumulateGrad", "AccumulateGrad", "AccumulateGrad", "AccumulateGrad", "AccumulateGrad",
                    "AccumulateGrad", "AddmmBackward0", "AddmmBackward0", "AddmmBackward0", "MseLossBackward0",
                    "ReluBackward0", "ReluBackward0", "TBackward0", "TBackward0", "TBackward0",
                ],
                "line": 25,
                "leaf_grads": {"model.4.bias": [-0.036797]},
                "grad_tol": 1e-4,
            }
        ],
        "call_count": 20,
        "same_graph_every_call": True,
        "error": None,
        # 20 validation graphs, each keeping two 256x256 ReLU outputs and the 256x1 prediction.
        "memory": {"graphs_in_losses": 20, "saved_storages": 60, "saved_bytes": 10_506_240},
    },
    "31_graph_leak_fixed.py": {
        "calls": [
            {
                "api": "Tensor.backward",
                "root": "MseLossBackward0",
                "node_names": [
                    "AccumulateGrad", "AccumulateGrad", "AccumulateGrad", "AccumulateGrad", "AccumulateGrad",
                    "AccumulateGrad", "AddmmBackward0", "AddmmBackward0", "AddmmBackward0", "MseLossBackward0",
                    "ReluBackward0", "ReluBackward0", "TBackward0", "TBackward0", "TBackward0",
                ],
                "line": 23,
                "leaf_grads": {"model.4.bias": [-0.036797]},
                "grad_tol": 1e-4,
            }
        ],
        "call_count": 20,
        "same_graph_every_call": True,
        "error": None,
        # Only the last validation graph, still held by the global `loss`.
        "memory": {"graphs_in_losses": 0, "saved_storages": 3, "saved_bytes": 525_312},
    },
    "32_caching_allocator.py": {
        "calls": [
            {
                "api": "Tensor.backward",
                "root": "MeanBackward0",
                "node_names": [
                    "AccumulateGrad", "AccumulateGrad", "AccumulateGrad", "AccumulateGrad", "AddmmBackward0",
                    "AddmmBackward0", "MeanBackward0", "PowBackward0", "ReluBackward0", "TBackward0", "TBackward0",
                ],
                "line": 34,
                "leaf_grads": {"model.2.bias": [0.105356]},
                "grad_tol": 1e-4,
            }
        ],
        "call_count": 3,
        "same_graph_every_call": True,
        "error": None,
    },
    "33_first_nan.py": {
        "calls": [
            {
                "api": "Tensor.backward",
                "root": "NegBackward0",
                "node_names": [
                    "AccumulateGrad", "AccumulateGrad", "AddBackward0", "AddmmBackward0", "LogBackward0",
                    "LogBackward0", "MeanBackward0", "MulBackward0", "MulBackward0", "NegBackward0",
                    "RsubBackward1", "SigmoidBackward0", "SqueezeBackward1", "TBackward0",
                ],
                "line": 38,
                "leaf_grads": {"fc.bias": None, "fc.weight": None},  # nan: the example's point
            },
            {
                "api": "Tensor.backward",
                "root": "BinaryCrossEntropyWithLogitsBackward0",
                "node_names": ["AccumulateGrad", "AccumulateGrad", "AddmmBackward0",
                               "BinaryCrossEntropyWithLogitsBackward0", "SqueezeBackward1", "TBackward0"],
                "line": 44,
                "leaf_grads": {"fc.bias": [-0.100561], "fc.weight": [[-0.088209, 0.075566]]},
                "grad_tol": 1e-5,
            },
        ],
        "call_count": 2,
        "error": None,
    },
    "34_vanishing_gradients.py": {
        "calls": [
            {
                "api": "Tensor.backward",
                "root": "MseLossBackward0",
                "node_names": ["AccumulateGrad"] * 22 + ["AddmmBackward0"] * 11 + ["MseLossBackward0"]
                + ["SigmoidBackward0"] * 10 + ["TBackward0"] * 11,
                "line": 35,
                # Only the smallest gradient is listed (layers.0.weight's norm is ~1e-8: the example's point).
                "leaf_grads": {"model.head.bias": [-0.514187]},
                "grad_tol": 1e-5,
            }
        ],
        "call_count": 5,
        "same_graph_every_call": True,
        "error": None,
    },
    "35_exploding_and_clipping.py": {
        "calls": [
            {
                "api": "Tensor.backward",
                "root": "MseLossBackward0",
                "node_names": ["AccumulateGrad"] * 6 + ["AddmmBackward0"] * 3 + ["MseLossBackward0"]
                + ["ReluBackward0"] * 2 + ["TBackward0"] * 3,
                "line": 36,
                "leaf_grads": {"fc3.bias": [0.0710145]},  # model is local to train(): named by module path
                "grad_tol": 1e-5,
            }
        ],
        "call_count": 16,
        "same_graph_every_call": True,
        "error": None,
    },
    "36_amp_skip.py": {
        "calls": [
            {
                "api": "Tensor.backward",
                "root": "MulBackward0",  # the loss times the scale
                "node_names": ["AccumulateGrad"] * 4 + ["AddmmBackward0"] * 2 + ["MseLossBackward0", "MulBackward0",
                               "ReluBackward0"] + ["TBackward0"] * 2 + ["ToCopyBackward0"] * 5,
                "line": 34,
                # .grad after backward, before scaler.step unscales it: 65536 × -0.712
                "leaf_grads": {"model.2.bias": [-46688.0]},
                "grad_tol": 1.0,
            }
        ],
        "call_count": 6,
        "same_graph_every_call": True,
        "error": None,
    },
    "40_model_small_cnn.py": {
        "calls": [],
        "call_count": 0,
        "error": None,
        "model": {
            "source": "globals",
            "root": "AddmmBackward0",
            "node_names": [
                "AccumulateGrad", "AccumulateGrad", "AccumulateGrad", "AccumulateGrad", "AccumulateGrad",
                "AccumulateGrad", "AddmmBackward0", "ConvolutionBackward0", "ConvolutionBackward0",
                "MaxPool2DWithIndicesBackward0", "MaxPool2DWithIndicesBackward0", "ReluBackward0",
                "ReluBackward0", "TBackward0", "ViewBackward0",
            ],
            "output_shape": [2, 10],
            "parameters": [
                "conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "classifier.weight", "classifier.bias",
            ],
        },
    },
    "41_model_build.py": {
        "calls": [],
        "call_count": 0,
        "error": None,
        "model": {
            "source": "build",
            "root": "AddmmBackward0",
            "node_names": [
                "AccumulateGrad", "AccumulateGrad", "AccumulateGrad", "AccumulateGrad", "AccumulateGrad",
                "AccumulateGrad", "AddmmBackward0", "AddmmBackward0", "NativeLayerNormBackward0", "TBackward0",
                "TBackward0", "TanhBackward0",
            ],
            "output_shape": [5, 4],
            "parameters": [
                "encoder.0.weight", "encoder.0.bias", "encoder.1.weight", "encoder.1.bias", "head.weight", "head.bias",
            ],
        },
    },
    "50_big_residual_mlp.py": {
        "calls": [
            {
                "api": "Tensor.backward",
                "root": "MeanBackward0",
                "node_count": 4802,
                "node_counts": {
                    "AccumulateGrad": 1600, "AddBackward0": 800, "AddmmBackward0": 800, "MeanBackward0": 1,
                    "PowBackward0": 1, "ReluBackward0": 800, "TBackward0": 800,
                },
                "line": 42,
                "leaf_grad_norms": {"model.blocks.0.fc.weight": 0.580351},
                "grad_tol": 1e-4,
            }
        ],
        "call_count": 1,
        "error": None,
        "final": {"loss": (1.04418, 1e-4)},
    },
    "51_huge_residual_mlp.py": {
        "calls": [
            {
                "api": "Tensor.backward",
                "root": "MeanBackward0",
                "node_count": 50000,
                "node_counts": {
                    "AccumulateGrad": 16666, "AddBackward0": 8333, "AddmmBackward0": 8333, "MeanBackward0": 1,
                    "PowBackward0": 1, "ReluBackward0": 8333, "TBackward0": 8333,
                },
                "line": 42,
                "leaf_grad_norms": {"model.blocks.0.fc.weight": 0.649795},
                "grad_tol": 1e-4,
            }
        ],
        "call_count": 1,
        "error": None,
        "final": {"loss": (1.06101, 1e-4)},
    },
}
