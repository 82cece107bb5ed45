"""make demo: its GPU recipe, the untrained checkpoint whose packages compile while training runs, the
order of the steps on a GPU (stubbed), and the bag step run for real on the CPU with a small recording."""
import json

import pytest

from depthpack.core.checkpoint import load_model
from depthpack.train.run_folder import untrained_checkpoint
from conftest import load_script

demo = load_script("demo")
GPU_RECIPE, ROOT = demo.GPU_RECIPE, demo.ROOT
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
    weights (--reuse-packages): the steps' commands and their order, with the steps themselves stubbed (the
    train step leaves an untrained checkpoint, from which the recording takes its size)."""

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
        if name == "train":
            untrained_checkpoint(DEMO, tmp_path / "train")
        logs.mkdir(parents=True, exist_ok=True)
        (logs / f"{name}.log").write_text('{"step": 0}\n')
        return 0.0

    monkeypatch.setattr(demo.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(demo.torch.cuda, "get_device_name", lambda *a: "a GPU")
    monkeypatch.setattr(demo, "Background", FakeBackground)
    monkeypatch.setattr(demo, "run_step", fake_step)
    monkeypatch.setattr(demo, "selection_png", lambda ckpt, out: events.append(("run", "selection", None)))
    demo.main(["--out", str(tmp_path), "--skip", "cpp", "--bag-frames", "2"])
    order = [(kind, name) for kind, name, _ in events]
    assert order == [("start", "compile_packages"), ("run", "train"), ("run", "evaluate"), ("run", "selection"),
                     ("run", "bench"), ("run", "bag"), ("finish", "compile_packages"), ("run", "export")]
    cmds = {name: cmd for kind, name, cmd in events if cmd}
    early, export, bench = cmds["compile_packages"], cmds["export"], cmds["bench"]
    assert early[early.index("--checkpoint") + 1].startswith(str(tmp_path / "untrained")) and "--onnx" not in early
    assert load_model(tmp_path / "untrained").cfg == load_train_config(DEMO).model_config()
    assert early[early.index("--out") + 1] == export[export.index("--reuse-packages") + 1]
    assert export[export.index("--checkpoint") + 1] == str(tmp_path / "train") and "--onnx" in export
    assert all(r.format(out=tmp_path) in cmds["train"] for r in GPU_RECIPE)
    assert bench[bench.index("--pairs") + 1] == "1x256,8x512"
    bag = cmds["bag"]  # the trained checkpoint over the recording, on the GPU
    assert bag[bag.index("--checkpoint") + 1] == str(tmp_path / "train") and bag[bag.index("--device") + 1] == "cuda"
    assert (tmp_path / "recording" / "metadata.yaml").is_file()
    assert (tmp_path / "report.md").is_file()


@pytest.mark.slow  # about 15 s on 2 shared cores: python -m depthpack.bag run in a child process
def test_bag_step_runs_the_model_over_a_recording_and_reports_it(tmp_path, monkeypatch):
    """The bag step for real on the CPU (every other step skipped, an untrained checkpoint as the trained
    one): a recording at 4x the model's size, `python -m depthpack.bag run` over it, and the report's
    section with the accuracy, the per-frame latency, the decode rate and the outputs' paths."""

    monkeypatch.setattr(demo.torch.cuda, "is_available", lambda: False)
    untrained_checkpoint(DEMO, tmp_path / "train")
    report = demo.main(["--out", str(tmp_path), "--skip", "train", "eval", "export", "cpp", "bench", "--bag-frames", "3"])
    rep = json.loads((tmp_path / "recording_depth.json").read_text())
    assert rep["frames"] == 3 and rep["accuracy"]["frames"] == 3 and rep["latency_ms"]["calls"] == 2
    assert (tmp_path / "recording_depth" / "metadata.yaml").is_file() and (tmp_path / "recording_depth.csv").is_file()
    text = report.read_text()
    assert "| recording (3 frames of 256x256: colour, depth, CameraInfo as a ROS 2 MCAP bag) |" in text
    assert "| bag run (the trained model on every frame of the recording) |" in text
    section = text.split("## A robot's recording: `python -m depthpack.bag run`\n", 1)[1].split("\n## ", 1)[0]
    acc, lat = rep["accuracy"], rep["latency_ms"]
    row = (f"| {acc['abs_rel']:.4f} | {acc['d1']:.4f} | {acc['points']} | {lat['median_ms']:.1f} | {lat['p90_ms']:.1f} | "
           f"{lat['first_call_ms']:.1f} | {rep['decode_frames_per_s']:.1f} | {rep['run_frames_per_s']:.2f} |")
    assert row in section
    for name in ("`recording_depth`", "`recording_depth.csv`", "`recording_depth.json`", "`recording`"):
        assert name in section


def test_report_shows_the_edge_band_beside_uniform():
    band_table = demo.band_table

    def rows(v):
        return [{"path": p, "anchors": a, "queries": q, "abs_rel": v + (0.01 if a is False else 0) + q / 1000}
                for p in ("packed", "dense") for a in (True, False) for q in (16, 64)]
    result = {"bands": {"uniform": {"rows": rows(0.1)}, "edge": {"rows": rows(0.3)}}, "band": {"radius": 8}}
    lines = band_table(result)
    assert "within 8 px" in lines[0] and lines[2].startswith("| Q | packed uniform | packed edge band |")
    assert lines[4] == "| 16 | 0.1160 | 0.3160 | 0.1160 | 0.3160 |" and lines[5].startswith("| 64 | 0.1640 | 0.3640")
    assert band_table({"bands": {"uniform": {"rows": rows(0.1)}}}) == []  # one point set: no side-by-side table
