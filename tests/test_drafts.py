"""``targets.drafts``: one table of drafter kinds, a spec read once at the door."""

from dataclasses import replace

import pytest

from mlxspec.core.drafters import TRAITS, trait
from mlxspec.errors import MlxspecError
from mlxspec.flags import DraftOpt
from mlxspec.targets import drafts
from mlxspec.targets.drafts import KINDS, DraftSpec, branching_kinds, make_drafter, parse_draft


@pytest.mark.parametrize("spec, kind, arg", [
    ("ngram", "ngram", 3), ("ngram:5", "ngram", 5), ("suffix", "suffix", 8), ("suffix:4", "suffix", 4),
    ("self:8", "self", 8), ("none", "none", None), ("", "none", None), ("default", "default", None),
])
def test_a_spec_is_read_into_its_kind(spec, kind, arg):
    parsed = parse_draft(spec)
    assert (parsed.kind, parsed.arg, parsed.text) == (kind, arg, spec)


def test_shipped_drafts_are_read_as_their_kind():
    assert parse_draft("smollm2-135m-eagle").kind == "eagle"
    assert parse_draft("smollm2-135m-eagle3").kind == "eagle3"
    assert parse_draft("smollm2-135m-draft").kind == "trained"
    cascade = parse_draft("ngram:3+smollm2-135m-eagle")
    assert cascade.kind == "cascade" and [p.kind for p in cascade.parts] == ["ngram", "eagle"]


@pytest.mark.parametrize("spec, pattern", [
    ("ngram:x", r"expected ngram:N with N an integer"), ("self", r"expected self:L"),
    ("ngram:3+none", r"every part of a cascade"), ("no-such-drafter", r"unknown drafter 'no-such-drafter': not one of"),
])
def test_a_bad_spec_is_one_error_naming_what_it_could_be(spec, pattern):
    with pytest.raises(MlxspecError, match=pattern) as e:
        parse_draft(spec)
    assert "\n" not in str(e.value)


def test_every_kind_has_a_reader_makers_and_help_and_the_help_names_it():
    names = [k.name for k in KINDS]
    assert len(names) == len(set(names))
    for k in KINDS:
        assert callable(k.read) and callable(k.make) and callable(k.twin) and k.help and k.syntax
        assert k.syntax in DraftOpt.help, f"--draft's help does not name {k.syntax}"
    assert branching_kinds().count(",") == sum(k.branches for k in KINDS) - 1


def test_the_disk_is_read_once_at_the_door(monkeypatch):
    """Making the drafter from a parsed spec probes no file again: the spec's kind and folder
    were settled when it was read."""
    parsed = parse_draft("smollm2-135m-eagle")
    probes = []
    monkeypatch.setattr(drafts, "find_head", lambda spec: probes.append(spec))
    monkeypatch.setattr(drafts, "find_draft", lambda spec: probes.append(spec))
    made = []
    monkeypatch.setattr(drafts, "KINDS", tuple(k if k.name != "eagle" else replace(k, make=lambda *a: made.append(a) or "head")
                                               for k in KINDS))
    assert make_drafter(parsed, type("T", (), {"backend": "mlx"})()) == "head"
    assert not probes and made[0][0] == parsed.arg and made[0][1] == "smollm2-135m-eagle"


def test_weightless_kinds_are_made_without_a_model():
    assert make_drafter("ngram:4", object()).name == "ngram:4"
    assert make_drafter(DraftSpec("suffix", 6, "suffix:6"), object()).name.startswith("suffix")
    assert make_drafter("none", object()) is None


def test_traits_default_to_the_most_restricted_drafter():
    class Bare:
        name = "bare"

    assert {n: trait(Bare(), n) for n in TRAITS} == TRAITS
    assert trait(make_drafter("ngram:3", object()), "draft_prior_ratio") == 0.01
    assert trait(make_drafter("ngram:3", object()), "commits_any") is True
