"""One uncaptured B8 Q512 forward of the default Predictor between cudaProfilerStart/Stop, for ncu."""
import sys

import torch

from depthpack.core.fast import fast_recipe
from depthpack.core.model import create_model
from depthpack.runtime.predictor import Predictor
from dataclasses import replace

dev = torch.device("cuda")
torch.manual_seed(0)
model = create_model("vits").eval()
H, W = model.cfg.img_size
recipe = replace(fast_recipe(dev, 8), attention=sys.argv[1] if len(sys.argv) > 1 else "sdpa")
pred = Predictor(model, device=dev, dtype=torch.bfloat16, fast=recipe, batch_size=8, validate=False)
pred.warmup(buckets=(512,))
im = torch.rand(8, 3, H, W, device=dev)
pts = torch.rand(8, 512, 2, device=dev) * torch.tensor([W - 1e-3, H - 1e-3], device=dev)
with torch.inference_mode():
    for _ in range(3):
        pred.predict_uncaptured(im, pts)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    pred.predict_uncaptured(im, pts)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
print("ncu forward done")
