"""Hand-written Triton kernels, each with its pure-torch reference and a switch that turns it off.

patch_embed: gather the selected patches straight from the (normalized) image, patch-embed them,
add bias and position embedding, in one kernel.  Switch: ``DepthPack.fused_embed`` (default off).
vit_block: a timm ViT block as four kernels (LN+QKV, attention+projection, LN+fc1+GELU, fc2+residual),
or as two of them (attention+projection+residual, fc2+residual) around torch's LayerNorms and GEMMs,
inference only.  Switch: ``DepthPack.fused_blocks`` (default off; True: four kernels, "hybrid": two, "persistent": one).
"""
from .patch_embed import HAVE_TRITON, fused_patch_embed, patch_embed_reference

__all__ = ["HAVE_TRITON", "fused_patch_embed", "patch_embed_reference"]
