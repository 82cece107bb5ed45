"""The docs stay true: every repository path they name exists, their tables are what scripts/docs_tables.py
renders from docs/results/, the README stays short, and docs/ holds pages and results, not dated run folders
or logs (git history keeps those)."""
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("docs_tables", ROOT / "scripts" / "docs_tables.py")
docs_tables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(docs_tables)

PREFIXES = ("depthpack", "tests", "scripts", "configs", "docs", "deploy_cpp", "export", "train")
# a repository path: one of the top folders, then path characters; not inside a longer path (/abs/docs/x),
# a dotted name or a history reference (`git show COMMIT:docs/x`, which names a file of that commit)
REPO_PATH = re.compile(r"(?<![\w./:@~$-])((?:%s)/[\w./-]*)" % "|".join(PREFIXES))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`]+)`")  # within a paragraph, so a span may wrap a line
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
BUILD_OUTPUTS = ("deploy_cpp/build",)  # what the commands in the docs create
DATED = re.compile(r"^\d{4}-\d{2}-\d{2}$")
# Paths named by a page another engineer owns, gone from main since; the owner updates the page. Each entry
# must still be named and missing, so the list shrinks with the fix.
PENDING = {"deploy_cpp/README.md": {"scripts/gpu_cpp.sh", "docs/bench/", "docs/bench/h200/",
                                    "docs/bench/h200/2026-12-02/fifth/"}}


def doc_pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "deploy_cpp" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def named_paths(text: str, page: Path) -> set[str]:
    """Repository paths a markdown page names, relative to the repository root: backticked spans and code
    blocks (paths from the root), and relative links (from the page's folder; web links and anchors left out)."""
    found = set()
    prose = FENCE.sub("", text)
    spans = [s for para in re.split(r"\n\s*\n", prose) for s in CODE.findall(para)] + FENCE.findall(text)
    for span in spans:
        for m in REPO_PATH.finditer(span):
            p = m.group(1).rstrip(".")
            if span[m.end():m.end() + 1] in ("*", "{", "<") or "..." in p or p.startswith(BUILD_OUTPUTS):
                continue  # a pattern (docs/results/*.json, depthpack_k{K}.pt2), an ellipsis, a build output
            found.add(p)
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        rel = (page.parent / target.split("#")[0]).resolve()
        try:
            found.add(str(rel.relative_to(ROOT)) + ("/" if target.split("#")[0].endswith("/") else ""))
        except ValueError:
            found.add(target)  # a link out of the repository
    return found


def missing_paths(page: Path) -> set[str]:
    return {p for p in named_paths(page.read_text(), page) if not (ROOT / p).exists()}


def test_the_extractor_finds_paths_and_flags_a_wrong_one(tmp_path):
    page = ROOT / "docs" / "x.md"
    text = ("See `depthpack/core/fast.py` and `python scripts/docs_tables.py --check`, [the design](design.md), "
            "[C++](../deploy_cpp/README.md#build), [web](https://example.com/docs/x.md), [anchor](#top).\n"
            "Not paths: `git show 5de0733:depthpack/kernels/patch_embed.py`, `/work/docs/x.md`, "
            "`depthpack.core.fast`, `depthpack_k{K}.pt2`, `docs/results/*.json`.\n"
            "```bash\npython -m depthpack.train --config configs/demo.yaml\ndeploy_cpp/build/depthpack_run --help\n```\n"
            "Wrong: `depthpack/orin.py`, `tests/test_orin_gone.py`.")
    assert named_paths(text, page) == {"depthpack/core/fast.py", "scripts/docs_tables.py", "docs/design.md",
                                       "deploy_cpp/README.md", "configs/demo.yaml", "depthpack/orin.py",
                                       "tests/test_orin_gone.py"}
    (tmp_path / "page.md").write_text(text)
    wrong = {p for p in named_paths(text, page) if not (ROOT / p).exists()}
    assert wrong == {"depthpack/orin.py", "tests/test_orin_gone.py"}


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_the_docs_name_exists(page):
    pending = PENDING.get(str(page.relative_to(ROOT)), set())
    missing = missing_paths(page)
    assert not missing - pending, f"{page.relative_to(ROOT)} names paths that do not exist: {sorted(missing - pending)}"
    assert pending <= missing, f"fixed in {page.relative_to(ROOT)}: drop {sorted(pending - missing)} from PENDING"


def test_readme_is_short_and_names_no_commit():
    text = (ROOT / "README.md").read_text()
    lines = text.count("\n")
    assert lines <= 160, f"README.md has {lines} lines; the details belong in docs/"
    hashes = re.findall(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b", text)  # a word of hex digits and letters
    assert not hashes, f"README.md names commits {hashes}: the result files name them"


def _tracked(folder: str) -> list[str]:
    if shutil.which("git") and (ROOT / ".git").exists():
        out = subprocess.run(["git", "ls-files", folder], cwd=ROOT, capture_output=True, text=True, check=True)
        return out.stdout.split()
    return [str(p.relative_to(ROOT)) for p in (ROOT / folder).rglob("*") if p.is_file()]


def test_docs_hold_no_dated_folders_and_no_logs():
    files = _tracked("docs")
    assert files, "docs/ is empty or not found"
    dated = [f for f in files if any(DATED.match(part) for part in Path(f).parts[:-1])]
    logs = [f for f in files if f.endswith(".log")]
    assert not dated, f"dated folders in docs/: {dated[:5]}"
    assert not logs, f"logs in docs/: {logs[:5]}"


def test_the_docs_speak_of_the_project_not_of_work_sessions():
    for page in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]:
        text = page.read_text()
        hits = re.findall(r"\bsessions?\b|\b(?:run|call) \d\b|\b(?:third|fourth|fifth|sixth|seventh) (?:run|call)\b",
                          text, re.I)
        assert not hits, f"{page.relative_to(ROOT)}: {hits}"


@pytest.mark.parametrize("page", [p for p in doc_pages() if docs_tables.MARK.search(p.read_text())],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_generated_tables_are_what_the_results_render(page):
    text = page.read_text()
    assert docs_tables.render(text, str(page)) == text, \
        f"{page.relative_to(ROOT)} differs from docs/results/: run python scripts/docs_tables.py"


def test_results_name_hardware_torch_and_commit():
    for f in sorted((ROOT / "docs" / "results").glob("*.json")):
        text = f.read_text()
        data = json.loads(text)
        assert "torch" in text and "commit" in text, f.name
        assert any(k in text for k in ('"gpu"', '"cpu"', '"hardware"', '"h200"')), f.name
        assert isinstance(data, dict)


def test_a_new_bench_json_re_renders_the_latency_tables(tmp_path, monkeypatch):
    """A benchmark's bench.json dropped in as docs/results/h100_bench.json (or h200_bench.json) changes the README's
    and the performance page's tables on the next render, with the new commit."""
    for f in (ROOT / "docs" / "results").glob("*.json"):
        shutil.copy(f, tmp_path / f.name)
    for name, ms in (("h100_bench.json", 0.321), ("h200_bench.json", 0.123)):
        data = json.loads((tmp_path / name).read_text())
        new = dict(data, info=dict(data["info"], commit="abc1234"), results=[
            dict(r, median_ms=ms, commit=None) if r["row"] == "fast" and r["batch"] == 1 else dict(r, commit=None)
            for r in data["results"]], checks={"vits bfloat16 B1 Q256": dict(default_ms=ms, best_row="fast", best_ms=ms,
                                                                              default_over_best=1.0)})
        (tmp_path / name).write_text(json.dumps(new))
    monkeypatch.setattr(docs_tables, "RESULTS", tmp_path)
    readme = docs_tables.render((ROOT / "README.md").read_text())
    assert "| **fast** | 0.321 |" in readme and "Measured before" not in readme
    perf = docs_tables.render((ROOT / "docs" / "performance.md").read_text())
    fast = "| **fast** | the default Predictor: the fast recipe for this device and batch | "
    assert fast + "0.321 |" in perf and fast + "0.123 |" in perf
    assert "Commit `abc1234`." in perf and "the best row (fast) 0.123 ms: 1.00x" in perf


def test_render_refuses_unknown_and_unclosed_blocks():
    with pytest.raises(ValueError, match="unknown generated block 'nope'"):
        docs_tables.render("<!-- generated: nope -->\nx\n<!-- end generated: nope -->\n")
    with pytest.raises(ValueError, match="not closed"):
        docs_tables.render("<!-- generated: accuracy -->\nx\n")


def test_check_mode_fails_on_a_stale_page(tmp_path, monkeypatch):
    page = tmp_path / "README.md"
    page.write_text("<!-- generated: focal -->\nstale\n<!-- end generated: focal -->\n")
    monkeypatch.setattr(docs_tables, "pages", lambda: [page])
    monkeypatch.setattr(docs_tables, "ROOT", tmp_path)
    assert docs_tables.main(["--check"]) == 1 and "stale" in page.read_text()
    assert docs_tables.main([]) == 0 and "stale" not in page.read_text()
    assert docs_tables.main(["--check"]) == 0
