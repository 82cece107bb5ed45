"""The commit a result records: the checkout's short hash, marked when the tree differs from it."""
import subprocess

from depthpack.core.provenance import commit


def _git(repo, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_a_tree_that_differs_from_its_commit_is_marked_dirty(tmp_path):
    assert commit(tmp_path) is None  # not a checkout
    _git(tmp_path, "init", "-q")
    (tmp_path / "code.py").write_text("a = 1\n")
    _git(tmp_path, "add", "code.py")
    _git(tmp_path, "commit", "-qm", "first")
    head = _git(tmp_path, "rev-parse", "--short", "HEAD")
    assert commit(tmp_path) == head
    (tmp_path / "runs.log").write_text("an untracked output\n")
    assert commit(tmp_path) == head
    (tmp_path / "code.py").write_text("a = 2\n")  # a copied tree newer than its .git
    assert commit(tmp_path) == f"{head}+dirty"
