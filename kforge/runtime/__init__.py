"""Running verified kernels: NVRTC compilation, cubins loaded with cuda.core and launched on
PyTorch's stream, the table of kernels by exact op variant and the ``torch.library`` guard that
puts them in front of their ops.

Both the evaluator and integration launch through this layer, and ``kforge export`` copies it
verbatim into every artifact, so it imports nothing from kforge but ``kforge.errors`` and the core
modules ``argspec``, ``launch_plan`` and ``opcard``. Layer: above ``core``, below everything else.
"""
