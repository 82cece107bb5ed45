"""Predictor: every recipe equals the eager packed model; buckets, chunking, padding, batch groups,
validation, threads; on a GPU: no host sync in steady state, no recapture/recompile, flat memory."""
import copy
import threading

import numpy as np
import pytest
import torch

from conftest import randomize_, with_buckets
from depthpack import create_model
from depthpack.core.fast import REFERENCE, Recipe, fast_recipe
from depthpack.runtime.engines import compile_counter
from depthpack.runtime.predictor import Predictor

COMPILED = Recipe(compile=True, selection="count", gelu_epilogue=True, backend="aot_eager")  # the CPU's static path

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _model(seed=0, **over):
    """Random weights of a sensible size (LayerScale 1): attention between tokens really matters, so a
    wrong selection or padding would change the answers."""
    return randomize_(create_model("tiny", **over), seed).eval()


def _inputs(B, Q, size=64, gen=None, device="cpu"):
    images = torch.rand(B, 3, size, size, generator=gen)
    points = torch.rand(B, Q, 2, generator=gen) * (size - 1e-3)
    return images.to(device), points


def test_eager_soak_matches_model_over_random_q():
    """Many random Q (chunked beyond the largest bucket 64), fresh inputs each: equal to model()."""
    m = _model()
    pred = Predictor(m, device="cpu")
    g = torch.Generator().manual_seed(1)
    for _ in range(25):
        B = int(torch.randint(1, 4, (1,), generator=g))
        Q = int(torch.randint(1, 200, (1,), generator=g))
        images, points = _inputs(B, Q, gen=g)
        got = pred.predict(images, points)
        assert got.shape == (B, Q) and got.dtype == torch.float32
        torch.testing.assert_close(got, m(images, points), rtol=1e-5, atol=1e-5)


def test_padding_results_are_dropped_and_do_not_change_answers():
    """Q=3 is padded to bucket 8; the 3 answers equal those of the same points inside a full bucket."""
    m = _model()
    pred = Predictor(m, device="cpu")
    images, points = _inputs(1, 8, gen=torch.Generator().manual_seed(2))
    few = points[:, :3]
    padded = torch.cat([few, few[:, :1].expand(1, 5, 2)], dim=1)  # what the predictor builds
    out = pred.predict(images, few)
    assert out.shape == (1, 3)
    torch.testing.assert_close(out, m.packed_core(images, padded, 8)[:, :3])


def test_compile_soak_no_recompile_batch_groups():
    """The compiled static path (aot_eager here for CPU speed; Inductor on the GPU test): warm two buckets,
    then random Q within them and batch sizes 1..3 against a warmed batch of 2: no recompilation,
    same answers as the eager model."""
    m = _model(buckets=(8, 16))
    pred = Predictor(m, device="cpu", recipe=COMPILED, batch_size=2)
    pred.warmup()
    assert set(pred.warmup_seconds) == {8, 16}
    before = compile_counter()
    g = torch.Generator().manual_seed(3)
    for _ in range(20):
        B = int(torch.randint(1, 4, (1,), generator=g))
        Q = int(torch.randint(1, 40, (1,), generator=g))  # beyond 16: chunks
        images, points = _inputs(B, Q, gen=g)
        torch.testing.assert_close(pred.predict(images, points), m(images, points), rtol=2e-3, atol=2e-3)
    assert compile_counter() == before, "recompiled after warmup"


def test_prefix_once_is_the_models_chunks_and_its_switch_runs_each_chunk_whole():
    """More queries than the largest bucket on the one-way stream: the CPU recipe runs the prefix once (the model's
    packed_chunks) and equals the reference recipe, which runs every chunk whole, within float32 rounding; the map
    of such a call is the glance alone."""
    m = _model()
    assert m.cfg.oneway and m.cfg.buckets[-1] == 64
    images, points = _inputs(2, 150)
    once, whole = Predictor(m, device="cpu"), Predictor(m, device="cpu", recipe="reference")
    assert once.engine.prefix_once and not whole.engine.prefix_once
    depth, dmap = once.predict(images, points, return_map=True)
    with torch.no_grad():
        torch.testing.assert_close(depth, m.packed_chunks(images, points), rtol=0, atol=0)
        torch.testing.assert_close(dmap, m.glance_map_core(images), rtol=0, atol=0)
    torch.testing.assert_close(depth, whole.predict(images, points), rtol=1e-5, atol=1e-5)


def test_default_is_the_fast_recipe_and_reference_is_the_plain_model():
    """On a CPU the fast recipe is the reference with the prefix run once for every chunk (eager, float32);
    "reference" is the reference anywhere; the recipe on CUDA depends on the batch size: the hybrid blocks at batch 1
    only. Decided at construction."""
    m = _model()
    cpu = Recipe(prefix_once=True)
    assert Predictor(m, device="cpu").predict(*_inputs(1, 5)).shape == (1, 5)
    assert Predictor(m, device="cpu").recipe == cpu  # decided at construction
    pred = Predictor(m, device="cpu", batch_size=3)
    assert pred.recipe == cpu and pred.dtype == torch.float32
    assert Predictor(m, device="cpu", recipe="reference").recipe == REFERENCE
    assert fast_recipe("cuda", 1).blocks == "hybrid" and fast_recipe("cuda", 8).blocks == "timm"
    assert fast_recipe("cuda", 1).compile and fast_recipe("cuda", 1).graph and fast_recipe("cpu", 1) == cpu
    with pytest.raises(ValueError, match="prefix_once is the eager runtime's"):
        Recipe(prefix_once=True, graph=True)
    with pytest.raises(ValueError, match="recipe must be one of fast, reference"):
        Predictor(m, device="cpu", recipe="yes")


@pytest.mark.parametrize("recipe", [REFERENCE, COMPILED], ids=["eager", "compiled"])
def test_threads_get_their_own_answers(recipe):
    """Four threads share one Predictor, each with its own inputs and sizes of Q: every answer equals the
    same call made alone (the lock serves one call at a time; the staging buffers and graphs are shared)."""
    m = _model(buckets=(8, 16))
    pred = Predictor(m, device="cpu", recipe=recipe, batch_size=1)
    g = torch.Generator().manual_seed(11)
    work = [_inputs(1, int(q), gen=g) for q in torch.randint(1, 30, (40,), generator=g)]
    want = [m(im, pts) for im, pts in work]
    got: dict[int, torch.Tensor] = {}
    errors = []

    def run(tid):
        try:
            for i in range(tid, len(work), 4):
                got[i] = pred.predict(*work[i]).clone()
        except Exception as e:  # noqa: BLE001  (reported by the main thread)
            errors.append(e)
    threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i, w in enumerate(want):
        torch.testing.assert_close(got[i], w, rtol=2e-3, atol=2e-3, msg=f"call {i}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_dtypes_cast_model_and_stay_close_to_fp32(dtype):
    ref = _model()
    m = copy.deepcopy(ref)
    pred = Predictor(m, device="cpu", dtype=dtype)
    images, points = _inputs(2, 20, gen=torch.Generator().manual_seed(4))
    got = pred.predict(images, points)  # float32 images into a low-precision model
    assert next(pred.model.parameters()).dtype == dtype and pred.model.spread_rank.dtype == torch.int64
    # the caller's model is left as it was: its dtype, and its answers
    assert next(m.parameters()).dtype == torch.float32
    torch.testing.assert_close(m(images, points), ref(images, points), rtol=0, atol=0)
    assert got.dtype == torch.float32
    tol = 1e-5 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(got, ref(images, points), rtol=tol, atol=tol * 20)


def test_dtype_by_name_and_bad_construction_arguments_are_one_clear_error(tmp_path):
    """dtype="float16" is float16 (it failed at the first call as "Invalid device string"); a dtype that is
    none, or a cache_dir that is a file, is one ValueError at construction naming it."""
    m = _model()
    images, points = _inputs(1, 4)
    pred = Predictor(m, device="cpu", dtype="float16")
    assert pred.dtype == torch.float16 and pred.predict(images, points).shape == (1, 4)
    with pytest.raises(ValueError, match="dtype 'half-ish': use one of"):
        Predictor(m, device="cpu", dtype="half-ish")
    with pytest.raises(ValueError, match="dtype torch.int8: use one of"):
        Predictor(m, device="cpu", dtype=torch.int8)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError, match=f"cache_dir {tmp_path / 'afile'} is a file, not a folder"):
        Predictor(m, device="cpu", cache_dir=tmp_path / "afile")


def test_validation_errors():
    m = _model()
    pred = Predictor(m, device="cpu")
    images, points = _inputs(1, 4)
    with pytest.raises(ValueError, match="outside"):
        pred.predict(images, points + 100)
    with pytest.raises(ValueError, match="non-finite"):
        pred.predict(images * float("nan"), points)
    with pytest.raises(ValueError, match="batch mismatch"):
        pred.predict(images, torch.cat([points, points]))
    with pytest.raises(ValueError, match="CUDA"):
        Predictor(m, device="cpu", recipe=Recipe(graph=True))
    with pytest.raises(ValueError, match="from_packages"):
        Predictor(None, device="cpu")
    comp = Predictor(m, device="cpu", recipe=COMPILED)
    with pytest.raises(ValueError, match="run 64x64"):
        comp.predict(torch.rand(1, 3, 32, 32), points / 2)
    # validate=False skips the value check (caller's promise), still returns the right shape
    unchecked = Predictor(m, device="cpu", validate=False)
    assert unchecked.predict(images, points).shape == (1, 4)
    assert pred.predict(images, torch.zeros(1, 0, 2)).shape == (1, 0)


# ---------------------------------------------------------------- GPU ---------------------------------
def _gpu_pred(fast, dtype=torch.float32, preset="tiny", batch=2, **kw):
    m = randomize_(create_model(preset, buckets=(16, 64)), 0).eval()  # two buckets: half the compiles
    ref = copy.deepcopy(m).to("cuda")
    return Predictor(m, device="cuda", dtype=dtype, recipe=fast, batch_size=batch, **kw), ref


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("fast,batch", [(Recipe(graph=True), 2), (Recipe(compile=True, graph=True), 2),
                                        (Recipe(compile=True), 2), ("fast", 2), ("fast", 1)],
                         ids=["graph", "compile+graph", "compile", "fast-b2", "fast-b1-hybrid"])
def test_gpu_recipes_match_eager_no_sync_no_recapture(fast, batch):
    pred, ref = _gpu_pred(fast, batch=batch, dtype=torch.float32)
    pred.warmup()
    captures, compiles = pred.captures, compile_counter()
    g = torch.Generator().manual_seed(5)
    expect = []
    for i in range(30):
        B = 1 + i % 3  # 1..3 against a warmed batch of 1 or 2
        Q = int(torch.randint(1, 150, (1,), generator=g))
        images, points = _inputs(B, Q, gen=g, device="cuda")
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = pred.predict(images, points)  # points on the CPU: validated on the host, pinned copy
        finally:
            torch.cuda.set_sync_debug_mode("default")
        expect.append((got, ref(images, points)))
    for got, want in expect:  # the GELU epilogue's tanh approximation: within 2e-3 relative
        torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
    assert pred.captures == captures, "recaptured after warmup"
    assert compile_counter() == compiles, "recompiled after warmup"


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("batch", [1, 2], ids=["fast-b1-hybrid", "fast-b2"])
def test_gpu_one_way_map_is_one_map_per_image(batch):
    """The one-way glance on a GPU with the fast recipe (the hybrid blocks' key limit at batch 1): two point sets,
    two buckets and a map-only call (the prefix alone, compiled and captured) give the eager glance_map_core's map
    within the recipe's rounding, and the depths still match the eager model."""
    pred, ref = _gpu_pred("fast", batch=batch)
    assert ref.cfg.oneway
    pred.warmup(return_map=True)
    images = _inputs(batch, 1, device="cuda")[0]
    with torch.no_grad():
        want = ref.glance_map_core(images)
    for q in (5, 40, 0):
        points = _inputs(batch, q, gen=torch.Generator().manual_seed(q))[1]
        depth, dmap = pred.predict(images, points, return_map=True)
        torch.testing.assert_close(dmap, want, rtol=2e-3, atol=2e-3)
        if q:
            torch.testing.assert_close(depth, ref(images, points.cuda()), rtol=2e-3, atol=2e-3)


@pytest.mark.gpu
@cuda
def test_gpu_device_points_unvalidated_no_sync():
    pred, ref = _gpu_pred(Recipe(graph=True), validate=False)
    pred.warmup()
    images, points = _inputs(2, 77, device="cuda")
    points = points.cuda()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = pred.predict(images, points)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(got, ref(images, points), rtol=2e-4, atol=2e-3)


@pytest.mark.gpu
@cuda
def test_gpu_memory_flat_over_10000_mixed_calls():
    pred, _ = _gpu_pred(Recipe(graph=True), dtype=torch.bfloat16, validate=False)
    pred.warmup()
    g = torch.Generator().manual_seed(6)
    sets = [_inputs(2, int(q), gen=g, device="cuda") for q in torch.randint(1, 200, (16,), generator=g)]
    sets = [(im, pts.cuda()) for im, pts in sets]
    for im, pts in sets:  # one pass so every chunk shape has been seen once
        pred.predict(im, pts)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    for i in range(10_000):
        pred.predict(*sets[i % len(sets)])
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == base
    assert pred.captures == len(pred.buckets)


# ---------------------------------------------------------------- AOTInductor packages -----------------
def _export_tiny(tmp_path, device):
    from depthpack.deploy.build import ExportOptions, export, load_for_export

    model, preset = load_for_export(preset="tiny", seed=0)
    # float32 reference packages: the comparisons below hold an eager float32 model to them
    export(model, ExportOptions(out=str(tmp_path), buckets=(8, 16), device=device, recipe="reference"), preset,
           log=lambda m: None)
    return model, tmp_path / "manifest.json"


def _check_aoti(model, manifest, device):
    from safetensors.torch import load_file

    pred = Predictor.from_packages(manifest, device=device)
    assert pred.buckets == (8, 16) and pred.batch_size == 1
    pred.warmup()
    ref = load_file(str(manifest.parent / "reference.safetensors"))  # Q spans more than one chunk
    torch.testing.assert_close(pred.predict(ref["images"].to(device), ref["points"]).cpu(), ref["depth"],
                               rtol=1e-4, atol=1e-4)
    eager = Predictor(with_buckets(model, (8, 16)), device=device, recipe="reference")  # the exported ladder
    g = torch.Generator().manual_seed(7)
    for Q in (1, 5, 8, 9, 16, 40):
        images, points = _inputs(2, Q, gen=g, device=device)  # batch 2 against packages of batch 1
        torch.testing.assert_close(pred.predict(images, points), eager.predict(images, points), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="batch size 1"):
        pred.warmup(batch_size=4)
    return pred


@pytest.mark.slow
def test_aoti_backend_cpu_matches_reference_and_eager(tmp_path):
    model, manifest = _export_tiny(tmp_path, "cpu")
    _check_aoti(model, manifest, "cpu")


@pytest.mark.gpu
@pytest.mark.slow
@cuda
def test_gpu_aoti_backend_graphs_no_sync(tmp_path):
    model, manifest = _export_tiny(tmp_path, "cuda")
    pred = _check_aoti(model, manifest, "cuda")
    assert pred.captures == 2
    images, points = _inputs(1, 13, device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        pred.predict(images, points)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert pred.captures == 2


# ---- the map alone, and the empty batch ---------------------------------------------------------------
@pytest.mark.parametrize("recipe", [REFERENCE, COMPILED], ids=["eager", "compiled"])
def test_a_map_only_call_runs_the_one_way_glance_alone(recipe):
    """Q = 0 with return_map on the one-way stream: the glance alone (glance_map_core, compiled with the
    recipe like the buckets' functions), one map per image of a batch of 3 on a static batch of 2; frames
    too (resized inside); warmup(return_map=True) warms it as bucket 0, and nothing compiles after."""
    m = _model(buckets=(8, 16))
    assert m.cfg.oneway
    pred = Predictor(m, device="cpu", recipe=recipe, batch_size=2)
    assert 0 in pred.warmup(return_map=True) or not pred.engine.static
    before = compile_counter()
    images, _ = _inputs(3, 0, gen=torch.Generator().manual_seed(5))
    depth, dmap = pred.predict(images, torch.zeros(3, 0, 2), return_map=True)
    with torch.no_grad():
        want = m.glance_map_core(images)
    assert depth.shape == (3, 0) and dmap.shape == want.shape == (3, *m.cfg.glance_map_size)
    torch.testing.assert_close(dmap, want, rtol=1e-5, atol=1e-5)
    assert compile_counter() == before, "the map-only function compiled after warmup"
    frame = (torch.rand(48, 80, 3, generator=torch.Generator().manual_seed(6)) * 255).to(torch.uint8)
    _, fmap = Predictor(m, device="cpu", recipe=recipe, color="rgb").predict(frame.numpy(), np.zeros((0, 2)), return_map=True)
    from depthpack.core.preprocess import frames_to_images
    with torch.no_grad():
        torch.testing.assert_close(fmap, m.glance_map_core(frames_to_images(frame[None], (64, 64), "rgb")),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("recipe", [REFERENCE, COMPILED], ids=["eager", "compiled"])
def test_a_map_only_call_of_a_shared_stream_model_runs_the_inputs_centre(recipe):
    """Shared stream: the map depends on the buffer, so a map-only call runs one point, the input's centre
    (w/2, h/2) in its pixels (the C++ runner's point too), and the test can tell it from (0, 0)."""
    m = _model(buckets=(8, 16), glance_stream="shared")
    images, _ = _inputs(1, 0, gen=torch.Generator().manual_seed(7))
    _, dmap = Predictor(m, device="cpu", recipe=recipe).predict(images, torch.zeros(1, 0, 2), return_map=True)
    with torch.no_grad():
        centre = m.packed_map_core(images, torch.tensor([[[32.0, 32.0]]]).expand(1, 8, 2), 8)[1]
        origin = m.packed_map_core(images, torch.zeros(1, 8, 2), 8)[1]
    torch.testing.assert_close(dmap, centre, rtol=1e-5, atol=1e-5)
    assert (origin - centre).abs().max() > 1e-3
    with pytest.raises(ValueError, match="one-way glance stream"):
        Predictor(m, device="cpu", recipe=recipe).engine.map_core()


@pytest.mark.parametrize("recipe", [REFERENCE, COMPILED], ids=["eager", "compiled"])
def test_an_empty_batch_gives_empty_answers(recipe):
    """B = 0 float images: [0, Q] depths and a [0, rows, cols] map (an IndexError in frames.py before); a
    model without a map still refuses return_map, naming why."""
    m = _model(buckets=(8, 16))
    pred = Predictor(m, device="cpu", recipe=recipe)
    empty = torch.zeros(0, 3, 64, 64)
    assert pred.predict(empty, torch.zeros(0, 5, 2)).shape == (0, 5)
    depth, dmap = pred.predict(empty, torch.zeros(0, 0, 2), return_map=True)
    assert depth.shape == (0, 0) and dmap.shape == (0, *m.cfg.glance_map_size)
    plain = Predictor(_model(context="thumbnail"), device="cpu", recipe=recipe)
    with pytest.raises(ValueError, match="no glance depth"):
        plain.predict(empty, torch.zeros(0, 5, 2), return_map=True)
