"""Deployment: the export folder's contract, AOTInductor packages, ONNX, the reference, the self-check."""
