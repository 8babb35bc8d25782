"""Every count the commands take has a documented upper bound, and every bad option value is one
line ``residency <cmd>: error: ...``, exit 2, never argparse's usage block (issue 41 F17)."""

from __future__ import annotations

from pathlib import Path

import pytest

from residency import protocol
from residency.cli import main as cli

ROOT = Path(__file__).resolve().parent.parent.parent
KINETO_RUN = ROOT / "data" / "runs" / "emulated-paired-profile-2r50s"


def run(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `residency ARGV` in-process, argparse's exit included."""
    try:
        code = cli.main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 2
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(("argv", "option", "bound"), [
    (["selftest", "--ranks", "99"], "--ranks", "64"),
    (["serve", "--arm", "candidate", "--ranks", "1e20"], "--ranks", "64"),
    (["serve", "--arm", "candidate", "--capacity", "100000000000000000000000"], "--capacity",
     "1,125,899,906,842,624"),
    (["serve", "--arm", "candidate", "--port", "70000"], "--port", "65,535"),
    (["pair", "--out", "r", "--pairs", "99999999999"], "--pairs", "1,000"),
    (["pair", "--out", "r", "--max-pairs", "1001"], "--max-pairs", "1,000"),
    (["pair", "--out", "r", "--requests", "1001"], "--requests", "1,000"),
    (["pair", "--out", "r", "--steps", "10001"], "--steps", "10,000"),
    (["pair", "--out", "r", "--ranks", "65"], "--ranks", "64"),
    (["pair", "--out", "r", "--capacity", "0"], "--capacity", "1,125,899,906,842,624"),
    (["pair", "--out", "r", "--seed", "9007199254740992"], "--seed", "9,007,199,254,740,991"),
    (["idle", ".", "--workers", "0"], "--workers", "256"),
    (["idle", ".", "--workers", "257"], "--workers", "256"),
    (["plan", "--pairs", "3,99999"], "--pairs", "1,000"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_a_count_past_its_bound_is_one_line_naming_it(argv, option, bound, capsys,
                                                     monkeypatch) -> None:
    def started(args: object) -> int:  # (a bound not kept would start 100 processes)
        raise AssertionError(f"residency {argv[0]} started with {args}")

    help_, description, configure, _ = cli.COMMANDS[argv[0]]
    monkeypatch.setitem(cli.COMMANDS, argv[0], (help_, description, configure, started))
    code, out, err = run(argv, capsys)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and "usage:" not in err, err
    assert err.startswith(f"residency {argv[0]}: error: argument {option}: "), err
    assert bound in err and "(" in err  # the bound, with its reason


def test_a_value_read_as_an_option_is_one_line_with_the_remedy(capsys) -> None:
    """``--free -1:1:0.1``: argparse reads the value as an option; one line says how to
    write it, and written so it is the what-if's own one-line refusal."""
    run_dir = str(ROOT / "data" / "runs" / "emulated-consecutive-2r2s")
    code, _, err = run(["whatif", run_dir, "--free", "-1:1:0.1"], capsys)
    assert code == 2 and err.count("\n") == 1 and "usage:" not in err, err
    assert err.startswith("residency whatif: error: argument --free: expected one argument")
    assert "--free=VALUE" in err
    code, _, err = run(["whatif", run_dir, "--free=-1:1:0.1"], capsys)
    assert code == 2 and err.count("\n") == 1 and "[0, 1]" in err, err


def test_the_bounds_are_documented_with_their_reasons(capsys) -> None:
    """README's command-line section and each command's --help state every bound."""
    assert cli.MAX_STEPS == protocol.MAX_STEPS and cli.MAX_SEED == protocol.MAX_SEED
    readme = (ROOT / "README.md").read_text()
    for words in ("at most 64", "230 MB", "1,000 pairs", "1,000 requests", "10,000 steps",
                  "256 workers", "1 PiB"):
        assert words in readme, words
    for command, words in (("pair", ["at most 64", "at most 1,000", "at most 10,000",
                                     "1 PiB"]),
                           ("serve", ["at most 64", "1 PiB"]), ("selftest", ["at most 64"]),
                           ("idle", ["at most 256"])):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        for w in words:
            assert w in text, (command, w)


def test_a_session_for_kineto_traces_is_refused(capsys) -> None:
    """``--session`` chooses among torch-npu sessions; on Kineto traces it was ignored."""
    trace = str(KINETO_RUN / "runs" / "00-baseline" / "trace")
    code, _, err = run(["idle", trace, "--no-cache", "--session", "garbage"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"residency idle: error: {trace}: holds Kineto traces") and (
        "--session" in err), err
