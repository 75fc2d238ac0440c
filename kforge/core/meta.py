"""What a call read from data makes, learned on meta tensors before it runs anywhere: the values
it returns (shapes, strides, dtypes as eager gives them) and the bytes of every tensor it makes
along the way. Meta tensors hold no data, so a call of any size costs nothing here.

The call is decoded as kforge runs it (``decode_call``), every device it names being meta. A step
inside it that names another device all the same (an operator's own copy to the host) is refused
before it runs, and one that returns a tensor elsewhere is refused too: a call must make what it
makes where it runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kforge.core.argspec import (
    ArgSpecError,
    decode_call,
    resolve_op,
    storage_span,
    torch_dtype,
    walk,
)

META = torch.device("meta")
# What eager raises for arguments it does not take (its own checks, on meta as on a device).
EAGER_REFUSALS = (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError)


class SizeUnknown(ArgSpecError):
    """Meta tensors cannot tell what the call makes; it is known only once the call runs."""


class ValuesDecide(SizeUnknown):
    """The call makes a tensor whose size depends on its inputs' values (``nonzero``, a boolean
    mask; torch tags such operators ``dynamic_output_shape``): meta tensors hold none."""


class NoMetaKernel(SizeUnknown):
    """A step has no meta kernel (an operator a model's own library registered for its device
    alone), so it cannot run on meta tensors."""


@dataclass(frozen=True)
class MetaCall:
    """One call on meta tensors: what it returns (a single result as a 1-tuple) and the bytes of
    every storage it made or grew (a view makes none, ``resize_`` grows its tensor's in place;
    none is counted as freed)."""

    results: tuple[Any, ...]
    made_bytes: int


def meta_call(op: str, args_spec: list, kwargs_spec: dict,
              func: Callable[..., Any] | None = None) -> MetaCall:
    """The call of ``op`` with these arg specs, run on meta tensors by ``func`` (the operator
    itself by default; a region's function of its nodes, so that each node is seen). Raises
    ArgSpecError where eager refuses the arguments or a step would make a tensor on another
    device (naming it), ValuesDecide where a result's size depends on values."""
    watch = _Watch()

    def tensor(spec: dict) -> torch.Tensor:
        if "stride" not in spec:
            raise ArgSpecError(f"a tensor of layout {spec.get('layout', '?')} has no strides")
        offset = int(spec.get("offset", 0))
        storage = torch.empty(offset + storage_span(spec["shape"], spec["stride"]),
                              dtype=torch_dtype(spec["dtype"]), device=META)
        watch.keep(storage)
        return storage.as_strided(spec["shape"], spec["stride"], offset)

    try:
        args, kwargs = decode_call(op, args_spec, kwargs_spec, tensor, META)
        with watch:
            result = (func or resolve_op(op))(*args, **kwargs)
    except ArgSpecError:
        raise
    except EAGER_REFUSALS as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ArgSpecError(f"eager PyTorch rejects these arguments: {first}") from None
    results = tuple(result) if isinstance(result, (tuple, list)) else (result,)
    return MetaCall(results, watch.made_bytes)


class _Watch(TorchDispatchMode):
    """Refuses a step that names a device other than meta before it runs, or returns a tensor
    elsewhere, and adds up the bytes of every storage the steps make, and of every growth of one
    in place (``resize_``, an ``out=`` argument resized). Storages are kept until the watch ends,
    so that one freed meanwhile never passes for a later one at its address."""

    def __init__(self) -> None:
        super().__init__()
        self.storages: dict[int, tuple[torch.UntypedStorage, int]] = {}  # with their bytes
        self.made_bytes = 0

    def keep(self, t: torch.Tensor) -> int:
        """The bytes ``t``'s storage adds: all of them where it is new (kept from now on), else
        what it grew by since it was last seen."""
        storage = t.untyped_storage()
        nbytes = storage.nbytes()
        _, seen = self.storages.get(storage._cdata, (storage, 0))
        self.storages[storage._cdata] = storage, max(nbytes, seen)
        return max(0, nbytes - seen)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        for _, leaf in walk([list(args), list(kwargs.values())]):
            if isinstance(leaf, torch.device) and leaf != META:
                raise ArgSpecError(f"{func} would make a tensor on {leaf}, off the device the "
                                   "call runs on")
        try:
            result = func(*args, **kwargs)
        except EAGER_REFUSALS as exc:
            if torch.Tag.dynamic_output_shape in func.tags:
                raise ValuesDecide(f"the size of what {func} makes depends on its inputs' "
                                   "values") from None
            if isinstance(exc, NotImplementedError) and not has_meta_kernel(func):
                raise NoMetaKernel(f"{func} has no meta kernel") from None
            raise
        for _, leaf in walk([result, list(args), list(kwargs.values())]):
            if isinstance(leaf, torch.Tensor):
                if leaf.device != META:
                    raise ArgSpecError(f"{func} makes a tensor on {leaf.device}, off the device "
                                       "the call runs on")
                self.made_bytes += self.keep(leaf)  # an argument's: what it grew by in place
        return result


def has_meta_kernel(func: torch._ops.OpOverload) -> bool:
    """Whether ``func`` runs on meta tensors: a meta kernel of its own, one in Python, or a
    composite one made of other operators."""
    from torch._decomp import meta_table

    name = func.name()
    return (func in meta_table
            or any(torch._C._dispatch_has_kernel_for_dispatch_key(name, key)
                   for key in ("Meta", "CompositeImplicitAutograd", "CompositeExplicitAutograd")))
