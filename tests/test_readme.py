"""The README's data-parallel script is examples/train_ddp.py, word for word: the tests run that file
(tests/integration/test_multinode.py, as the README's commands say), so the README shows what runs."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_readme_shows_the_example_the_tests_run():
    example = (ROOT / "examples" / "train_ddp.py").read_text().rstrip("\n")
    assert f"```python\n{example}\n```" in (ROOT / "README.md").read_text()
