"""DepthPack: a timm ViT that runs only over the tokens the queried points need.

Three paths over one set of weights:
    model(images, points)                 packed:  cls + anchors + K selected patches, dense attention
    model.forward_masked(images, points)  masked:  every token, keys restricted to the packed selection
    model.forward_dense(images, points?)  dense:   every token, no mask; without points a [B,H,W] map
Each is forward_features (tokens through the blocks) then forward_head (the query head), as timm
splits its models; packed_core / masked_core / dense_core (and packed_map_core, the packed path with the
glance's depth map) are the unchecked static cores the runtimes compile and capture, all of signature
(images, points, bucket).

images [B,3,H,W] float RGB in [0,1] (normalized inside); points [B,Q,2] float (x, y) pixels.
A point (x, y) belongs to pixel (floor(x), floor(y)) and to patch (floor(y/p), floor(x/p)).

focal (optional, every path): [B] float32, each image's focal length in pixels of the image the model
sees (sqrt(fx * fy) after the resize to it; 0 = unknown). A model with cfg.canonical_focal predicts
depth in a canonical camera of that focal length and scales it by f / canonical_focal (Metric3D's
canonical camera: the same scene through a longer lens looks like a nearer one); absent or 0, f is
cfg.focal_default. A model without canonical_focal ignores focal. The static cores take it as a tensor
(images, points, bucket, focal); None there is the default, filled in as a constant inside the graph.
"""
from __future__ import annotations

import copy
import functools
import math
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import resample_abs_pos_embed
from timm.models.vision_transformer import VisionTransformer, checkpoint_filter_fn

from ..kernels.vit_block import PrefixBlock, swap_blocks
from .config import ModelConfig, model_config
from .fast import REFERENCE, Recipe
from .packing import key_mask_from_index, patch_of_points, run_chunked, select_tokens, spread_rank
from .preprocess import focal_factor
from .validation import check_focal, check_images, check_inputs


def patchify(x: torch.Tensor, p: int) -> torch.Tensor:
    """[B,C,H,W] -> [B,N,C*p*p], patches row-major, each flattened as (c, i, j) like Conv2d's weight."""
    B, C, H, W = x.shape
    return x.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 1, 3, 5).reshape(B, (H // p) * (W // p), C * p * p)


class PointDecoder(nn.Module):
    """One number at a point from a token's feature and the point's offset u from it (Fourier-encoded):
    mlp(tok(norm(feature)) + off(fourier(u))). The query, glance and residual heads are this."""

    def __init__(self, dim: int, hidden: int, freqs: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.tok = nn.Linear(dim, hidden)
        self.off = nn.Linear(2 + 4 * freqs, hidden, bias=False)
        self.mlp = nn.Sequential(nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, 1))
        # integer exponents: a dtype cast of the module (model.to(bf16)) cannot round them
        self.register_buffer("freq_pow", torch.arange(freqs), persistent=False)

    @property
    def freq(self) -> torch.Tensor:
        # [F] float32 2^k * pi, always float32 whatever dtype the module was cast to
        return torch.exp2(self.freq_pow.float()) * math.pi

    def token_features(self, feats: torch.Tensor) -> torch.Tensor:
        # feats [B,T,D] -> [B,T,hidden]; per token, so it can run before or after the gather
        return self.tok(self.norm(feats))

    def fourier(self, u: torch.Tensor) -> torch.Tensor:
        # u [...,2] float32 in [-0.5, 0.5) -> [..., 2 + 4F]
        ang = u.unsqueeze(-1) * self.freq  # [...,2,F]
        return torch.cat([u, ang.sin().flatten(-2), ang.cos().flatten(-2)], dim=-1)

    def value(self, htok: torch.Tensor, u: torch.Tensor, extra: torch.Tensor | None = None) -> torch.Tensor:
        # htok [...,hidden], u [...,2] -> [...] float32; extra [...,hidden] added before the MLP
        h = htok + self.off(self.fourier(u).to(htok.dtype))
        if extra is not None:
            h = h + extra
        return self.mlp(h).squeeze(-1).float()


class QueryHead(PointDecoder):
    """Depth at a point from its patch token and its offset inside the patch (sub-patch precision).

    depth = exp(log_min + (log_max - log_min) * sigmoid(mlp(tok(feature) + off(fourier(offset))
                                                          [+ pos(fourier(position in the image))])))
    so depth is positive and bounded to [min_depth, max_depth] by construction. The optional
    position term (abs_img_size given) lets the head write depth as a smooth function of where the
    point is, which a fixed camera makes informative (the floor's depth is a function of the row),
    instead of a token-wise constant plus an in-patch correction.
    """

    def __init__(self, dim: int, hidden: int, freqs: int, patch_size: int, min_depth: float, max_depth: float,
                 abs_img_size: tuple[int, int] | None = None, canonical_range: tuple[float, float] | None = None):
        super().__init__(dim, hidden, freqs)
        self.patch_size = patch_size
        self.min_depth, self.max_depth = float(min_depth), float(max_depth)
        # the sigmoid's range: the metric range, or (with the focal scaling) the canonical camera's
        # range, wide enough that scale * depth still reaches every metric depth (see decode)
        lo, hi = canonical_range if canonical_range is not None else (min_depth, max_depth)
        self.log_min, self.log_max = math.log(lo), math.log(hi)
        self.abs_wh = None if abs_img_size is None else (float(abs_img_size[1]), float(abs_img_size[0]))
        self.pos = nn.Linear(2 + 4 * freqs, hidden, bias=False) if abs_img_size is not None else None

    def encode_offset(self, points: torch.Tensor) -> torch.Tensor:
        # points [...,2] float32 pixels -> u [...,2] in [-0.5, 0.5) inside the patch
        return torch.remainder(points.float(), self.patch_size) / self.patch_size - 0.5

    def encode_position(self, points: torch.Tensor) -> torch.Tensor:
        # points [...,2] float32 pixels (x, y) -> [..., 2 + 4F]; v in [-0.5, 0.5) across the image
        wh = torch.tensor(self.abs_wh, dtype=torch.float32, device=points.device)
        return self.fourier(points.float() / wh - 0.5)

    def log_depth(self, htok: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
        # htok [B,Q,hidden] (the query's token), points [B,Q,2] -> log depth [B,Q] float32, bounded
        pos = self.pos(self.encode_position(points).to(htok.dtype)) if self.pos is not None else None
        t = torch.sigmoid(self.value(htok, self.encode_offset(points), pos))
        return self.log_min + (self.log_max - self.log_min) * t

    def decode(self, htok: torch.Tensor, points: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        # htok [B,Q,hidden] (the query's token), points [B,Q,2] -> depth [B,Q] float32 meters.
        # scale [B] (f / canonical focal): the head's depth is the canonical camera's, bounded to the
        # widened canonical range; scaled, it is clamped to the metric [min_depth, max_depth]
        return scaled_depth(self.log_depth(htok, points), scale, self.min_depth, self.max_depth)


def scaled_depth(log_depth: torch.Tensor, scale: torch.Tensor | None, lo: float, hi: float,
                 clamp: bool = False) -> torch.Tensor:
    """exp(log_depth) [B,Q], times the focal scale [B]; clamped to [lo, hi] when scaled or asked to."""
    depth = torch.exp(log_depth)
    if scale is not None:
        depth = depth * scale.float().unsqueeze(-1)
    return depth.clamp(lo, hi) if scale is not None or clamp else depth


class GlanceHead(PointDecoder):
    """Depth anywhere in the image from the glance tokens, a low-resolution dense depth model.

    The glance grid (rows, cols) tiles the image into cells, one token each. A token decodes a point of
    its own cell from the point's offset to the cell's centre (in cells, in [-0.5, 0.5)), as a dense
    model decodes a pixel from its own patch: that is the glance's map. At a query point the depth is
    LIIF's local ensemble: each of the 4 tokens whose centres surround the point decodes the point
    nearest to it inside its own cell, and the 4 log depths are blended bilinearly, so the answer is
    continuous across cells. Bounded to the query head's range, as its depth is.
    """

    def __init__(self, dim: int, hidden: int, freqs: int, grid: tuple[int, int], log_range: tuple[float, float]):
        super().__init__(dim, hidden, freqs)
        self.grid = grid
        self.log_min, self.log_max = log_range
        # (dx, dy) of the 4 surrounding tokens, integers: a module constant (an export keeps no tensor made in forward)
        self.register_buffer("corner", torch.tensor([[0, 0], [1, 0], [0, 1], [1, 1]]), persistent=False)

    def _log_depth(self, gtok: torch.Tensor, idx: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        # gtok [B,A,hidden], idx [B,P] the token, u [B,P,2] the offset in its cell -> log depth [B,P]
        h = torch.gather(gtok, 1, idx.unsqueeze(-1).expand(-1, -1, gtok.shape[-1]))
        return self.log_min + (self.log_max - self.log_min) * torch.sigmoid(self.value(h, u))

    def cells(self, points: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        # points [B,Q,2] pixels of an image of size hw -> [B,Q,2] in cells, token centres at integers
        rh, rw = self.grid  # python scalars, not a tensor: an exported program keeps no constant for them
        pts = points.float()
        return torch.stack([pts[..., 0] * (rw / hw[1]), pts[..., 1] * (rh / hw[0])], -1) - 0.5

    def own(self, gtok: torch.Tensor, points: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        """log depth [B,Q] of each point decoded by the token of its own cell (the map's decoding)."""
        rh, rw = self.grid
        g = self.cells(points, hw)
        c = torch.stack([g[..., 0].round().clamp(0, rw - 1), g[..., 1].round().clamp(0, rh - 1)], -1)
        return self._log_depth(gtok, (c[..., 1] * rw + c[..., 0]).long(), (g - c).clamp(-0.5, 0.5))

    def log_depth(self, gtok: torch.Tensor, points: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        """log depth [B,Q] at points: the local ensemble of the 4 surrounding tokens (see the class)."""
        rh, rw = self.grid
        B, Q = points.shape[:2]
        g = self.cells(points, hw).unsqueeze(2)  # [B,Q,1,2]
        lo = torch.floor(g)
        frac = g - lo  # position between the lower and the upper centre
        c = lo + self.corner  # [B,Q,4,2] the 4 tokens' cells
        c = torch.stack([c[..., 0].clamp(0, rw - 1), c[..., 1].clamp(0, rh - 1)], -1)
        u = (g - c).clamp(-0.5, 0.5)  # [B,Q,4,2] the point nearest to it inside each token's cell
        w = torch.where(self.corner.bool(), frac, 1 - frac).prod(-1)  # [B,Q,4] bilinear weights
        idx = (c[..., 1] * rw + c[..., 0]).long()  # [B,Q,4]
        # the 4 tokens decoded in one pass (one gather, one MLP over 4Q rows): fewer, larger kernels
        logd = self._log_depth(gtok, idx.view(B, 4 * Q), u.view(B, 4 * Q, 2)).view(B, Q, 4)
        return (w * logd).sum(-1)

    def map_points(self, hw: tuple[int, int], patch_size: int, device) -> torch.Tensor:
        """[rows*p * cols*p, 2] the centres of the glance image's pixels (rows*p x cols*p, the size the
        glance tokens see the image at) in pixels of an image of size hw, row-major."""
        rh, rw = self.grid
        h, w = rh * patch_size, rw * patch_size
        ys = (torch.arange(h, device=device, dtype=torch.float32) + 0.5) * (hw[0] / h)
        xs = (torch.arange(w, device=device, dtype=torch.float32) + 0.5) * (hw[1] / w)
        return torch.stack(torch.meshgrid(xs, ys, indexing="xy"), -1).reshape(-1, 2)


class ResidualHead(PointDecoder):
    """The correction a query's full-resolution patch makes to the glance depth at the point: a log-depth
    residual from the query's token and its offset inside the patch. Zero at initialization, so a new
    model's queries answer with the glance depth."""

    def __init__(self, dim: int, hidden: int, freqs: int, patch_size: int, min_depth: float, max_depth: float):
        super().__init__(dim, hidden, freqs)
        self.patch_size = patch_size
        self.min_depth, self.max_depth = float(min_depth), float(max_depth)
        nn.init.zeros_(self.mlp[-1].weight)
        nn.init.zeros_(self.mlp[-1].bias)

    def residual(self, htok: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
        # htok [B,Q,hidden], points [B,Q,2] -> log-depth residual [B,Q] float32
        return self.value(htok, torch.remainder(points.float(), self.patch_size) / self.patch_size - 0.5)


class DepthPack(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        p = cfg.patch_size
        self.backbone = VisionTransformer(
            img_size=cfg.img_size, patch_size=p, embed_dim=cfg.embed_dim, depth=cfg.depth,
            num_heads=cfg.num_heads, mlp_ratio=cfg.mlp_ratio, init_values=cfg.init_values,
            num_classes=0, class_token=True, global_pool="token", dynamic_img_size=False, block_fn=PrefixBlock)
        if cfg.backbone_weights:
            load_backbone_weights(self.backbone, cfg.backbone_weights)
        gh, gw = cfg.grid
        if cfg.context == "thumbnail":  # a g x g thumbnail embedded by the same patch embedding, own positions
            g = cfg.anchor_grid
            anchor_pos = resample_abs_pos_embed(self.backbone.pos_embed.detach()[:, 1:], new_size=(g, g),
                                                old_size=(gh, gw), num_prefix_tokens=0) if g else torch.zeros(1, 0, cfg.embed_dim)
            self.anchor_pos = nn.Parameter(anchor_pos.clone())
        else:  # glance: the patches' own position embedding at each region, plus a scale embedding
            self.anchor_scale = nn.Parameter(torch.zeros(1, 1, cfg.embed_dim))
        if cfg.registers:
            self.registers = nn.Parameter(torch.randn(1, cfg.registers, cfg.embed_dim) * 0.02)
        lo, hi = cfg.focal_ratio_range
        canonical = (cfg.min_depth / hi, cfg.max_depth / lo) if cfg.uses_focal else None
        if cfg.query_head == "residual":
            self.head = ResidualHead(cfg.embed_dim, cfg.head_dim, cfg.head_freqs, p, cfg.min_depth, cfg.max_depth)
        else:
            self.head = QueryHead(cfg.embed_dim, cfg.head_dim, cfg.head_freqs, p, cfg.min_depth, cfg.max_depth,
                                  cfg.img_size if cfg.head_abs_pos else None, canonical)
        lo_hi = canonical or (cfg.min_depth, cfg.max_depth)
        self.glance_head = GlanceHead(cfg.embed_dim, cfg.head_dim, cfg.head_freqs, cfg.glance_grid,
                                      (math.log(lo_hi[0]), math.log(lo_hi[1]))) if cfg.glance_depth else None
        self.register_buffer("mean", torch.tensor(cfg.mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(cfg.std).view(1, 3, 1, 1), persistent=False)
        # the selection's tie-breaker as integer ranks (rank / N in float32 at use): rounded to bf16
        # by model.to(bf16), distinct values would tie, and topk on ties is kernel-dependent
        self.register_buffer("spread_rank", spread_rank(gh, gw), persistent=False)
        self.register_buffer("spread_order", torch.argsort(self.spread_rank, descending=True), persistent=False)
        self.folded_embedding: nn.ParameterList | None = None  # fold_input_: (weight, bias) over raw pixels
        self.selection = REFERENCE.selection  # how select() ranks patches (core.fast); deployed() sets the recipe's

    def deployed(self, recipe: Recipe, device=None, dtype: torch.dtype | None = None) -> "DepthPack":
        """A copy in eval mode on device in dtype that runs recipe's kernels: its selection, its blocks swapped
        in for timm's (kernels.vit_block.swap_blocks), the input folded (the caller's model is left as it
        was); a model the hybrid blocks cannot compute is a ValueError naming the part."""
        if recipe.blocks == "hybrid" and not isinstance(self.backbone.norm_pre, nn.Identity):
            raise ValueError("hybrid blocks: the backbone's norm_pre must be Identity")
        model = copy.deepcopy(self).to(device=device)
        swap_blocks(model.backbone.blocks, recipe.blocks, recipe.gelu_epilogue)
        if recipe.fold_input:
            model.fold_input_()
        if dtype is not None:
            model = model.to(dtype)  # selection ranks and offset frequencies stay exact (integer buffers)
        model.selection = recipe.selection
        return model.eval()

    # ---- pieces ---------------------------------------------------------------------------------
    def num_prefix(self, anchors: bool = True) -> int:
        """Tokens before the patches: cls, registers and (anchors) the anchors."""
        return self.cfg.num_prefix - (0 if anchors else self.cfg.num_anchors)

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        # float RGB [0,1] (any float dtype) -> normalized, in the model's dtype
        return (images.to(self.mean.dtype) - self.mean) / self.std

    def embedding_input(self, images: torch.Tensor) -> torch.Tensor:
        """What the patch embedding reads: the normalized images, or with the normalization folded into its
        weights (fold_input_) the images themselves, [0,1], in their own dtype."""
        return images if self.folded_embedding is not None else self.normalize(images)

    @torch.no_grad()
    def fold_input_(self) -> None:
        """Fold the input normalization into the patch embedding (the recipe's fold_input), in place: the
        embedding of a raw patch v is W' v + b' with W' = W / std and b' = b - W' mean, computed in float32,
        and K padded with zero columns to a multiple of 8 so the GEMM gets cuBLAS's 16-byte-aligned kernels
        (3 * 14 * 14 = 588 does not). Every pooling before the embedding is an average, so it commutes."""
        proj = self.backbone.patch_embed.proj
        D, C, p, _ = proj.weight.shape
        w = proj.weight.float().reshape(D, C, p * p) / self.std.float().view(1, C, 1)
        b = proj.bias.float() - (w * self.mean.float().view(1, C, 1)).sum((1, 2))
        k = C * p * p
        w = F.pad(w.reshape(D, k), (0, -k % 8))
        self.folded_embedding = nn.ParameterList([nn.Parameter(w.to(proj.weight.dtype), requires_grad=False),
                                                  nn.Parameter(b.to(proj.bias.dtype), requires_grad=False)])

    def patch_pos(self, gh: int, gw: int) -> torch.Tensor:
        # [1,N,D] position embeddings of the patch grid (resampled if the image size differs)
        pos = self.backbone.pos_embed[:, 1:]
        if (gh, gw) != self.cfg.grid:
            pos = resample_abs_pos_embed(pos, new_size=(gh, gw), old_size=self.cfg.grid, num_prefix_tokens=0)
        return pos

    def patch_linear(self) -> tuple[torch.Tensor, torch.Tensor]:
        """timm's patch-embedding Conv2d(3, D, p, stride p) as a Linear over (c, i, j): ([D,3pp], [D])
        (folded: ([D,K], [D]), K = 3pp padded to a multiple of 8, over raw pixels; fold_input_)."""
        if self.folded_embedding is not None:
            return self.folded_embedding[0], self.folded_embedding[1]
        proj = self.backbone.patch_embed.proj
        return proj.weight.reshape(proj.weight.shape[0], -1), proj.bias

    def embed(self, vectors: torch.Tensor) -> torch.Tensor:
        """Patch vectors [...,3pp] (patchify of embedding_input) -> patch embeddings [...,D], before position."""
        weight, bias = self.patch_linear()
        k = weight.shape[-1]
        if vectors.shape[-1] != k:  # the folded weights' zero columns
            vectors = F.pad(vectors, (0, k - vectors.shape[-1]))
        return F.linear(vectors.to(weight.dtype), weight, bias)

    def embed_patches(self, x: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
        """Patch-embed only the selected patches. x [B,3,H,W] normalized, index [B,S] (None: every
        patch, row-major) -> [B,S,D]."""
        B, C, H, W = x.shape
        p = self.cfg.patch_size
        gh, gw = H // p, W // p
        if index is None:
            index = torch.arange(gh * gw, device=x.device).expand(B, gh * gw)
        patches = patchify(x, p)  # [B,N,3pp]
        picked = torch.gather(patches, 1, index.unsqueeze(-1).expand(-1, -1, C * p * p))  # [B,S,3pp]
        tok = self.embed(picked)
        pos = self.patch_pos(gh, gw).expand(B, -1, -1)
        return tok + torch.gather(pos, 1, index.unsqueeze(-1).expand(-1, -1, pos.shape[-1]))

    def anchors(self, x: torch.Tensor, on: bool = True) -> torch.Tensor:
        """A context tokens that see the whole image (cfg.context), x normalized [B,3,H,W] -> [B,A,D]."""
        B, cfg = x.shape[0], self.cfg
        if not (on and cfg.num_anchors):
            return x.new_zeros(B, 0, cfg.embed_dim)
        p = cfg.patch_size
        if cfg.context == "glance":  # each region box-filtered to one patch of p x p pixels
            rh, rw = cfg.glance_grid
            thumb = F.interpolate(x, size=(rh * p, rw * p), mode="area")
            pos = resample_abs_pos_embed(self.patch_pos(*self.grid_of(x)), new_size=(rh, rw),
                                         old_size=self.grid_of(x), num_prefix_tokens=0)  # at each region's centre
            return self.embed(patchify(thumb, p)) + pos + self.anchor_scale
        g = cfg.anchor_grid
        side = g * p
        kh, kw = max(1, x.shape[-2] // side), max(1, x.shape[-1] // side)
        thumb = F.avg_pool2d(x, (kh, kw)) if (kh, kw) != (1, 1) else x  # box filter against aliasing
        if thumb.shape[-2:] != (side, side):
            thumb = F.interpolate(thumb, size=(side, side), mode="bilinear", align_corners=False)
        # the patch-embedding conv as a GEMM over the thumbnail's patches (cuDNN's conv is slow at this shape)
        return self.embed(patchify(thumb, p)) + self.anchor_pos

    def prefix(self, x: torch.Tensor, anchors: bool = True) -> torch.Tensor:
        # cls (+ its position), registers, anchors (when on): [B, num_prefix, D]
        B = x.shape[0]
        parts = [(self.backbone.cls_token + self.backbone.pos_embed[:, :1]).expand(B, -1, -1)]
        if self.cfg.registers:
            parts.append(self.registers.expand(B, -1, -1))
        return torch.cat(parts + [self.anchors(x, anchors)], dim=1)

    def stream_prefix(self, anchors: bool = True) -> int:
        """The leading tokens of a buffer that read only each other: the whole prefix (cls, registers, the
        glance) with cfg.glance_stream oneway, none with shared."""
        return self.num_prefix(anchors) if self.cfg.oneway else 0

    def run_blocks(self, tokens: torch.Tensor, attn_mask: torch.Tensor | None = None, prefix: int = 0,
                   prefix_kv: list | None = None) -> torch.Tensor:
        # tokens [B,S,D] -> [B,S,D]: the backbone's blocks (the recipe's once deployed; hybrid blocks carry a
        # float32 residual stream, cast back to the tokens' dtype before the final norm); prefix, prefix_kv (one
        # (k, v) a block): PrefixBlock's one-way rule
        x = self.backbone.norm_pre(tokens)
        for i, blk in enumerate(self.backbone.blocks):
            x = blk(x, attn_mask=attn_mask, prefix=prefix, prefix_kv=None if prefix_kv is None else prefix_kv[i])
        return self.backbone.norm(x.to(tokens.dtype))

    def grid_of(self, images: torch.Tensor) -> tuple[int, int]:
        p = self.cfg.patch_size
        return images.shape[-2] // p, images.shape[-1] // p

    def select(self, images: torch.Tensor, points: torch.Tensor, bucket: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The packed selection: index [B,S] of the buffer's patches, query_slot [B,Q] (packing.select_tokens)."""
        grid = self.grid_of(images)
        if grid == self.cfg.grid:
            rank, order = self.spread_rank, self.spread_order
        else:
            rank, order = spread_rank(*grid, device=images.device), None
        return select_tokens(points, bucket, self.cfg.patch_size, grid, rank, self.selection, order)

    def focal_scale(self, images: torch.Tensor, focal: torch.Tensor | None) -> torch.Tensor | None:
        """f / canonical_focal per image [B] float32 (None: the model has no focal input).

        focal [B] in pixels of `images` (0 = unknown: cfg.focal_default); None = every image the
        default. At a size other than cfg.img_size the focal is compared at the model's size (scaled
        by core.preprocess.focal_factor, static shapes). Branch-free: export and graphs see one function."""
        cfg = self.cfg
        if not cfg.uses_focal:
            return None
        default = float(cfg.focal_default or cfg.canonical_focal)
        B = images.shape[0]
        if focal is None:
            f = torch.full((B,), default, dtype=torch.float32, device=images.device)
        else:
            f = focal.to(device=images.device, dtype=torch.float32).reshape(-1).expand(B)
            f = torch.where(f > 0, f, torch.full_like(f, default))
        return f * (focal_factor(tuple(images.shape[-2:]), cfg.img_size) / float(cfg.canonical_focal))

    # ---- features and head (timm's split), the three paths as unchecked static cores -------------
    def encode(self, images: torch.Tensor, index: torch.Tensor | None = None, attn_mask: torch.Tensor | None = None,
               anchors: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """images [B,3,H,W] in [0,1] -> (features [B,S,D] of the patches in index (None: all N, row-major),
        features [B,A,D] of the glance tokens or None), after the prefix (cls, registers, anchors) + those
        patches ran through the blocks (attn_mask over every key; one-way with cfg.glance_stream oneway);
        anchors=False: the same weights without the anchors (an evaluation of what they bring)."""
        x = self.embedding_input(images)
        pre = self.prefix(x, anchors)  # [B,P,D]
        tokens = torch.cat([pre, self.embed_patches(x, index)], dim=1)  # [B,P+S,D]
        out = self.run_blocks(tokens, attn_mask, self.stream_prefix(anchors))
        return out[:, pre.shape[1]:], self._glance_of(out, anchors)

    def _glance_of(self, out: torch.Tensor, anchors: bool) -> torch.Tensor | None:
        # the glance tokens' features [B,A,D] of a buffer's output (None: no glance depth, or anchors off)
        if self.glance_head is None or not anchors:
            return None
        start = 1 + self.cfg.registers
        return out[:, start:start + self.cfg.num_anchors]

    def encode_prefix(self, images: torch.Tensor, anchors: bool = True) -> tuple[torch.Tensor | None, list]:
        """The one-way prefix alone through the blocks (cfg.glance_stream oneway): (the glance tokens' features
        [B,A,D] or None, each block's prefix keys and values [(k, v) [B,H,P,hd]]). What every buffer of the
        image holds in its prefix rows, whatever its patches; encode_patches reads the keys and values."""
        if not self.cfg.oneway:
            raise ValueError("the prefix runs alone only with model.glance_stream oneway (shared: it reads the patches)")
        pre = self.prefix(self.embedding_input(images), anchors)
        x, kvs = self.backbone.norm_pre(pre), []
        for blk in self.backbone.blocks:
            x, kv = PrefixBlock.forward_kv(blk, x)
            kvs.append(kv)
        return self._glance_of(self.backbone.norm(x.to(pre.dtype)), anchors), kvs

    def encode_patches(self, images: torch.Tensor, index: torch.Tensor, prefix_kv: list) -> torch.Tensor:
        """The features [B,S,D] of the patches in index, reading the prefix run once (encode_prefix's keys
        and values): equal to encode()'s patch features with cfg.glance_stream oneway."""
        x = self.embed_patches(self.embedding_input(images), index)
        return self.run_blocks(x, prefix_kv=prefix_kv)

    def forward_features(self, images: torch.Tensor, index: torch.Tensor | None = None,
                         attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The patch features of encode()."""
        return self.encode(images, index, attn_mask)[0]

    def forward_head(self, feats: torch.Tensor, slot: torch.Tensor, points: torch.Tensor,
                     scale: torch.Tensor | None = None, glance: torch.Tensor | None = None,
                     hw: tuple[int, int] | None = None) -> torch.Tensor:
        """feats [B,S,D], slot [B,Q] (the token of each query), points [B,Q,2], scale [B] (focal_scale),
        glance [B,A,D] and the image size hw (the residual head) -> depth [B,Q] float32."""
        htok = self.head.token_features(feats)  # [B,S,h]
        htok = torch.gather(htok, 1, slot.unsqueeze(-1).expand(-1, -1, htok.shape[-1]))  # [B,Q,h]
        if not isinstance(self.head, ResidualHead):
            return self.head.decode(htok, points, scale)
        if glance is None:
            raise ValueError("the residual query head corrects the glance depth: it needs the glance tokens "
                             "(anchors on)")
        logd = self.glance_head.log_depth(self.glance_head.token_features(glance), points, hw)
        logd = logd + self.head.residual(htok, points)
        return scaled_depth(logd, scale, self.cfg.min_depth, self.cfg.max_depth, clamp=True)

    def glance_map(self, glance: torch.Tensor, hw: tuple[int, int], scale: torch.Tensor | None = None) -> torch.Tensor:
        """The glance's depth map [B, rows, cols] (cfg.glance_map_size: the glance image's pixels) from the
        glance tokens' features [B,A,D] of an image of size hw."""
        B = glance.shape[0]
        pts = self.glance_head.map_points(hw, self.cfg.patch_size, glance.device).expand(B, -1, -1)
        logd = self.glance_head.own(self.glance_head.token_features(glance), pts, hw)
        return scaled_depth(logd, scale, self.cfg.min_depth, self.cfg.max_depth, clamp=True).view(B, *self.cfg.glance_map_size)

    def packed_core(self, images: torch.Tensor, points: torch.Tensor, bucket: int,
                    focal: torch.Tensor | None = None, anchors: bool = True) -> torch.Tensor:
        """Packed path for Q <= bucket queries: cls + anchors + the selected patches. -> depth [B,Q]."""
        return self._packed(images, points, bucket, focal, anchors)[0]

    def packed_map_core(self, images: torch.Tensor, points: torch.Tensor, bucket: int,
                        focal: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The packed path and the glance's depth map from the same buffer: (depth [B,Q], map [B,rows,cols])."""
        depth, glance, scale = self._packed(images, points, bucket, focal)
        return depth, self.glance_map(glance, tuple(images.shape[-2:]), scale)

    def glance_map_core(self, images: torch.Tensor, focal: torch.Tensor | None = None) -> torch.Tensor:
        """The glance's depth map [B,rows,cols] alone, no points: the one-way prefix through the blocks, the
        map every buffer of the image holds (cfg.glance_stream oneway)."""
        if self.glance_head is None:
            raise ValueError("the map needs a glance depth (model.glance_depth)")
        glance, _ = self.encode_prefix(images)
        return self.glance_map(glance, tuple(images.shape[-2:]), self.focal_scale(images, focal))

    def _packed(self, images, points, bucket, focal, anchors: bool = True):
        index, slot = self.select(images, points, bucket)
        feats, glance = self.encode(images, index, anchors=anchors)
        scale = self.focal_scale(images, focal)
        return self.forward_head(feats, slot, points, scale, glance, tuple(images.shape[-2:])), glance, scale

    def masked_core(self, images: torch.Tensor, points: torch.Tensor, bucket: int,
                    focal: torch.Tensor | None = None, anchors: bool = True) -> torch.Tensor:
        """Masked baseline: all 1+A+N tokens, keys restricted to the packed selection."""
        index, _ = self.select(images, points, bucket)
        grid = self.grid_of(images)
        keep = key_mask_from_index(index, grid[0] * grid[1], self.num_prefix(anchors))  # [B,1+A+N] bool
        # additive mask, finfo.min rather than -inf so no row can turn into NaN (timm's habit)
        dtype = self.mean.dtype
        attn_mask = torch.zeros(keep.shape, dtype=dtype, device=images.device)
        attn_mask = attn_mask.masked_fill(~keep, torch.finfo(dtype).min)[:, None, None, :]
        feats, glance = self.encode(images, None, attn_mask, anchors)  # [B,N,D]
        return self.forward_head(feats, patch_of_points(points, self.cfg.patch_size, grid), points,
                                 self.focal_scale(images, focal), glance, tuple(images.shape[-2:]))

    def dense_core(self, images: torch.Tensor, points: torch.Tensor, bucket: int | None = None,
                   focal: torch.Tensor | None = None, anchors: bool = True) -> torch.Tensor:
        """Dense path at points: every token, no mask (bucket unused: the same signature as the others)."""
        feats, glance = self.encode(images, anchors=anchors)
        return self.forward_head(feats, patch_of_points(points, self.cfg.patch_size, self.grid_of(images)), points,
                                 self.focal_scale(images, focal), glance, tuple(images.shape[-2:]))

    # ---- public, checked API --------------------------------------------------------------------
    def forward(self, images: torch.Tensor, points, focal=None, anchors: bool = True,
                prefix_once: bool = True) -> torch.Tensor:
        """Packed path: depth [B,Q] float32 meters at each (x, y) point. focal: None, a number or [B]
        pixels (0 = unknown); see the module docstring. anchors=False: without the anchors (evaluation).
        More queries than the largest bucket run in chunks; with cfg.glance_stream oneway the prefix runs
        once and every chunk reads its keys and values (prefix_once=False: each chunk runs it again)."""
        images, points = check_inputs(images, points, self.cfg.patch_size)
        focal = check_focal(focal, images.shape[0], images.device)
        if prefix_once and self.cfg.oneway and points.shape[1] > self.cfg.buckets[-1]:
            return self.packed_chunks(images, points, focal, anchors)
        return run_chunked(functools.partial(self.packed_core, anchors=anchors), images, points,
                           self.cfg.buckets, focal)

    def packed_chunks(self, images: torch.Tensor, points: torch.Tensor, focal: torch.Tensor | None = None,
                      anchors: bool = True) -> torch.Tensor:
        """The packed path over chunks of queries (unchecked inputs, as the cores), the one-way prefix run once
        for all of them: depth [B,Q]."""
        glance, kvs = self.encode_prefix(images, anchors)
        scale, hw = self.focal_scale(images, focal), tuple(images.shape[-2:])

        def chunk(images, points, bucket, focal):
            index, slot = self.select(images, points, bucket)
            return self.forward_head(self.encode_patches(images, index, kvs), slot, points, scale, glance, hw)
        return run_chunked(chunk, images, points, self.cfg.buckets, focal)

    def forward_masked(self, images: torch.Tensor, points, focal=None, anchors: bool = True) -> torch.Tensor:
        images, points = check_inputs(images, points, self.cfg.patch_size)
        focal = check_focal(focal, images.shape[0], images.device)
        return run_chunked(functools.partial(self.masked_core, anchors=anchors), images, points,
                           self.cfg.buckets, focal)

    def forward_dense(self, images: torch.Tensor, points=None, focal=None, anchors: bool = True) -> torch.Tensor:
        """All tokens, no mask. With points: depth [B,Q]; without: a full-resolution map [B,H,W]."""
        if points is None:
            images = check_images(images, self.cfg.patch_size)
            return self.depth_map(images, check_focal(focal, images.shape[0], images.device), anchors)
        images, points = check_inputs(images, points, self.cfg.patch_size)
        focal = check_focal(focal, images.shape[0], images.device)
        if points.shape[1] == 0:
            return torch.zeros(images.shape[0], 0, device=images.device)
        return self.dense_core(images, points, None, focal, anchors)

    def depth_map(self, images: torch.Tensor, focal: torch.Tensor | None = None, anchors: bool = True) -> torch.Tensor:
        """Dense depth at every integer pixel (x, y): [B,H,W], equal to querying each pixel."""
        B, _, H, W = images.shape
        p = self.cfg.patch_size
        gh, gw = self.grid_of(images)
        feats, glance = self.encode(images, anchors=anchors)  # [B,N,D]
        ys, xs = torch.meshgrid(torch.arange(H, device=images.device), torch.arange(W, device=images.device), indexing="ij")
        pts = torch.stack([xs, ys], -1).float().view(1, gh, p, gw, p, 2).expand(B, -1, -1, -1, -1, -1).reshape(B, H * W, 2)
        slot = (torch.arange(gh, device=images.device).view(gh, 1, 1, 1) * gw
                + torch.arange(gw, device=images.device).view(1, 1, gw, 1)).expand(gh, p, gw, p).reshape(1, H * W)
        depth = self.forward_head(feats, slot.expand(B, -1), pts, self.focal_scale(images, focal), glance, (H, W))
        return depth.view(B, gh, p, gw, p).reshape(B, H, W)


def load_backbone_weights(backbone: VisionTransformer, path: str | Path) -> None:
    """Load a timm or original-DINOv2 state dict from a local file, never unpickling arbitrary objects."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"backbone_weights: no such file {path}")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file
        state = load_file(str(path))
    else:
        state = torch.load(path, map_location="cpu", weights_only=True)
        for key in ("model", "state_dict", "teacher"):
            if isinstance(state, dict) and key in state and isinstance(state[key], dict):
                state = state[key]
    state = checkpoint_filter_fn(state, backbone)  # DINOv2 original -> timm names, pos-embed resample
    missing, unexpected = backbone.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("head")]
    if missing:
        raise ValueError(f"backbone_weights {path}: {len(missing)} backbone tensors missing, e.g. {missing[:5]}")
    unexpected = [k for k in unexpected if not k.startswith(("head", "mask_token"))]
    if unexpected:
        raise ValueError(f"backbone_weights {path}: {len(unexpected)} unexpected tensors, e.g. {unexpected[:5]}")


def random_weights_(model: nn.Module, seed: int = 0, scale: float = 0.5) -> nn.Module:
    """Seeded random weights of a sensible size, in place, for tests and `export --preset`.

    timm's init with LayerScale 1e-5 makes the blocks near-identities, which would let a broken mask,
    a wrong selection or a parity check pass vacuously; here attention between tokens really matters.
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * scale / p[0].numel() ** 0.5)
            elif name.endswith("gamma"):  # LayerScale
                p.fill_(1.0)
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return model


def create_model(preset: str | ModelConfig = "vits", **overrides) -> DepthPack:
    """create_model('tiny'), create_model('vits', anchor_grid=4), or create_model(ModelConfig(...))."""
    cfg = preset if isinstance(preset, ModelConfig) else model_config(preset, **overrides)
    return DepthPack(cfg)
