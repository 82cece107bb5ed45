"""DataConfig: which data set to read and how a sample reaches the model's image size.

No torch import here, so configs can be parsed without loading torch.

kind
    "synthetic"  procedural rooms/streets rendered on the fly (depthpack.data.synthetic), exact depth; the
                 families that make resolution matter (thin structures, small objects far away, objects in
                 front of far backgrounds) at the frequencies thin_structures, distant_objects,
                 foreground_objects; fresh: a new batch of scenes every training step.
    "nyu_mat"    the official labeled file nyu_depth_v2_labeled.mat (MATLAB v7.3 / HDF5); root = the file.
    "nyu"        BTS-style folder: rgb_XXXXX.jpg + sync_depth_XXXXX.png (uint16 mm), searched recursively.
    "kitti"      KITTI depth: RGB PNG + uint16 PNG, meters = value / 256, 0 = no measurement.
    "folder"     generic: root/rgb/NAME.{png,jpg} + root/depth/NAME.{png,npy,pfm}.
    "bag"        ROS 1 / ROS 2 (sqlite3, MCAP) recordings read with rosbags (depthpack.data.rosbag); root = a
                 bag, a folder of bags, or several joined by ','; image_topic, depth_topic (and info_topic)
                 name the streams; colour and depth pair by stamp within pair_tol_ms; train / val are
                 contiguous time blocks of split_block_s (every val_every-th block is val, split_gap_s
                 left out on each side of it); cache / cache_dir keep the decoded, resized frames.
Splits of file-based kinds: "train" reads split_file, "val" reads val_split_file (or split_file when
only that is given: the list to evaluate on); with no split file at all the sorted listing is cut
deterministically, val = the last min(num_val, n // 2) samples, train = the rest; "all" = everything.
Every file-based kind also accepts split_file: lines "rgb_path depth_path [anything]" relative to
root (depth_root for the depth path when set); "#" comments, blank lines and depth "None" are skipped.
For nyu_mat the split file lists 0-based image indices instead, one per line. A relative split_file or
val_split_file is itself read from root (root's folder when root is a file, nyu_mat's .mat), not from
the working folder; an absolute one as written.

Eval crops (eval_crop), defined on the native image and resized with the depth (nearest):
    "eigen_nyu"    rows 45:471, cols 41:601 of 480x640 (as fractions for other sizes)
    "garg"         KITTI Garg crop: rows 0.40810811h:0.99189189h, cols 0.03594771w:0.96405229w
    "eigen_kitti"  KITTI Eigen crop: rows 0.3324324h:0.91351351h, cols 0.0359477w:0.96405229w

resize (how a native sample reaches img_size (H, W)):
    "resize"       scale each axis to (H, W) (the aspect ratio may change); what depthpack.core.preprocess
                   and the C++ runner do at inference, so training sees what inference sees.
    "center_crop"  scale uniformly so the image covers (H, W), then cut the centered (H, W) window.
Every sample carries "focal": the camera's focal length in pixels of the (H, W) image, sqrt(fx' fy')
after the resize (0.0 where unknown; depthpack.data.intrinsics says where each data set's comes from).
Synthetic scenes are rendered at (H, W) directly (no resize). Depth and masks of files always go
through nearest-neighbour sampling at pixel centers (never a blend of valid
and invalid values); the image through image_interp ("linear" as depthpack.core.preprocess, or "area",
which antialiases when shrinking).
"""
from __future__ import annotations

from dataclasses import dataclass

KINDS = ("synthetic", "nyu_mat", "nyu", "kitti", "folder", "bag")
SCENES = ("indoor", "outdoor", "mixed")
RIGS = ("varied", "fixed", "lens")  # synthetic camera rigs (see depthpack.data.synthetic.FIXED_RIG)
CROPS = (None, "eigen_nyu", "garg", "eigen_kitti")
RESIZES = ("resize", "center_crop")
DECODES = ("linear", "sunrgbd", "middlebury")
INTERPS = ("linear", "area")


@dataclass(frozen=True)
class Families:
    """Mean number per synthetic scene of each family of objects that makes resolution matter (Poisson
    draws; depthpack.data.synthetic.add_families)."""
    thin: float = 1.5  # thin structures 1-4 px wide at width_ref: legs, lamps, railings, cables, poles, bollards
    distant: float = 1.0  # small objects far from the camera (a few pixels at width_ref)
    front: float = 0.5  # objects near the camera, in front of a far background
    width_ref: int = 560  # the image width at which the thin structures and the small distant objects are 1-4 px
    fence: float = 0.0  # fences facing the camera: rows of bars 1-4 px wide at width_ref, 2-4 bar widths apart

    @property
    def none(self) -> bool:
        return self.thin == self.distant == self.front == self.fence == 0


NO_FAMILIES = Families(0.0, 0.0, 0.0)


@dataclass
class DataConfig:
    kind: str = "synthetic"  # see the module docstring
    root: str | None = None  # folder (or, for nyu_mat, the .mat file) of the data set
    split_file: str | None = None  # pairs "rgb depth" per line (nyu_mat: 0-based indices)
    val_split_file: str | None = None  # the held-out list for split "val" (None: split_file again, see make_dataset)
    depth_root: str | None = None  # where split-file depth paths are relative to (None: root); BTS gt_path
    depth_scale: float | None = None  # stored value per meter; None: 1000 nyu/folder, 256 kitti
    decode: str = "linear"  # "linear" (value / depth_scale) | "sunrgbd" (bit-rotated mm) | "middlebury" (PFM disparity + calib.txt)
    invalid_raw: tuple[int, ...] = (0, 65535)  # raw uint16 values meaning "no measurement" (65535: 7-Scenes)
    scene: str = "indoor"  # synthetic: "indoor" | "outdoor" | "mixed"
    rig: str = "varied"  # synthetic camera: "varied" (lens/height/tilt per scene) | "fixed" (one robot's) | "lens" (fixed mount, lens per scene)
    num_samples: int = 2000  # synthetic: size of the train split
    num_val: int = 64  # synthetic: size of the val split; nyu_mat without split_file: the last num_val images
    cache: bool = False  # synthetic: keep rendered samples in memory (per process), so later epochs cost nothing
    cache_dir: str | None = None  # synthetic: keep rendered scenes on disk here (depthpack.data.store), rendered
    #                               once by every core and read by later runs and evaluations
    device_cache: bool = False  # synthetic, training: every scene in one uint8 tensor on the training device;
    #                             batches, flips and query points made there (depthpack.train.device_data); needs cache_dir
    render_budget_s: float | None = None  # stop rendering the train split after this many seconds, keep what is done
    fresh: bool = False  # synthetic, training: every batch rendered on the training device from (seed, step, rank),
    #                      so no scene repeats and nothing is cached (the val split stays a fixed set)
    thin_structures: float = 1.5  # synthetic: mean count per scene of thin structures 1-4 px wide at 420x560
    #                               (legs of tables and chairs, lamps, railings, cables, poles, bollards)
    distant_objects: float = 1.0  # synthetic: mean count per scene of small objects far from the camera
    foreground_objects: float = 0.5  # synthetic: mean count per scene of objects near the camera, in front of
    #                                  a far background
    fences: float = 0.0  # synthetic: mean count per scene of fences facing the camera, bars 1-4 px wide and 2-4
    #                      bar widths apart at thin_width_ref (where they blur into one grey, only resolution
    #                      tells a bar from the background between): the thin band's bars, the edge band's gaps
    thin_width_ref: int = 560  # synthetic: the image width (pixels) at which thin structures and small distant
    #                            objects are 1-4 px wide; a bed rendered smaller sets its own width to keep them
    seed: int = 0
    eval_crop: str | None = None  # None | "eigen_nyu" | "garg" | "eigen_kitti"
    resize: str = "resize"  # "resize" | "center_crop"
    image_interp: str = "linear"  # "linear" | "area"
    focal: float | None = None  # focal length in pixels of the native files (fx = fy), for every sample;
    #                             None: the data set's own (depthpack.data.intrinsics), else unknown
    intrinsics: str | None = None  # a K file (9 numbers, 12 of P, or fx fy cx cy) for every sample
    image_topic: str | None = None  # bag: the colour topic (sensor_msgs/Image or CompressedImage)
    depth_topic: str | None = None  # bag: the depth topic (16UC1 mm, 32FC1 m, or compressedDepth), registered to the colour
    info_topic: str | None = None  # bag: the CameraInfo topic (None: the colour topic's sibling camera_info, if any)
    pair_tol_ms: float = 10.0  # bag: colour and depth stamps closer than this pair (a third of a 30 fps frame)
    split_block_s: float = 10.0  # bag: train / val are cut into contiguous blocks of this many seconds
    val_every: int = 5  # bag: every val_every-th block is validation (20%)
    split_gap_s: float = 1.0  # bag: train frames this close to a validation block are left out (near-copies)

    def __post_init__(self) -> None:
        from ..core.config import coerce_fields

        coerce_fields(self)  # every field its declared type ("1e3" -> 1000.0), or a ValueError naming it
        problems = []
        for name, allowed in (("kind", KINDS), ("scene", SCENES), ("rig", RIGS), ("eval_crop", CROPS),
                              ("resize", RESIZES), ("decode", DECODES), ("image_interp", INTERPS)):
            if getattr(self, name) not in allowed:
                problems.append(f"{name}={getattr(self, name)!r} is not one of {allowed}")
        if self.kind != "synthetic" and not self.root:
            problems.append(f"kind={self.kind!r} needs root (the data set's folder or file)")
        if self.depth_scale is not None and not self.depth_scale > 0:
            problems.append(f"depth_scale must be > 0, got {self.depth_scale}")
        if self.device_cache and (self.kind not in ("synthetic", "bag") or not self.cache_dir):
            problems.append("device_cache needs kind='synthetic' or 'bag' and cache_dir (where the scenes or frames are kept)")
        if self.kind == "bag":
            if not (self.image_topic and self.depth_topic):
                problems.append("kind='bag' needs image_topic and depth_topic (python -m depthpack.bag info BAG lists them)")
            if not (self.pair_tol_ms >= 0 and self.split_block_s > 0 and self.val_every >= 2 and 0 <= self.split_gap_s < self.split_block_s):
                problems.append(f"kind='bag' needs pair_tol_ms >= 0, split_block_s > 0, val_every >= 2 and "
                                f"0 <= split_gap_s < split_block_s, got {self.pair_tol_ms}, {self.split_block_s}, "
                                f"{self.val_every}, {self.split_gap_s}")
        if self.fresh and (self.kind != "synthetic" or self.device_cache or self.cache):
            problems.append("fresh needs kind='synthetic' without cache or device_cache (every training batch is rendered "
                            "new; cache_dir, if set, keeps the val split only)")
        for name in ("thin_structures", "distant_objects", "foreground_objects", "fences"):
            if not 0.0 <= getattr(self, name) <= 10.0:
                problems.append(f"{name} must lie in [0, 10] (a mean count per scene), got {getattr(self, name)}")
        if self.thin_width_ref <= 0:
            problems.append(f"thin_width_ref must be a positive image width in pixels, got {self.thin_width_ref}")
        if self.render_budget_s is not None and not self.render_budget_s > 0:
            problems.append(f"render_budget_s must be > 0 seconds or null, got {self.render_budget_s}")
        if self.focal is not None and not self.focal > 0:
            problems.append(f"focal must be > 0 pixels, got {self.focal}")
        if self.num_samples < 1 or self.num_val < 1:
            problems.append(f"num_samples and num_val must be >= 1, got {self.num_samples}, {self.num_val}")
        if problems:
            raise ValueError("invalid DataConfig: " + "; ".join(problems))

    def families(self) -> "Families":
        """The synthetic scene families' frequencies."""
        return Families(self.thin_structures, self.distant_objects, self.foreground_objects, self.thin_width_ref,
                        self.fences)

    def scale(self) -> float:
        """Stored depth value per meter: depth_scale, or the format's default."""
        if self.depth_scale is not None:
            return float(self.depth_scale)
        return 256.0 if self.kind == "kitti" else 1000.0
