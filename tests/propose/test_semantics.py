"""The op semantics shown to the model: every op the kernel library or a profiled model meets has
a statement of what it computes, and the output names agree with the ops' schemas."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kforge.propose.library.families import BY_OP
from kforge.propose.semantics import base_name, family_names, op_meaning

PROFILED = [line for line in (Path(__file__).with_name("profiled_ops.txt")).read_text().splitlines()
            if line and not line.startswith("#")]


@pytest.mark.parametrize("op", sorted(set(BY_OP) | set(PROFILED)))
def test_every_op_the_library_or_a_profile_meets_has_a_statement(op):
    meaning = op_meaning(op)
    assert meaning is not None, f"{op}: add its family to kforge/propose/op_semantics.json"
    assert meaning.family in family_names() and len(meaning.meaning) > 40


def test_named_outputs_match_the_schemas_return_count():
    checked = 0
    for op in sorted(set(BY_OP) | set(PROFILED)):
        meaning = op_meaning(op)
        if meaning is None or not meaning.returns:
            continue
        namespace, name, overload = op.split(".")
        schema = getattr(getattr(torch.ops.aten, name), overload)._schema
        assert len(meaning.returns) == len(schema.returns), op
        checked += 1
    assert checked >= 3  # group norm, layer norm, max pooling at least


def test_group_norm_says_what_it_returns():
    meaning = op_meaning("aten.native_group_norm.default")
    assert meaning is not None and meaning.returns == ("out", "mean", "rstd")
    assert "[N, group]" in meaning.note and "rstd = 1 / sqrt(var + eps)" in meaning.meaning


@pytest.mark.parametrize("op, base", [("aten.add_.Tensor", "add"), ("aten.index_put_.default",
                                      "index_put"), ("aten._softmax.default", "_softmax"),
                                      ("kforge_region.r_1.default", "kforge_region.r_1.default")])
def test_in_place_variants_share_their_bases_statement(op, base):
    assert base_name(op) == base


def test_an_unknown_op_has_no_statement():
    assert op_meaning("aten.definitely_not_an_op.default") is None
