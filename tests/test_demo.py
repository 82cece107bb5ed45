"""make demo's GPU recipe, and the untrained checkpoint that scripts/gpu_export_timing.sh compiles
(the demo itself runs on the GPU machine: scripts/gpu_run.sh PART=final)."""
from depthpack.core.checkpoint import load_model
from depthpack.demo import GPU_RECIPE, ROOT, untrained_checkpoint
from depthpack.train.config import load_train_config

DEMO = str(ROOT / "configs" / "demo.yaml")


def test_gpu_recipe_is_the_cpu_recipe_on_the_device_data_path(tmp_path):
    cfg = load_train_config(DEMO, [r.format(out=tmp_path) for r in GPU_RECIPE])
    assert cfg.data.device_cache and cfg.data.cache_dir == f"{tmp_path}/scenes"
    cpu = load_train_config(DEMO)
    # the same optimisation as the CPU recipe, so the same accuracy is expected of it
    assert (cfg.steps, cfg.batch_size, cfg.lr, cfg.warmup_steps) == (cpu.steps, cpu.batch_size, cpu.lr, cpu.warmup_steps)
    assert cfg.model_config() == cpu.model_config()


def test_untrained_checkpoint_holds_the_recipes_model(tmp_path):
    d = untrained_checkpoint(DEMO, tmp_path)
    model = load_model(d)
    assert model.cfg == load_train_config(DEMO).model_config()
    assert load_model(tmp_path).cfg == model.cfg  # the run folder resolves to it, as export and bench take it
