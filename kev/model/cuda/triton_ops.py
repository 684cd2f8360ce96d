"""The Triton kernels under the names kev/model/cuda/reference.py uses (DeviceOps picks one module or the other)."""
from kev.model.cuda.attention_kernel import paged_attention
from kev.model.cuda.rotary_kernel import rope_store_kv
from kev.model.cuda.row_kernels import add_rms_norm, argmax, gated

__all__ = ["add_rms_norm", "argmax", "gated", "paged_attention", "rope_store_kv"]
