"""Materializing op-card arguments: exact layouts, canaries, samples, mimicking random values."""

from __future__ import annotations

import math

import pytest
import torch

from kforge.core.argspec import resolve_op
from kforge.core.opcard import OpCard
from kforge.eval.verify.inputs import (
    Geometry,
    InputFactory,
    allocate,
    index_bounds,
    load_samples,
)
from tests.eval.candidates import tensor

CPU = torch.device("cpu")


def test_allocation_keeps_shape_strides_offset_and_has_canaries_around():
    g = Geometry((3, 4), (1, 5), 7, torch.float32)
    buf = allocate(g, CPU)
    assert buf.view.shape == (3, 4) and buf.view.stride() == (1, 5)
    assert buf.view.storage_offset() == 7
    buf.view.fill_(1.0)
    start = (buf.view.data_ptr() - buf.base.data_ptr()) // 4
    assert math.isnan(buf.base[start - 8 - 1].item())  # leading canary, before the offset
    assert math.isnan(buf.base[start + g.span].item())  # trailing canary
    assert int(buf.view_mask().sum()) == g.span


@pytest.mark.parametrize("shape, stride, offset", [((0,), (1,), 0), ((3, 0, 4), (0, 4, 1), 5)])
def test_an_empty_tensor_is_checked_where_it_sits(shape, stride, offset):
    """A tensor of no elements (cat's legacy empty cache) has address 0, so its place in its
    buffer comes from the storage: its check is the canaries around it, not a walk of the
    address space from 0 (which hung the evaluation)."""
    buf = allocate(Geometry(shape, stride, offset, torch.float16), CPU, 130)
    assert buf.view.data_ptr() == 0
    trailing_canary = buf.base.numel() - buf.start - buf.geometry.span
    assert buf.start == trailing_canary + offset  # the leading canary, then the storage offset
    inputs = InputFactory(OpCard("aten.cat.default",
                                 [{"t": "list", "items": [tensor([0]), tensor([2, 3])]}, 0]),
                          CPU).random_set(1)
    assert inputs.changed(set()) == []
    inputs.buffers[0].base[0] = 5.0  # the empty tensor's leading canary
    assert len(inputs.changed(set())) == 1


def test_random_sets_are_reproducible_per_seed_and_differ_between_seeds():
    card = OpCard("aten.add.Tensor", [tensor([16, 8]), tensor([16, 8])])
    factory = InputFactory(card, CPU)
    a, b, c = factory.random_set(1), factory.random_set(1), factory.random_set(2)
    assert torch.equal(a.args[0], b.args[0])
    assert not torch.equal(a.args[0], c.args[0])
    assert a.label == "seed 1"


def test_non_tensor_arguments_are_rebuilt():
    card = OpCard("aten.sum.dim_IntList", [tensor([4, 4]), {"t": "list", "items": [1]}, False],
                  {"dtype": {"t": "dtype", "v": "float64"}})
    inputs = InputFactory(card, CPU).random_set(0)
    assert inputs.args[1] == (1,) and inputs.args[2] is False
    assert inputs.kwargs["dtype"] is torch.float64


@pytest.mark.parametrize("op, args, kwargs", [
    ("aten._to_copy.default", [tensor([4])], {"device": {"t": "device", "v": "cuda:3"}}),
    ("aten._to_copy.default", [tensor([4])], {"device": {"t": "device", "v": "meta"}}),
    ("aten.ones.default", [[4]], {}),  # a factory naming no device
    ("aten.full.default", [[4], 1.0], {"device": None}),
], ids=["another-gpu", "another-device", "factory", "factory-device-none"])
def test_every_device_a_card_names_is_the_evaluation_device(op, args, kwargs):
    """A device is data: a card recorded on another GPU, one naming another device and a
    factory naming none all run on the device evaluating them (on a GPU, "cpu" or no device put
    a tensor of the card's size in host memory)."""
    inputs = InputFactory(OpCard(op, args, kwargs), CPU).random_set(0)
    assert inputs.kwargs["device"] == CPU
    assert resolve_op(op)(*inputs.args, **inputs.kwargs).device == CPU


def test_samples_are_replayed_with_their_layout(tmp_path):
    base = torch.arange(40, dtype=torch.float32)
    x = base.as_strided((4, 3), (1, 8), 5)  # transposed-like view with an offset
    spec = {"t": "tensor", "shape": [4, 3], "stride": [1, 8], "dtype": "float32", "offset": 5}
    card = OpCard("aten.relu.default", [spec])
    (tmp_path / card.key).mkdir()
    torch.save({"args": [x], "kwargs": {}}, tmp_path / card.key / "0.pt")
    factory = InputFactory(card, CPU, tmp_path)
    [sample] = factory.sets(seeds=())
    assert sample.label == "sample 0"
    assert torch.equal(sample.args[0], x)
    assert sample.args[0].stride() == (1, 8) and sample.args[0].storage_offset() == 5


@pytest.mark.parametrize("key", ["../outside", "/abs/outside", "..", "a/../../outside"])
def test_a_crafted_card_key_reads_no_samples_outside_the_samples_folder(tmp_path, key):
    from dataclasses import replace

    spec = {"t": "tensor", "shape": [4], "stride": [1], "dtype": "float32", "offset": 0}
    card = replace(OpCard("aten.relu.default", [spec]), key=key)
    samples = tmp_path / "session" / "samples"
    samples.mkdir(parents=True)
    for folder in (tmp_path / "session" / "outside", tmp_path / "outside", samples.parent):
        folder.mkdir(parents=True, exist_ok=True)
        torch.save({"args": [torch.full((4,), 7.0)], "kwargs": {}}, folder / "0.pt")
    if key.startswith("/"):
        card = replace(card, key=str(tmp_path / "outside"))
    factory = InputFactory(card, CPU, samples)
    assert [s.label for s in factory.sets(seeds=(1,))] == ["seed 1"]


def test_a_sample_is_mapped_from_its_file_and_a_compressed_one_is_skipped(tmp_path):
    """A sample holds no more than its file: one whose records are compressed (a few KiB that
    inflated to gigabytes of host memory as it was read) is skipped like a damaged one."""
    import zipfile

    card = OpCard("aten.relu.default", [tensor([1 << 16])])
    folder = tmp_path / card.key
    folder.mkdir()
    torch.save({"args": [torch.ones(1 << 16)], "kwargs": {}}, folder / "0.pt")
    with zipfile.ZipFile(folder / "0.pt") as stored, \
            zipfile.ZipFile(folder / "1.pt", "w", zipfile.ZIP_DEFLATED) as deflated:
        for record in stored.infolist():
            deflated.writestr(record.filename, stored.read(record.filename))
    assert (folder / "1.pt").stat().st_size < (folder / "0.pt").stat().st_size // 50
    assert [label for label, _ in load_samples(tmp_path, card, 2)] == ["sample 0"]


def test_a_pipe_or_a_link_among_the_samples_is_skipped_without_blocking(tmp_path):
    """A shared database's samples folder may hold a pipe (or a link to one) named like a
    sample: opening it would block the loader forever. Only regular files are read."""
    import os
    import threading

    card = OpCard("aten.relu.default", [tensor([8])])
    folder = tmp_path / card.key
    folder.mkdir()
    os.mkfifo(folder / "0.pt")
    (folder / "1.pt").symlink_to(folder / "0.pt")
    torch.save({"args": [torch.ones(8)], "kwargs": {}}, tmp_path / "elsewhere.pt")
    (folder / "2.pt").symlink_to(tmp_path / "elsewhere.pt")
    torch.save({"args": [torch.ones(8)], "kwargs": {}}, folder / "3.pt")
    found: list = []
    loader = threading.Thread(target=lambda: found.append(load_samples(tmp_path, card, 3)))
    loader.start()
    loader.join(60)
    if loader.is_alive():  # blocked on the pipe: its writing end lets it go before failing
        os.close(os.open(folder / "0.pt", os.O_WRONLY | os.O_NONBLOCK))
        loader.join()
    assert [[label for label, _ in samples] for samples in found] == [["sample 3"]]
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / card.key).symlink_to(folder, target_is_directory=True)
    assert load_samples(linked, card, 3) == []


def test_a_sample_that_kept_only_a_spec_gets_random_values(tmp_path):
    spec = tensor([8])
    card = OpCard("aten.add.Tensor", [spec, tensor([8])])
    (tmp_path / card.key).mkdir()
    torch.save({"args": [spec, torch.ones(8)], "kwargs": {}}, tmp_path / card.key / "0.pt")
    [sample] = InputFactory(card, CPU, tmp_path).sets(seeds=())
    assert torch.equal(sample.args[1], torch.ones(8))
    assert torch.isfinite(sample.args[0]).all() and not torch.equal(sample.args[0], torch.ones(8))


def test_fresh_values_mimic_the_sample(tmp_path):
    ids = torch.randint(100, 200, (64,))
    mask = torch.zeros(4, 16)
    mask[:, 10:] = float("-inf")
    flags = torch.rand(1000) < 0.9
    scaled = torch.randn(4096) * 5 + 20
    specs = [tensor([64], "int64"), tensor([4, 16]), tensor([1000], "bool"), tensor([4096])]
    card = OpCard("aten.where.self", specs)
    (tmp_path / card.key).mkdir()
    torch.save({"args": [ids, mask, flags, scaled], "kwargs": {}}, tmp_path / card.key / "0.pt")
    fresh = InputFactory(card, CPU, tmp_path).random_set(7)
    new_ids, new_mask, new_flags, new_scaled = fresh.args
    assert 100 <= int(new_ids.min()) and int(new_ids.max()) <= 199
    assert not torch.equal(new_ids, ids)
    assert torch.equal(torch.isneginf(new_mask), torch.isneginf(mask))
    assert (new_mask[:, :10] == 0).all()  # an additive mask: its finite part is all zeros
    assert 0.8 < new_flags.float().mean().item() < 0.97
    assert abs(new_scaled.mean().item() - 20) < 1 and abs(new_scaled.std().item() - 5) < 1


def test_without_samples_indices_stay_below_the_size_they_index():
    card = OpCard("aten.embedding.default", [tensor([50, 8]), tensor([1000], "int64")])
    inputs = InputFactory(card, CPU).random_set(3)
    assert int(inputs.args[1].min()) >= 0 and int(inputs.args[1].max()) < 50
    assert index_bounds("index_select", [tensor([7, 3]), 0, tensor([5], "int64")]) == {1: 7}
    assert index_bounds("gather", [tensor([7, 3]), -1, tensor([7, 3], "int64")]) == {1: 3}


def test_broadcast_tensors_with_zero_strides_are_materialized():
    card = OpCard("aten.add.Tensor", [tensor([4, 8]), tensor([4, 8], stride=[0, 1])])
    inputs = InputFactory(card, CPU).random_set(0)
    bias = inputs.args[1]
    assert bias.stride() == (0, 1)
    assert torch.equal(bias[0], bias[3])


def test_changes_to_inputs_and_their_canaries_are_found():
    card = OpCard("aten.add.Tensor", [tensor([4, 8]), tensor([4, 8])])
    inputs = InputFactory(card, CPU).random_set(0)
    assert inputs.changed(set()) == []
    inputs.args[0][1, 1] += 1
    assert inputs.changed(set()) == ["tensor argument 0"]
    inputs.restore()
    assert inputs.changed(set()) == []
    buf = inputs.buffers[1]
    start = (buf.view.data_ptr() - buf.base.data_ptr()) // 4
    buf.base[start + 32] = 0.0  # just past the end
    assert inputs.changed(set()) == ["the memory around tensor argument 1"]


def test_written_arguments_may_change_inside_only():
    card = OpCard("aten.add_.Tensor", [tensor([4, 8]), tensor([4, 8])])
    inputs = InputFactory(card, CPU).random_set(0)
    inputs.args[0].add_(1)
    assert inputs.changed({0}) == []
    inputs.restore([0])
    assert inputs.changed(set()) == []


def test_fresh_copies_are_independent_and_value_swaps_keep_addresses():
    card = OpCard("aten.relu.default", [tensor([16])])
    factory = InputFactory(card, CPU)
    inputs = factory.random_set(0)
    copy = inputs.fresh_copy()
    assert torch.equal(copy.args[0], inputs.args[0])
    assert copy.args[0].data_ptr() != inputs.args[0].data_ptr()
    address = inputs.args[0].data_ptr()
    inputs.load_values_from(factory.random_set(1))
    assert inputs.args[0].data_ptr() == address
    assert torch.equal(inputs.args[0], factory.random_set(1).args[0])
    assert inputs.changed(set()) == []


def test_unreadable_or_mismatching_samples_are_skipped(tmp_path):
    card = OpCard("aten.relu.default", [tensor([8])])
    folder = tmp_path / card.key
    folder.mkdir()
    (folder / "0.pt").write_bytes(b"not a torch file")
    torch.save({"args": [torch.ones(9)], "kwargs": {}}, folder / "1.pt")  # another shape
    torch.save({"args": [torch.full((8,), 2.0)], "kwargs": {}}, folder / "2.pt")
    [sample] = InputFactory(card, CPU, tmp_path).sets(seeds=())
    assert sample.label == "sample 2"
    assert torch.equal(sample.args[0], torch.full((8,), 2.0))


@pytest.mark.parametrize("shift", [0, 256, 16, 4])
def test_a_storage_starts_its_shift_past_a_512_byte_boundary_canaries_alike(shift):
    geometry = Geometry((3, 5), (5, 1), 2, torch.float32)
    buf = allocate(geometry, torch.device("cpu"), shift)
    assert buf.view.untyped_storage().data_ptr() % 512 == shift
    assert buf.view.storage_offset() == 2
    other = allocate(geometry, torch.device("cpu"), 0)
    assert buf.base.numel() == other.base.numel()  # a snapshot of one fits the other
    assert torch.equal(buf.view_mask(), other.view_mask())


def test_sets_take_the_placements_in_turn():
    factory = InputFactory(OpCard("aten.relu.default", [tensor([4, 8])]), torch.device("cpu"),
                           shifts=(0, 256, 16))
    sets = factory.sets([1, 2, 3, 4])
    assert [s.shift for s in sets] == [0, 256, 16, 0]
    assert [s.args[0].data_ptr() % 512 for s in sets] == [0, 256, 16, 0]


def test_a_partial_update_changes_a_few_elements_in_place():
    factory = InputFactory(OpCard("aten.add.Tensor", [tensor([16, 16]), tensor([16, 16])]),
                           torch.device("cpu"))
    inputs = factory.random_set(1)
    before = [t.clone() for t in inputs.args]
    addresses = [t.data_ptr() for t in inputs.args]
    factory.update_part(inputs, torch.Generator().manual_seed(5))
    assert [t.data_ptr() for t in inputs.args] == addresses
    for old, new in zip(before, inputs.args):
        assert 1 <= int((old != new).sum()) <= 3
    assert inputs.changed(set()) == []  # the snapshot holds the new values


def test_differences_taken_after_a_call_judge_it_later():
    """A timed call's integrity is taken as it returns (on the device, no wait) and read once
    timing is over, whatever the buffers hold by then."""
    card = OpCard("aten.add.Tensor", [tensor([4, 8]), tensor([4, 8])])
    inputs = InputFactory(card, CPU).random_set(0)
    inputs.args[0][1, 1] += 1
    buf = inputs.buffers[1]
    start = (buf.view.data_ptr() - buf.base.data_ptr()) // 4
    buf.base[start - 1] = 0.0  # just before the start
    taken = inputs.differences()
    assert all(flag.dim() == 0 for pair in taken for flag in pair)
    inputs.restore()
    assert inputs.changed(set()) == []
    assert inputs.changed(set(), taken) == ["tensor argument 0",
                                            "the memory around tensor argument 1"]
    assert inputs.changed({0}, taken) == ["the memory around tensor argument 1"]


def test_large_buffers_are_compared_in_chunks(monkeypatch):
    from kforge.eval.verify import inputs as I

    monkeypatch.setattr(I, "COMPARE_CHUNK", 5)
    a = torch.arange(23, dtype=torch.float16)
    b = a.clone()
    b[21] = float("nan")
    assert bool(I.differs_in(a, b)) and bool(I.differs_in(a, b, 20, 22))
    assert not bool(I.differs_in(a, b, 0, 21)) and not bool(I.differs_in(a, b, 22))
    assert not bool(I.differs_in(a, b, 30))
