#!/bin/bash
# ncu on the library's attn_proj at B1 (321 tokens): speed of light, warp stalls, occupancy, memory
cat > /tmp/attn_once.py <<'PY'
import sys, torch
sys.path.insert(0, ".")
from depthpack.kernels import vit_block as vb
B, S, D, heads = 1, 321, 384, 6
qkv = torch.randn(B * S, 3 * D, device="cuda").bfloat16()
w = (torch.randn(D, D, device="cuda") * D ** -0.5).bfloat16()
ls1 = torch.rand(D, device="cuda").bfloat16()
r = torch.zeros(B, S, D, device="cuda")
c = vb.attn_tiles(B * S, S, torch.cuda.get_device_properties(0).multi_processor_count, heads)
for _ in range(5):
    vb.launch_attn_proj(vb._attn_proj_kernel, c, qkv, w, ls1, r, heads)
torch.cuda.synchronize()
PY
ncu --kernel-name regex:_attn_proj --launch-skip 3 --launch-count 1 --section SpeedOfLight \
    --section WarpStateStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
    --section SchedulerStats python3 /tmp/attn_once.py
