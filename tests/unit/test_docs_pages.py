"""Every block of a tutorial or how-to guide says what it is (tests/e2e/test_docs.py runs them); skipped blocks
say why, and only for what cannot run here."""
import pytest
from docs_pages import DOCS, blocks, runnable_pages

SKIP_REASONS = ("needs a GPU", "needs the Globus Compute cloud", "needs a PBS")


@pytest.mark.parametrize("page", runnable_pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_every_block_of_a_page_is_run_written_or_shown(page):
    todo = blocks(page)
    assert any(b.kind in ("run", "slurm", "fails") for b in todo), f"{page}: nothing of it runs"
    for b in todo:
        if b.kind == "skip":
            assert b.arg.startswith(SKIP_REASONS), f"{b.where()}: skipped for '{b.arg}'"


def test_a_block_without_a_directive_is_refused(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# x\n\n```yaml\na: 1\n```\n")
    with pytest.raises(ValueError, match="must say what it is"):
        blocks(page)
    page.write_text("# x\n\n% file: a.yaml\n```yaml\na: 1\n```\n\nthen\n\n```bash\ncat a.yaml\n```\n")
    assert [(b.kind, b.arg) for b in blocks(page)] == [("file", "a.yaml"), ("run", "")]
