"""The command line as an operator meets it: `serve --help` documents every setting, a config
file, `TOKENTRAIL_*` variables and flags resolve to the same settings (the flag winning), a
config file reproduces a flag-only start, startup errors name the flag and exit 2, and
`doctor` checks a deployment against engines speaking SGLang's and vLLM's wire formats."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import tokentrail
from support.fake_engines import FakeSGLang, FakeVLLM
from support.serve import free_port, wait_healthy
from tokentrail import cli
from tokentrail.cli import settings
from tokentrail.cli.doctor import PROBE, check_journal
from tokentrail.cli.serve import ServeSettings, resolve_settings
from tokentrail.compat import tomllib
from tokentrail.errors import SettingError
from tokentrail.kinds import DriftPolicy, History, Retry, SettingGroup
from tokentrail.text.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
FIELDS = settings.fields_of(ServeSettings)


def serve_args(*argv: str) -> Any:
    return cli.build_parser().parse_args(["serve", *argv])


def serve_help() -> str:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices["serve"].format_help()  # type: ignore[union-attr]


# --- help --------------------------------------------------------------------------------------


def test_serve_help_gives_every_setting_one_line_with_its_default_in_its_group() -> None:
    text = serve_help()
    # Every group is a section, in SettingGroup's order.
    positions = [text.index(f"\n{g.value}:\n") for g in SettingGroup]
    assert positions == sorted(positions)
    unwrapped, squeezed = re.sub(r"\s+", " ", text), re.sub(r"\s+", "", text)
    for f in FIELDS:
        assert f.flag in text, f.flag
        # The help line, its default and its variable (wrapped by argparse, at spaces and
        # hyphens, hence compared without whitespace).
        assert re.sub(r"\s+", "", f.help_line()) in squeezed, f.flag
        assert f.info.help and "(default: " in f.help_line()
    # A few as an operator reads them.
    assert "--max-body-bytes BYTES" in text and "--body-timeout SECONDS" in text
    assert "(default: 33554432 bytes; TOKENTRAIL_MAX_BODY_BYTES)" in unwrapped
    assert "(default: 600 s; TOKENTRAIL_ENGINE_TIMEOUT)" in unwrapped
    assert "--session-from-body, --no-session-from-body" in text


def test_version_is_cargos() -> None:
    cargo = tomllib.loads((ROOT / "Cargo.toml").read_text())["package"]["version"]
    assert tokentrail.__version__ == cargo
    run = subprocess.run(
        [sys.executable, "-m", "tokentrail", "--version"], capture_output=True, text=True
    )
    assert (run.returncode, run.stdout.strip()) == (0, f"tokentrail {cargo}")


# --- resolution ----------------------------------------------------------------------------------

# One value of each kind a setting takes, none of them its default.
GIVEN: dict[str, Any] = {
    "port": 9123,
    "engine_timeout": 12.5,
    "session_from_body": True,
    "history": "render",
    "drift_policy": "slime",
    "chat_template": "/tmp/t.jinja",
    "exclude_system": ["^You are a summarizer", "memory"],
    "max_body_bytes": 1000,
    "retries": "fresh",
    "tool_parser": "none",
}


def as_flags(values: dict[str, Any]) -> list[str]:
    out = []
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            out.append(flag)
        elif isinstance(value, list):
            for item in value:
                out += [flag, item]
        else:
            out += [flag, str(value)]
    return out


def as_toml(values: dict[str, Any]) -> str:
    return "".join(
        f"{name.replace('_', '-')} = {json.dumps(value).lower() if isinstance(value, bool) else json.dumps(value)}\n"  # noqa: E501
        for name, value in values.items()
    )


def as_env(values: dict[str, Any]) -> dict[str, str]:
    return {
        f"TOKENTRAIL_{name.upper()}": json.dumps(v) if isinstance(v, list) else str(v).lower()
        if isinstance(v, bool) else str(v)
        for name, v in values.items()
    }  # fmt: skip


def test_flags_variables_and_a_config_file_give_the_same_settings(tmp_path: Path) -> None:
    config = tmp_path / "serve.toml"
    config.write_text(as_toml(GIVEN))
    from_flags = resolve_settings(serve_args(*as_flags(GIVEN)), environ={})
    from_file = resolve_settings(serve_args("--config", str(config)), environ={})
    from_env = resolve_settings(serve_args(), environ=as_env(GIVEN))
    assert from_flags == from_file == from_env
    assert from_flags != ServeSettings()
    assert (from_flags.config.history, from_flags.manager.drift_policy) == (
        History.RENDER,
        DriftPolicy.SLIME,
    )
    assert from_flags.config.retry is Retry.FRESH and from_flags.engine_timeout == 12.5
    assert from_flags.config.exclude_patterns == tuple(GIVEN["exclude_system"])


def test_the_flag_wins_over_the_variable_which_wins_over_the_file(tmp_path: Path) -> None:
    config = tmp_path / "serve.toml"
    config.write_text('port = 1111\nhost = "0.0.0.0"\nmax-tools = 3\n[limits]\nmax_messages = 7\n')
    args = serve_args("--config", str(config), "--port", "3333")
    env = {"TOKENTRAIL_PORT": "2222", "TOKENTRAIL_HOST": "::1"}
    resolved = settings.resolve(ServeSettings, args, env)
    s = resolved.build(ServeSettings)
    # A key inside a [table] counts, with dashes or underscores.
    limits = s.config.limits
    assert (s.port, s.host, limits.max_tools, limits.max_messages) == (3333, "::1", 3, 7)
    assert [str(resolved.sources[n]) for n in ("port", "host", "max_tools", "workers")] == [
        "command line",
        "environment",
        "config file",
        "default",
    ]
    # A flag whose value is optional takes its constant without one.
    assert resolve_settings(serve_args("--access-log"), {}).access_log == "-"
    assert resolve_settings(serve_args("--access-log", "a.log"), {}).access_log == "a.log"
    # A config file's true is turned off by the flag's --no- form.
    config.write_text("session-from-body = true\n")
    off = resolve_settings(serve_args("--config", str(config), "--no-session-from-body"), {})
    assert off.config.session_from_body is False


def test_print_config_is_a_config_file_that_reproduces_the_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*as_flags(GIVEN), "--admin-token", "s3cret"]
    assert cli.main(["serve", *argv, "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert "s3cret" not in printed and "# admin-token: set (command line), not printed" in printed
    assert "port = 9123  # command line" in printed and "max-tools = 1000  # default" in printed
    saved = tmp_path / "printed.toml"
    saved.write_text(printed)
    again = resolve_settings(serve_args("--config", str(saved)), environ={})
    wanted = resolve_settings(serve_args(*as_flags(GIVEN)), environ={})
    assert again == wanted


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("max-body-byte = 10\n", "unknown setting max-body-byte"),
        ('port = "80"\n', "port: '80' is not an integer"),
        ('history = "sometimes"\n', "'sometimes' is not one of splice, render"),
        ("exclude-system = [1]\n", "[1] is not a list of strings"),
        ("port = \n", "not a TOML file"),
    ],
)
def test_a_bad_config_file_names_the_key_and_value(tmp_path: Path, toml: str, message: str) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(toml)
    with pytest.raises(SettingError, match=re.escape(message)):
        resolve_settings(serve_args("--config", str(config)), environ={})


def test_a_bad_variable_names_itself() -> None:
    with pytest.raises(SettingError, match="TOKENTRAIL_MAX_TOOLS: 'many' is not an integer"):
        resolve_settings(serve_args(), environ={"TOKENTRAIL_MAX_TOOLS": "many"})


# --- startup errors ------------------------------------------------------------------------------


def startup_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(["serve", "--port", "0", *argv]) == 2
    return capsys.readouterr().err


def test_startup_errors_name_the_flag_and_value_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = startup_error(["--engine", "sglang://127.0.0.1:port"], capsys)
    assert "tokentrail serve: --engine sglang://127.0.0.1:port: " in err and "HOST:PORT" in err
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_text("{not json")
    err = startup_error(["--tokenizer", str(model)], capsys)
    assert f"--tokenizer {model}: " in err
    err = startup_error(["--tokenizer", str(tmp_path / "absent")], capsys)
    assert f"--tokenizer {tmp_path / 'absent'}: " in err
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m.content }}")
    err = startup_error(["--chat-template", str(bad)], capsys)
    assert f"--chat-template {bad} cannot render a one-message conversation" in err
    assert "chat template syntax error, line 1" in err
    err = startup_error(["--chat-template", str(tmp_path / "none.jinja")], capsys)
    assert "No such file or directory" in err
    err = startup_error(["--exclude-system", "(unclosed"], capsys)
    assert "--exclude-system (unclosed: missing ), unterminated subpattern" in err
    err = startup_error(["--routed-experts"], capsys)
    assert "need the model's shape" in err


def test_a_startup_error_prints_no_traceback(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "tokentrail", "serve", "--engine", "vllm://:x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert run.stderr.startswith("tokentrail serve: --engine vllm://:x: ")
    assert "Traceback" not in run.stderr


# --- a config file reproduces a flag-only start ----------------------------------------------


def start(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tokentrail", "serve", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def one_session(url: str) -> dict[str, Any]:
    """One Anthropic turn, then the session's finish: what the harness and trainer get."""
    body = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "list"}]}
    headers = {"Content-Type": "application/json", "x-api-key": "session-a"}
    req = urllib.request.Request(
        f"{url}/v1/messages", json.dumps(body).encode(), headers, method="POST"
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        reply = json.loads(resp.read())
    finish = urllib.request.Request(
        f"{url}/tokentrail/sessions/session-a/finish",
        json.dumps({"reward": 1.0}).encode(),
        {"Content-Type": "application/json", "Authorization": "Bearer tok"},
        method="POST",
    )
    with urllib.request.urlopen(finish, timeout=30) as resp:
        samples = json.loads(resp.read())["samples"]
    return {"content": reply["content"], "model": reply["model"], "samples": samples}


def test_a_config_file_reproduces_a_flag_only_start(tmp_path: Path) -> None:
    values = {
        "host": "127.0.0.1",
        "admin_token": "tok",
        "model_name": "from-settings",
        "history": "render",
        "fork_threshold": 64,
        "max_output_tokens": 32,
        "restore": "tree_only",
        "exclude_side_requests": True,
    }
    flag_port, file_port = free_port(), free_port()
    config = tmp_path / "serve.toml"
    config.write_text(as_toml({**values, "port": file_port}))
    # Both start at once (each loads its tokenizer for a few seconds).
    procs = [start([*as_flags(values), "--port", str(flag_port)]), start(["--config", str(config)])]
    try:
        results = []
        for proc, port in zip(procs, (flag_port, file_port), strict=True):
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url, proc)
            results.append(one_session(url))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
    by_flags, by_file = results
    assert by_flags == by_file
    assert by_file["model"] == "from-settings" and by_file["samples"]
    assert sum(by_file["samples"][0]["loss_mask"]) > 0


# --- doctor --------------------------------------------------------------------------------------


def doctor(argv: list[str]) -> tuple[int, str]:
    """`tokentrail doctor` (in this process, on its own event loop): exit code and output."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = cli.main(["doctor", *argv])
    return code, out.getvalue()


@pytest.fixture(autouse=True)
def no_tokentrail_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """The settings' own variables, as an operator's shell may have them, stay out of these."""
    for f in FIELDS:
        monkeypatch.delenv(f.env, raising=False)


def line(out: str, what: str) -> str:
    """The check's line, its columns' padding collapsed."""
    return next(" ".join(ln.split()) for ln in out.splitlines() if ln.split()[1:2] == [what])


def reply_outside_the_vocabulary(input_ids: list[int]) -> tuple[list[int], list[float], str]:
    return [200_000], [-0.1], "length"


async def doctor_against(server: Any, argv: list[str]) -> tuple[int, str, Any]:
    async with server as srv:
        scheme = "sglang" if isinstance(srv, FakeSGLang) else "vllm"
        engine = f"{scheme}://{srv.url.removeprefix('http://')}"
        code, out = await asyncio.to_thread(doctor, ["--engine", engine, *argv])
    return code, out, srv


def test_doctor_passes_a_deployment_against_sglang_and_vllm_wire_formats(tmp_path: Path) -> None:
    journal = tmp_path / "j.sqlite"
    for server in (FakeSGLang(), FakeVLLM()):
        argv = ["--journal", str(journal), "--admin-token", "t"]
        code, out, srv = asyncio.run(doctor_against(server, argv))
        assert code == 0, out
        assert out.splitlines()[-1] == "ready to serve"
        assert line(out, "tokenizer").startswith("ok tokenizer builtin:qwen3: 151669 ids")
        assert "splices at all" in line(out, "template") and "family qwen3" in out
        assert line(out, "journal").startswith("ok") and "will be created" in out
        assert line(out, "admin").startswith("ok")
        # It went through the real wire: token ids in, logprobs asked for, and the reply's
        # first id (the echo engine's: the prompt's third-last) read back with its logprob.
        (body,) = srv.bodies("/generate" if isinstance(srv, FakeSGLang) else "/v1/completions")
        if isinstance(srv, FakeSGLang):
            prompt = body["input_ids"]
            assert body["return_logprob"] is True
        else:
            prompt = body["prompt"]
            assert body["return_token_ids"] is True
        assert prompt == load_tokenizer("builtin:qwen3").encode(PROBE)
        engine = line(out, "engine")
        assert engine.startswith("ok") and f"1 id {prompt[-3]} with logprob -0.5 out" in engine


def test_doctor_says_what_is_wrong_one_line_each(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% if %}")
    argv = ["--chat-template", str(bad), "--journal", str(tmp_path / "no" / "j.sqlite")]
    code, out, _ = asyncio.run(doctor_against(FakeSGLang(mode="fail"), argv))
    assert code == 1
    assert "CUDA out of memory (fake)" in line(out, "engine") and "FAIL" in line(out, "engine")
    assert line(out, "template").startswith(f"FAIL template {bad} cannot render")
    assert "chat template syntax error, line 1" in line(out, "template")
    assert line(out, "journal").startswith("FAIL") and "does not exist" in line(out, "journal")
    assert line(out, "admin").startswith("warn") and "no --admin-token" in line(out, "admin")
    assert out.splitlines()[-1] == "3 of 5 checks failed"
    # An engine that samples ids the tokenizer does not have serves another model.
    code, out, _ = asyncio.run(doctor_against(FakeVLLM(reply_outside_the_vocabulary), []))
    assert code == 1 and "sampled id 200000, outside the tokenizer's 151669 ids" in out
    # Nothing listening.
    code, out = doctor(["--engine", f"sglang://127.0.0.1:{free_port()}"])
    assert code == 1 and "cannot reach sglang" in line(out, "engine")


def test_doctor_fails_an_engine_that_accepts_and_never_answers_within_its_timeout() -> None:
    """An engine that accepts the connection and reads the request but never answers: the
    engine check fails after `--check-timeout`, the other checks still run."""

    async def go() -> tuple[int, str, float]:
        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read(1 << 16)
            await asyncio.sleep(3600)

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        started = time.monotonic()
        try:
            argv = ["--engine", f"sglang://127.0.0.1:{port}", "--check-timeout", "1"]
            code, out = await asyncio.to_thread(doctor, argv)
        finally:
            server.close()
        return code, out, time.monotonic() - started

    code, out, took = asyncio.run(go())
    assert code == 1
    engine = line(out, "engine")
    assert engine.startswith("FAIL") and "no answer to a one-token generation within 1 s" in engine
    assert line(out, "template").startswith("ok")
    assert took < 30


def test_doctor_reports_a_journal_path_that_is_no_sqlite_file(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a database")
    (tmp_path / "empty.sqlite").write_bytes(b"")
    for path, verdict, says in (
        ("/proc/self/mem", "FAIL", "cannot be read"),
        ("/proc/self/status", "FAIL", "is not a SQLite database"),
        ("/dev/null", "FAIL", "is not a regular file"),
        (str(tmp_path / "notes.txt"), "FAIL", "is not a SQLite database"),
        (str(tmp_path / "empty.sqlite"), "ok", "writable"),
        (str(tmp_path / "new.sqlite"), "ok", "will be created"),
    ):
        check = check_journal(path)
        assert check.verdict.value == verdict and says in check.detail, (path, check)


# --- ranges --------------------------------------------------------------------------------------


def exit_code(argv: list[str]) -> int:
    """`tokentrail serve` run with `argv` until it would load anything: its exit code (argparse
    exits 2 itself for a bad flag)."""
    try:
        return cli.main(["serve", *argv])
    except SystemExit as exc:
        return int(exc.code or 0)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--max-body-bytes", "-1"], "--max-body-bytes: -1 is out of range; allowed: 0 bytes or"),
        (["--engine-timeout", "nan"], "--engine-timeout: nan is out of range; allowed: 0.001 to"),
        (["--engine-timeout", "inf"], "--engine-timeout: inf is out of range"),
        (["--keepalive", "-1"], "--keepalive: -1 is out of range; allowed: 0.01 to"),
        (["--max-image-pixels", "-5"], "--max-image-pixels: -5 is out of range; allowed: 0 pix"),
        (["--workers", "100000"], "--workers: 100000 is out of range; allowed: 0 to 256"),
        (["--port", "99999"], "--port: 99999 is out of range; allowed: 0 to 65535"),
        (["--port", "-1"], "--port: -1 is out of range; allowed: 0 to 65535"),
        (["--max-header-bytes", "10"], "--max-header-bytes: 10 is out of range; allowed: 1024"),
    ],
)
def test_a_setting_out_of_its_range_exits_2_naming_it_and_the_range(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert exit_code(argv) == 2
    assert says in capsys.readouterr().err


def test_a_variable_or_config_key_out_of_range_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "serve.toml"
    config.write_text("body-timeout = nan\n")
    assert exit_code(["--config", str(config)]) == 2
    assert f"--config {config}: body-timeout: nan is out of range" in capsys.readouterr().err
    monkeypatch.setenv("TOKENTRAIL_WORKERS", "-3")
    assert exit_code([]) == 2
    assert "TOKENTRAIL_WORKERS: -3 is out of range; allowed: 0 to 256" in capsys.readouterr().err


def test_a_port_in_use_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert exit_code(["--host", "127.0.0.1", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"tokentrail serve: --port {port}: cannot listen on 127.0.0.1:{port}" in err
    assert "Traceback" not in err
