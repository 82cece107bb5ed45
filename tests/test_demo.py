"""make demo's GPU recipe, and the untrained checkpoint that scripts/gpu_export_timing.sh compiles
(the demo itself runs on the GPU machine: scripts/gpu_run.sh PART=final)."""
from depthpack.core.checkpoint import load_model
from depthpack.demo import GPU_RECIPE, ROOT, untrained_checkpoint
from depthpack.train.config import load_train_config

DEMO = str(ROOT / "configs" / "demo.yaml")


def test_gpu_recipe_is_the_cpu_recipe_on_the_device_data_path(tmp_path):
    cfg = load_train_config(DEMO, [r.format(out=tmp_path) for r in GPU_RECIPE])
    assert cfg.data.device_cache and cfg.data.cache_dir == f"{tmp_path}/scenes" and cfg.graph
    cpu = load_train_config(DEMO)
    # the same optimisation as the CPU recipe, so the same accuracy is expected of it
    assert (cfg.steps, cfg.batch_size, cfg.lr, cfg.warmup_steps) == (cpu.steps, cpu.batch_size, cpu.lr, cpu.warmup_steps)
    assert cfg.model_config() == cpu.model_config()


def test_untrained_checkpoint_holds_the_recipes_model(tmp_path):
    d = untrained_checkpoint(DEMO, tmp_path)
    model = load_model(d)
    assert model.cfg == load_train_config(DEMO).model_config()
    assert load_model(tmp_path).cfg == model.cfg  # the run folder resolves to it, as export and bench take it


def test_gpu_demo_compiles_packages_during_training_and_reuses_them(tmp_path, monkeypatch):
    """On a GPU the packages compile from the untrained model in the background from the start, while
    training, evaluation and the benchmark run; the export after them gives the packages the trained
    weights (--reuse-packages): the steps' commands and their order, with the steps themselves stubbed."""
    from depthpack import demo

    events = []

    class FakeBackground:
        def __init__(self, name, cmd, logs):
            self.name = name
            events.append(("start", name, cmd))

        def finish(self):
            events.append(("finish", self.name, None))
            return 0.0

    def fake_step(name, cmd, logs, env=None):
        events.append(("run", name, cmd))
        logs.mkdir(parents=True, exist_ok=True)
        (logs / f"{name}.log").write_text('{"step": 0}\n')
        return 0.0

    monkeypatch.setattr(demo.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(demo.torch.cuda, "get_device_name", lambda *a: "a GPU")
    monkeypatch.setattr(demo, "Background", FakeBackground)
    monkeypatch.setattr(demo, "run_step", fake_step)
    monkeypatch.setattr(demo, "selection_png", lambda ckpt, out: events.append(("run", "selection", None)))
    demo.main(["--out", str(tmp_path), "--skip", "cpp"])
    order = [(kind, name) for kind, name, _ in events]
    assert order == [("start", "compile_packages"), ("run", "train"), ("run", "evaluate"), ("run", "selection"),
                     ("run", "bench"), ("finish", "compile_packages"), ("run", "export")]
    cmds = {name: cmd for kind, name, cmd in events if cmd}
    early, export, bench = cmds["compile_packages"], cmds["export"], cmds["bench"]
    assert early[early.index("--checkpoint") + 1].startswith(str(tmp_path / "untrained")) and "--onnx" not in early
    assert load_model(tmp_path / "untrained").cfg == load_train_config(DEMO).model_config()
    assert early[early.index("--out") + 1] == export[export.index("--reuse-packages") + 1]
    assert export[export.index("--checkpoint") + 1] == str(tmp_path / "train") and "--onnx" in export
    assert all(r.format(out=tmp_path) in cmds["train"] for r in GPU_RECIPE)
    assert bench[bench.index("--pairs") + 1] == "1x256,8x512"
    assert (tmp_path / "report.md").is_file()
