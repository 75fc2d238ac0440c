"""Kernels for fusion regions: a region card's chain of ops matched by its structure into a
program (``match``), written as one CUDA kernel (``render``, ``families``), with the program's
meaning stated in torch (``reference``)."""
