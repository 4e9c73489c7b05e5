"""Quantized checkpoint formats: decoding published quantized weights into float tensors."""

from .mxfp4 import (
    FP4_E2M1_VALUES,
    MXFP4_BLOCK,
    dequantize_mxfp4,
    mxfp4_loader,
    quantize_mxfp4,
    validate_mxfp4,
)

__all__ = [
    "FP4_E2M1_VALUES",
    "MXFP4_BLOCK",
    "dequantize_mxfp4",
    "mxfp4_loader",
    "quantize_mxfp4",
    "validate_mxfp4",
]
