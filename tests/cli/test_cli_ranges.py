"""A value out of an option's range is one `error:` line naming the option, never click's
usage box; nothing is opened (the check comes before any store)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from mnemo.cli import app

OUT_OF_RANGE = [
    (["recall", "r", "q", "-k", "0"], "--k"),
    (["search", "q", "--limit", "0"], "--limit"),
    (["search", "q", "--limit", "101"], "--limit"),
    (["history", "r", "--limit", "0"], "--limit"),
    (["reembed", "r", "--batch-size", "0"], "--batch-size"),
    (["reembed", "r", "--batch-size", "10001"], "--batch-size"),
    (["view", "m", "--radius", "-1"], "--radius"),
    (["view", "m", "--radius", "101"], "--radius"),
    (["session", "close", "s", "--wait", "-1"], "--wait"),
    (["mcp", "--port", "65536"], "--port"),
    (["ui", "--port", "0"], "--port"),
]


@pytest.mark.parametrize(("args", "option"), OUT_OF_RANGE,
                         ids=[" ".join(args) for args, _ in OUT_OF_RANGE])
def test_a_value_out_of_range_is_one_line(args: list[str], option: str) -> None:
    result = CliRunner().invoke(app, [*args, "--db", "/nonexistent/never.db"])
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: ")
    assert option in result.stderr
    assert "Usage" not in result.output
    assert "Traceback" not in result.output


def test_an_unknown_command_or_option_is_one_line() -> None:
    for args in (["nosuch"], ["recall", "r", "q", "--nosuch"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, result.output
        assert result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith("error: ")
