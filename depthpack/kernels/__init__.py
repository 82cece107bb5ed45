"""Hand-written Triton kernels, each with its pure-torch reference: the hybrid ViT block (vit_block)."""
