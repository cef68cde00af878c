"""Native operator libraries: roicore's kernels registered as each framework's own ops.

A framework only keeps an op in a saved graph, and only compiles it into a traced
function, when the op is registered in its C++ runtime.  The libraries here wrap
roicore's C library in that framework's op API; they are compiled on the user's machine,
against the installed framework's headers, the first time they are needed
(:mod:`roicore.adapters.native.build` holds the framework-free half of that):
TensorFlow's op library (:mod:`~roicore.adapters.native.tf`), Paddle's custom operators
(:mod:`~roicore.adapters.native.paddle`) and PyTorch's ``TORCH_LIBRARY`` operators
(:mod:`~roicore.adapters.native.torch`), which TorchScript modules and AOTInductor
packages call wherever the library is loaded.
"""
