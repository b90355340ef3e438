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


def test_shown_output_is_checked_against_what_was_printed_numbers_and_ids_aside():
    from docs_pages import shown_lines_missing
    printed = ("sites: two-ranks\nbft-state/two_ranks/jobs/cnn/ckpt-000000100.h5\n"
               '  start  {"generation": "ed1b5cbacbc1", "jobs": ["blobs"], "resume": {"blobs": 343}}\n')
    shown = ("sites: two-ranks\nbft-state/two_ranks/jobs/cnn/ckpt-000000300.h5\n...\n"
             '  start {"generation": "0123abcd4567", "jobs": ["blobs"], ...\n')
    assert shown_lines_missing(shown, printed) == []
    assert shown_lines_missing("world sizes: [4]\nsites: other\n", printed) == ["world sizes: [4]", "sites: other"]
    assert shown_lines_missing('  start ... "resume": {"blobs": 9}}', printed) == []
    assert shown_lines_missing('  start ... "jobs": ["other"]', printed) == ['  start ... "jobs": ["other"]']
