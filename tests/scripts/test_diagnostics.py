"""scripts/diagnostics.py on a tiny run: the attention masses of the query tokens sum to one per block
(prefix + buffer + left out), the top-norm shares too; the gap curve has one row per checkpoint."""
import pytest

from conftest import load_script
from depthpack.train.config import load_train_config
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from depthpack.train import train

    out = tmp_path_factory.mktemp("diagrun")
    train(load_train_config(ROOT / "configs" / "tiny.yaml", [f"out_dir={out}", "steps=3", "ckpt_every=1", "eval_images=2"]))
    return out


def test_context_masses_and_the_gap_curve(run_dir, tmp_path):
    diagnostics = load_script("diagnostics")
    d = diagnostics.main(["context", "--checkpoint", str(run_dir), "--queries", "8", "--max-images", "2", "--out",
                          str(tmp_path / "d")])
    assert d["images"] == 2 and len(d["blocks"]) == 2
    for b in d["blocks"]:
        assert sum(b["attention"].values()) == pytest.approx(1.0, abs=1e-4)
        assert sum(b["top_norm_tokens"].values()) == pytest.approx(1.0, abs=1e-6)
        assert b["attention"]["left_out"] > 0  # 8 queries: most of the 64 patches are left out
    assert "left out" in (tmp_path / "d" / "context.md").read_text()
    g = diagnostics.main(["gap", "--checkpoint", str(run_dir), "--queries", "8", "--max-images", "2", "--out",
                          str(tmp_path / "g")])
    steps = [row["step"] for row in g["curve"]]
    assert steps == sorted(steps) and steps[-1] == 3 and all(row["q8"]["dense"] > 0 for row in g["curve"])
    assert (tmp_path / "g" / "gap.png").stat().st_size > 0 and (tmp_path / "g" / "gap.md").read_text().count("|") > 4
