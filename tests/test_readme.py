"""The README's Python examples run as written."""

import re
from pathlib import Path

import pytest

BLOCKS = re.findall(
    r"```python\n(.*?)```", (Path(__file__).parent.parent / "README.md").read_text(), flags=re.S
)


def test_readme_has_a_short_first_example() -> None:
    assert BLOCKS, "README has no python example"
    assert len(BLOCKS[0].strip().splitlines()) <= 12


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index: int) -> None:
    exec(compile(BLOCKS[index], f"README.md example {index}", "exec"), {})
