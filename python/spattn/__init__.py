"""spattn: sparse attention (block-sparse and top-k sparse MLA), forward and backward.

NumPy (CPU): spattn.bsa_forward / bsa_backward / sfa_forward / sfa_backward.
spattn.merge_attention_states (NumPy or torch) merges partial results by their LSE;
spattn.distributed holds the context-parallel (torch.distributed) operators.
spattn.create_block_mask makes a reusable bsa plan (spattn.BlockMask, NumPy or torch masks)
that block_sparse_attention, bsa_forward and bsa_backward take in place of the raw mask.
PyTorch (CPU and CUDA tensors, autograd, torch.compile): spattn.block_sparse_attention,
spattn.sparse_flash_attention, and torch_npu-compatible wrappers spattn.npu_* (also in
spattn.npu).  The PyTorch parts load when torch (>= 2.4) is importable.
"""
from __future__ import annotations

import importlib.util

from ._lib import (SpattnError, SpattnNotSupportedError, cpu_isa, cuda_available, library_path,  # noqa: F401
                   version)

if importlib.util.find_spec("numpy") is not None:
    from .numpy_api import bsa_backward, bsa_forward, sfa_backward, sfa_forward  # noqa: F401
from .merge import merge_attention_states  # noqa: F401,E402  (NumPy arrays or torch tensors)
from .block_mask import BlockMask, create_block_mask  # noqa: F401,E402  (reusable bsa plans)

__version__ = "0.1.0"

_TORCH_NAMES = {
    "block_sparse_attention": "torch_api",
    "sparse_flash_attention": "torch_api",
    "npu_block_sparse_attention": "npu",
    "npu_block_sparse_attention_backward": "npu",
    "npu_sparse_flash_attention": "npu",
    "npu_sparse_flash_attention_grad": "npu",
}
_torch_error = None

if importlib.util.find_spec("torch") is not None:
    try:
        from .torch_api import block_sparse_attention, sparse_flash_attention  # noqa: F401
        from .npu import (npu_block_sparse_attention, npu_block_sparse_attention_backward,  # noqa: F401
                          npu_sparse_flash_attention, npu_sparse_flash_attention_grad)
    except (ImportError, AttributeError) as e:  # e.g. torch without torch.library.custom_op
        _torch_error = e
else:
    _torch_error = ImportError("PyTorch is not installed")


def __getattr__(name: str):
    if name in ("bsa_forward", "bsa_backward", "sfa_forward", "sfa_backward"):
        raise ImportError(f"spattn.{name} needs NumPy (pip install numpy)")
    if name in _TORCH_NAMES:
        raise ImportError(f"spattn.{name} needs PyTorch >= 2.4 ({_torch_error})")
    raise AttributeError(f"module 'spattn' has no attribute {name!r}")
