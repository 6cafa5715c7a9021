"""Moved to profile.py (the backend's framework-free facts); kept for importers inside the torch
backend until they import profile directly."""

from localinfer.backends.torch.profile import (  # noqa: F401
    NATIVE_BLOCK_TYPES,
    TORCH_ARCHS,
    cpu_flags,
    native_blocks_preferred,
    onednn_bf16_expected,
)
