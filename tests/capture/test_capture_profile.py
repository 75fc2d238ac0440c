"""Profiling a plain-torch model on the CPU: cards, shares, module paths and replayable samples."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kforge.capture import ModelOptions, load_model, profile
from kforge.capture.samples import SampleBudget
from kforge.core.opcard import NATIVE, VIEW_OR_COPY
from kforge.errors import KforgeError

TOY = Path(__file__).with_name("capture_toy.py")


def toy(factory: str = "build", **options):
    return load_model(f"{TOY}:{factory}", ModelOptions(device="cpu", **options))


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    staging = tmp_path_factory.mktemp("staging")
    loaded = toy()
    stages = []
    result = profile(loaded, samples_per_card=2, staging_dir=staging,
                     progress=lambda stage, done, total: stages.append((stage, done, total)))
    return loaded, result, staging, stages


def card(result, op):
    found = [c for c in result.cards if c.op == op]
    assert found, f"no {op} card in {[c.op for c in result.cards]}"
    return found[0]


def test_each_op_variant_is_one_card_counting_its_calls(profiled):
    _, result, _, _ = profiled
    softmax = card(result, "aten._softmax.default")
    assert softmax.calls == 2  # one per block, same shapes
    assert softmax.args[0]["shape"] == [2, 8, 8] and softmax.args[1:] == [-1, False]
    assert card(result, "aten.addmm.default").calls == 2
    assert card(result, "aten.sigmoid.default").calls == 1
    assert len({c.key for c in result.cards}) == len(result.cards)


def test_module_paths_say_who_issued_each_card(profiled):
    _, result, _, _ = profiled
    assert result.modules[card(result, "aten._softmax.default").key] == ["blocks.0", "blocks.1"]
    assert result.modules[card(result, "aten.addmm.default").key] == [
        "blocks.0.proj", "blocks.1.proj"]
    assert result.modules[card(result, "aten.sigmoid.default").key] == [""]  # the root module


def test_views_and_copies_are_listed_but_not_targets(profiled):
    _, result, _, _ = profiled
    sliced = card(result, "aten.slice.Tensor")
    assert sliced.library == VIEW_OR_COPY and not sliced.target
    assert card(result, "aten._softmax.default").library == NATIVE
    targets = [c.target for c in result.cards]
    assert targets == sorted(targets, reverse=True)  # targets ranked first


def test_shares_add_up_and_times_are_per_call(profiled):
    _, result, _, _ = profiled
    ops = [c for c in result.cards if c.region is None]  # region cards overlay their ops
    assert sum(c.share for c in ops) == pytest.approx(1.0)
    assert result.total_us == pytest.approx(sum(c.total_us for c in ops))
    for c in result.cards:
        assert c.eager_us == pytest.approx(c.total_us / c.calls)
    shares = [c.share for c in result.cards if c.target]
    assert shares == sorted(shares, reverse=True)
    assert result.timing == "cpu" and any("CPU" in w for w in result.warnings)


def test_progress_reports_every_stage(profiled):
    *_, stages = profiled
    assert [s for s, done, total in stages if done == total] == [
        "warmup", "profile", "regions", "samples"]


def test_samples_replay_the_real_masked_inputs(profiled):
    _, result, staging, _ = profiled
    softmax = card(result, "aten._softmax.default")
    files = sorted((staging / softmax.key).glob("*.pt"))
    assert [f.name for f in files] == ["0.pt", "1.pt"]
    sample = torch.load(files[0], weights_only=True)
    scores = sample["args"][0]
    upper = torch.ones(8, 8, dtype=torch.bool).triu(1)
    assert torch.isinf(scores[:, upper]).all() and torch.isfinite(scores[:, ~upper]).all()
    probs = torch.ops.aten._softmax.default(*sample["args"], **sample["kwargs"])
    assert torch.allclose(probs.sum(-1), torch.ones(2, 8))
    assert (probs[:, upper] == 0).all()


def test_samples_keep_strides_and_offsets_of_views(profiled):
    loaded, result, staging, _ = profiled
    sigmoid = card(result, "aten.sigmoid.default")
    assert sigmoid.args[0]["offset"] == 16
    sample = torch.load(staging / sigmoid.key / "0.pt", weights_only=True)
    x = sample["args"][0]
    with torch.no_grad():
        expected = loaded.model.trunk(loaded.args[0])[:, 1:]
    assert x.storage_offset() == 16 and x.stride() == expected.stride()
    assert torch.equal(x, expected)


def test_in_place_ops_are_sampled_before_they_write(profiled):
    loaded, result, staging, _ = profiled
    scale = card(result, "aten.mul_.Tensor")
    sample = torch.load(staging / scale.key / "0.pt", weights_only=True)
    block = loaded.model.blocks[0]
    x = loaded.args[0]
    mask = torch.ones(8, 8, dtype=torch.bool).triu(1)
    with torch.no_grad():
        before = torch.softmax((block.proj(x) @ x.transpose(-1, -2)).masked_fill(mask, -torch.inf),
                               dim=-1) @ x
    assert torch.allclose(sample["args"][0], before)


def test_views_get_no_samples(profiled):
    _, result, staging, _ = profiled
    saved = {p.name for p in staging.iterdir()}
    assert saved == {c.key for c in result.cards if c.target}


def test_samples_over_the_caps_become_specs_with_a_warning(tmp_path):
    result = profile(toy(), samples_per_card=1, staging_dir=tmp_path,
                     budget=SampleBudget(card_bytes=64, session_bytes=1 << 20))
    softmax = card(result, "aten._softmax.default")
    sample = torch.load(tmp_path / softmax.key / "0.pt", weights_only=True)
    assert sample["args"][0] == softmax.args[0]  # 512 bytes: over the 64-byte card cap
    assert any("over the byte caps" in w for w in result.warnings)


def test_no_samples_asked_writes_nothing(tmp_path):
    result = profile(toy(), samples_per_card=0, staging_dir=tmp_path)
    assert result.samples_saved == 0 and not any(tmp_path.iterdir())


def test_a_model_that_fails_to_run_is_one_clear_error(tmp_path):
    with pytest.raises(KforgeError) as caught:
        profile(toy("failing_model"), samples_per_card=1, staging_dir=tmp_path)
    message = str(caught.value)
    assert "failed to run on cpu in float32: RuntimeError" in message and "\n" not in message


UNUSUAL = Path(__file__).with_name("unusual_toy.py")


def unusual(factory: str):
    return load_model(f"{UNUSUAL}:{factory}", ModelOptions(device="cpu"))


@pytest.mark.filterwarnings("ignore::UserWarning")  # prototype and deprecated tensor kinds
@pytest.mark.parametrize(("factory", "op", "shown"), [
    ("sparse_model", "aten._sparse_addmm.default", "f32[4,16] sparse_coo"),
    ("nested_model", "aten.mul.Tensor", "f32 nested"),
    ("quantized_model", "aten.dequantize.self", "quint8[4,8]"),
])
def test_tensors_without_one_set_of_strides_are_profiled_and_described(tmp_path, factory, op,
                                                                       shown):
    result = profile(unusual(factory), samples_per_card=1, staging_dir=tmp_path)
    found = card(result, op)
    assert shown in found.signature
    assert all(c.region is None for c in result.cards)  # no kernel fuses such tensors' ops
    # no copy of such a tensor is kept as a sample: its spec stands in for it
    sample = torch.load(tmp_path / found.key / "0.pt", weights_only=True)
    assert not any(isinstance(a, torch.Tensor) and (a.is_sparse or a.is_nested or a.is_quantized)
                   for a in sample["args"])


def test_higher_order_operators_run_and_the_profile_says_what_it_could_not_see(tmp_path):
    result = profile(unusual("cond_model"), samples_per_card=0, staging_dir=tmp_path)
    ops = {c.op for c in result.cards}
    assert {"aten.sum.default", "aten.mul.Tensor"} <= ops  # the calls around the cond
    assert not ops & {"aten.sin.default", "aten.cos.default"}  # the branches ran unseen
    assert any("higher-order operators (cond)" in w for w in result.warnings)


def test_a_model_that_fails_only_under_the_recorder_is_told_so(tmp_path):
    with pytest.raises(KforgeError) as caught:
        profile(unusual("shy_model"), samples_per_card=0, staging_dir=tmp_path)
    message = str(caught.value)
    assert "under kforge's op recorder" in message and "RuntimeError: watched" in message
    assert "\n" not in message


def test_a_torchscript_submodule_is_profiled_its_ops_issued_by_its_parent(tmp_path):
    result = profile(unusual("scripted_model"), samples_per_card=0, staging_dir=tmp_path)
    tanh = card(result, "aten.tanh.default")  # run by the TorchScript interpreter
    assert result.modules[tanh.key] == [""]  # a ScriptModule takes no hooks: its parent's
    out = [c for c in result.cards if c.op == "aten.addmm.default" and c.args[0]["shape"] == [4]]
    assert out and result.modules[out[0].key] == ["out"]


def test_modules_run_on_other_threads_are_named_and_leave_attribution_alone(tmp_path):
    result = profile(unusual("pooled_model"), samples_per_card=0, staging_dir=tmp_path)
    assert any("modules branches.0, branches.1 ran on other threads" in w
               for w in result.warnings)
    addmm = [c for c in result.cards if c.op == "aten.addmm.default"]
    assert [result.modules[c.key] for c in addmm] == [["own"]]  # the branches' are unseen


def test_regions_of_shapes_the_timed_forwards_never_ran_are_left_out_and_said(tmp_path):
    result = profile(unusual("wandering_model"), samples_per_card=0, staging_dir=tmp_path)
    assert all(c.region is None for c in result.cards)
    assert any("1 fusion region was left out" in w for w in result.warnings)


def test_ops_that_draw_random_numbers_are_listed_but_not_targets(tmp_path):
    result = profile(unusual("noisy_model"), samples_per_card=0, staging_dir=tmp_path)
    assert not card(result, "aten.randn_like.default").target
    assert card(result, "aten.add.Tensor").target
