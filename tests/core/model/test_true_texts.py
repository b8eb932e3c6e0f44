"""Texts the app shows that must say exactly what happens."""

from __future__ import annotations

from core.model.formulas import FORMULAS, formula_lines


def test_accumulate_grad_names_the_leafs_grad_not_a_renamed_attribute():
    assert formula_lines("AccumulateGrad", {}, [], "fc2.weight") == [
        "fc2.weight.grad += grad_fc2.weight (or fc2.weight.grad = grad_fc2.weight when it is None)"]
    assert formula_lines("AccumulateGrad") == ["variable.grad += grad (or variable.grad = grad when it is None)"]


def test_names_followed_by_a_mark_are_substituted():
    assert formula_lines("TBackward0", {}, ["x"], "y") == ["grad_self (x) = grad_yᵀ"]
    assert formula_lines("MmBackward0", {"self": "x", "mat2": "w"}, ["x", "w"], "y") == [
        "grad_self (x) = grad_y @ wᵀ", "grad_mat2 (w) = xᵀ @ grad_y"]
    assert formula_lines("DivBackward0", {"self": "a", "other": "b"}, ["a", "b"], "c") == [
        "grad_self (a) = grad_c / b", "grad_other (b) = −grad_c · a / b²"]


def test_no_name_is_rewritten_after_a_dot_or_inside_a_longer_name():
    names = {"self": "x", "other": "z", "mat2": "w", "indices": "idx", "weight": "W"}
    for node in FORMULAS:
        for line in formula_lines(node, names, [], "out"):
            assert ".grad_out" not in line, (node, line)
            assert "x_sym_sizes" not in line and "x_sym_numel" not in line, (node, line)
    assert formula_lines("ViewBackward0", {"self": "x"}, ["x"], "y") == [
        "grad_self (x) = grad_y reshaped to self_sym_sizes"]
