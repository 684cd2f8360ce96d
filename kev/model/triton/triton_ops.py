"""The Triton kernels under the names kev/model/triton/reference.py uses (DeviceOps picks one module or the other)."""
from kev.model.triton.attention_kernel import paged_attention
from kev.model.triton.rotary_kernel import rope_store_kv
from kev.model.triton.row_kernels import add_rms_norm, argmax, gated

__all__ = ["add_rms_norm", "argmax", "gated", "paged_attention", "rope_store_kv"]
