"""What a cubin says about its kernels, read from its ELF sections with no driver: each entry
point's name, registers, stack frame, static shared memory and named barriers.

NVRTC's ptxas report says the same and more (spills), but it is not always there: on an H200
(cuda.core 1.2.0) a second compile of one source in a process came back with an empty log, and
the kernels it held went unlisted. The cubin itself always holds them.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

SHT_SYMTAB = 2
STT_FUNC = 2
STO_CUDA_ENTRY = 0x10  # st_other bit marking a __global__ function
EIATTR_FRAME_SIZE = 0x11
EIATTR_REGCOUNT = 0x2F
EIFMT_SVAL = 0x04  # an attribute with a 16-bit size and that many bytes
EIFMT_HVAL = 0x03  # a 16-bit value
EIFMT_BVAL = 0x02  # a byte (and a pad byte)
# In a kernel's own ``.nv.info.<name>`` section: how many named barriers it uses (a byte), and
# where its warp-synchronous instructions are (``__syncwarp``, ``__shfl_sync``...; present or not).
EIATTR_NUM_BARRIERS = 0x4C
EIATTR_COOP_GROUP_INSTR_OFFSETS = 0x28


@dataclass(frozen=True)
class CubinKernel:
    name: str
    registers: int
    frame_bytes: int
    shared_bytes: int = 0  # static shared memory (``.nv.shared.<name>``; sm_90 adds 1 KiB)
    barriers: int = 0  # named barriers (``__syncthreads`` uses one)
    warp_syncs: bool = False  # warp-synchronous instructions


@dataclass(frozen=True)
class _Section:
    name: str
    type: int
    offset: int
    size: int
    link: int
    entsize: int


def cubin_kernels(cubin: bytes) -> dict[str, CubinKernel]:
    """The entry points of ``cubin`` by name; empty where it is not a 64-bit ELF file."""
    if len(cubin) < 64 or cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        return {}
    try:
        sections = _sections(cubin)
        entries = _entries(cubin, sections)
        registers, frames = _attributes(cubin, sections)
    except (struct.error, ValueError, IndexError):  # truncated or not NVIDIA's layout
        return {}
    shared = {s.name.removeprefix(".nv.shared."): s.size for s in sections
              if s.name.startswith(".nv.shared.")}
    syncs = {s.name.removeprefix(".nv.info."): _own_attributes(cubin, s) for s in sections
             if s.name.startswith(".nv.info.")}
    return {name: CubinKernel(name, registers.get(index, 0), frames.get(index, 0),
                              shared.get(name, 0), *syncs.get(name, (0, False)))
            for index, name in entries.items()}


def _cstring(data: bytes, offset: int) -> str:
    return data[offset:data.index(b"\0", offset)].decode("utf-8", "replace")


def _sections(cubin: bytes) -> list[_Section]:
    (shoff,) = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    raw = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names_at = raw[shstrndx][4]
    return [_Section(_cstring(cubin, names_at + r[0]), r[1], r[4], r[5], r[6], r[9]) for r in raw]


def _entries(cubin: bytes, sections: list[_Section]) -> dict[int, str]:
    """Symbol index -> name of every __global__ function."""
    out: dict[int, str] = {}
    for symtab in (s for s in sections if s.type == SHT_SYMTAB and s.entsize):
        names_at = sections[symtab.link].offset
        for index in range(symtab.size // symtab.entsize):
            name, info, other, *_ = struct.unpack_from("<IBBHQQ", cubin,
                                                      symtab.offset + index * symtab.entsize)
            if info & 0xF == STT_FUNC and other & STO_CUDA_ENTRY:
                out[index] = _cstring(cubin, names_at + name)
    return out


def _records(cubin: bytes, info: _Section) -> Iterator[tuple[int, int, int, int]]:
    """The attribute records of one ``.nv.info`` section: (format, attribute, offset of the
    value, size of an SVAL's value, 2 for the short formats)."""
    at, end = info.offset, info.offset + info.size
    while at + 2 <= end:
        fmt, attribute = cubin[at], cubin[at + 1]
        at += 2
        if fmt == EIFMT_SVAL:
            (size,) = struct.unpack_from("<H", cubin, at)
            yield fmt, attribute, at + 2, size
            at += 2 + size
        elif fmt in (EIFMT_HVAL, EIFMT_BVAL):
            yield fmt, attribute, at, 2
            at += 2


def _attributes(cubin: bytes, sections: list[_Section]) -> tuple[dict[int, int], dict[int, int]]:
    """Registers and frame sizes by symbol index, from the ``.nv.info`` section."""
    registers: dict[int, int] = {}
    frames: dict[int, int] = {}
    for info in (s for s in sections if s.name == ".nv.info"):
        for fmt, attribute, at, size in _records(cubin, info):
            if fmt == EIFMT_SVAL and size == 8 and attribute in (EIATTR_REGCOUNT,
                                                                  EIATTR_FRAME_SIZE):
                symbol, value = struct.unpack_from("<II", cubin, at)
                (registers if attribute == EIATTR_REGCOUNT else frames)[symbol] = value
    return registers, frames


def _own_attributes(cubin: bytes, info: _Section) -> tuple[int, bool]:
    """Named barriers and whether warp-synchronous instructions are present, from a kernel's
    own ``.nv.info.<name>`` section."""
    barriers, warp_syncs = 0, False
    for fmt, attribute, at, _size in _records(cubin, info):
        if fmt == EIFMT_SVAL:
            warp_syncs = warp_syncs or attribute == EIATTR_COOP_GROUP_INSTR_OFFSETS
        elif attribute == EIATTR_NUM_BARRIERS:
            barriers = cubin[at]
    return barriers, warp_syncs
