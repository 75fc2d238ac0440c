"""The library's kernel families, and which family serves which aten op."""

from __future__ import annotations

from kforge.propose.library.families.base import Family
from kforge.propose.library.families.batch_norm import BatchNorm
from kforge.propose.library.families.cat import Cat
from kforge.propose.library.families.conv1d import DepthwiseConv1d
from kforge.propose.library.families.elementwise import Elementwise
from kforge.propose.library.families.embedding import Embedding
from kforge.propose.library.families.group_norm import GroupNorm
from kforge.propose.library.families.matmul import Matmul
from kforge.propose.library.families.pool import AdaptiveAvgPool, MaxPool2d
from kforge.propose.library.families.reduce import Reduction
from kforge.propose.library.families.rows import LayerNorm, RmsNorm, Softmax

FAMILIES: tuple[Family, ...] = (Softmax(), LayerNorm(), RmsNorm(), GroupNorm(), Elementwise(),
                                Reduction(), AdaptiveAvgPool(), MaxPool2d(), Embedding(),
                                DepthwiseConv1d(), Matmul())
FAMILIES += (BatchNorm(), Cat())

BY_OP: dict[str, Family] = {op: family for family in FAMILIES for op in family.ops}
