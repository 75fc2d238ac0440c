"""Range cards from profiles of one model at several sequence lengths: the op variants whose
integers follow the length (the KV cache a decode step reads grows by one every token) become one
card covering the whole range of lengths.

The model is profiled at its own sequence length (the reference: it keeps the samples and the
times) and at two or more other lengths (op cards only, one timed forward each, one model in
memory at a time). A reference card that every other profile also has does not vary. One that
they lack is matched, in each other profile, by its op, by everything but its integers and by the
modules that issued it; where exactly one choice of a card in each makes the differing integers
``a * L + b`` (integers ``a``, ``b``) at every length, a third length confirming what two
suggest, it becomes a range card over ``L``, the sequence length. Its range is ``1..`` the
model's cache size (``config.max_position_embeddings - 1``: the new token's position must fit),
or the lengths seen for a model without one, unless given, and narrowed to where every size the
laws give is valid. Region cards, and variants matched ambiguously, stay exact.
"""

from __future__ import annotations

import gc
import itertools
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from kforge.capture.loader import LoadedModel, ModelOptions, load_model
from kforge.capture.profiler import Profile, profile
from kforge.core.laws import Ranges, Symbol
from kforge.core.opcard import OpCard, rank_cards
from kforge.core.ranges import fit_laws, range_card, skeleton, valid_span
from kforge.errors import KforgeError

SYMBOL = "L"
# Variants alike but for their integers, issued by the same modules, that are matched across
# lengths by trying every pairing (they are few: a cache's keys and values, masks' positions).
MAX_GROUP = 4
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class LengthProfile:
    """The op cards of one forward at sequence length ``length``, and the modules of each."""

    length: int
    cards: list[OpCard]
    modules: dict[str, list[str]]


def profile_lengths(spec: str, options: ModelOptions, lengths: Sequence[int],
                    progress: Progress | None = None) -> list[LengthProfile]:
    """Op cards of ``spec`` built with ``options`` at each of ``lengths`` (no samples, no
    regions, one timed forward), each model released before the next is built."""
    report = progress or (lambda stage, done, total: None)
    if len(set(lengths)) < 2 or (options.seq_len is not None and options.seq_len in lengths):
        raise KforgeError("--seq-lengths needs two or more lengths other than --seq-len: two "
                          "lengths fit any line, a third confirms which integers follow it")
    profiles = []
    for done, length in enumerate(sorted(set(lengths))):
        report("lengths", done, len(set(lengths)))
        loaded = load_model(spec, replace(options, seq_len=length))
        with tempfile.TemporaryDirectory(prefix="kforge-lengths-") as scratch:
            found = profile(loaded, samples_per_card=0, staging_dir=Path(scratch),
                            regions=False, repeats=1)
        device = loaded.device
        del loaded
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        profiles.append(LengthProfile(length, found.cards, found.modules))
    report("lengths", len(profiles), len(profiles))
    return profiles


def cache_size(loaded: LoadedModel) -> int | None:
    """The longest sequence the model's positions reach (``max_position_embeddings``), if it
    says."""
    size = getattr(getattr(loaded.model, "config", None), "max_position_embeddings", None)
    return size if isinstance(size, int) and size > 0 else None


def default_span(loaded: LoadedModel, at: int, others: Sequence[LengthProfile]
                 ) -> tuple[int, int]:
    size = cache_size(loaded)
    return (1, size - 1) if size is not None and size > at else (
        1, max([at, *(o.length for o in others)]))


def find_range_cards(reference: Sequence[OpCard], modules: dict[str, list[str]], at: int,
                     others: Sequence[LengthProfile], span: tuple[int, int]
                     ) -> dict[str, OpCard]:
    """The reference cards (profiled at length ``at``) that become range cards over ``span``,
    by their key (see the module's docstring for the rule)."""
    if len(others) < 2:
        return {}

    def group(card: OpCard, card_modules: dict[str, list[str]]) -> tuple[str, tuple[str, ...]]:
        return skeleton(card.op, card.args, card.kwargs), tuple(card_modules.get(card.key, ()))

    ours = {card.key for card in reference}
    theirs = [{card.key for card in other.cards} for other in others]
    candidates: dict[tuple, list[OpCard]] = defaultdict(list)
    for card in reference:
        if card.region is None and card.ranges is None and not all(card.key in keys
                                                                   for keys in theirs):
            candidates[group(card, modules)].append(card)
    matches: list[dict[tuple, list[OpCard]]] = []
    for other in others:
        found: dict[tuple, list[OpCard]] = defaultdict(list)
        for card in other.cards:
            if card.region is None and card.key not in ours:
                found[group(card, other.modules)].append(card)
        matches.append(found)
    ranged = {}
    for key, cards in candidates.items():
        seen = [found.get(key, []) for found in matches]
        if any(len(group_cards) != len(cards) for group_cards in seen) or len(cards) > MAX_GROUP:
            continue
        for card in cards:
            fitting = [laws for combination in itertools.product(*seen)
                       if (laws := fit_laws([(at, card.args, card.kwargs),
                                             *((other.length, match.args, match.kwargs)
                                               for other, match in zip(others, combination))],
                                            SYMBOL))]
            if len(fitting) != 1:  # none, or more than one way: not matched beyond doubt
                continue
            bounds = valid_span(fitting[0], SYMBOL, *span)
            if bounds is not None and bounds[0] <= at <= bounds[1]:
                ranged[card.key] = range_card(card, Ranges((Symbol(SYMBOL, *bounds, at),),
                                                           fitting[0]))
    return ranged


def with_ranges(result: Profile, loaded: LoadedModel, others: Sequence[LengthProfile],
                staging_dir: Path, span: tuple[int, int] | None = None) -> Profile:
    """``result`` (the reference profile of ``loaded``) with its cards that follow the sequence
    length as range cards: their samples and modules moved to their new keys, a note saying how
    many. Unchanged without other lengths."""
    if not others:
        return result
    at = loaded.settings.get("seq_len")
    if not isinstance(at, int):
        raise KforgeError(f"{loaded.name} has no sequence length to vary (--seq-len)")
    if at in {other.length for other in others}:
        raise KforgeError(f"--seq-lengths repeats --seq-len {at}: give other lengths")
    span = span or default_span(loaded, at, others)
    if not span[0] <= at <= span[1]:
        raise KforgeError(f"--seq-range {span[0]}:{span[1]} does not hold --seq-len {at}")
    ranged = find_range_cards(result.cards, result.modules, at, others, span)
    for old, card in ranged.items():
        if (staging_dir / old).is_dir():
            shutil.move(staging_dir / old, staging_dir / card.key)
        if old in result.modules:
            result.modules[card.key] = result.modules.pop(old)
    result.cards = rank_cards([ranged.get(card.key, card) for card in result.cards])
    lengths = ", ".join(str(n) for n in sorted([at, *(o.length for o in others)]))
    result.warnings.append(f"{len(ranged)} op variants follow the sequence length (profiled at "
                           f"{lengths}): range cards over {SYMBOL}={span[0]}..{span[1]}")
    return result
