import pytest

from mlxspec.errors import MlxspecError
from mlxspec.serve.access import Access, parse_origins


def test_the_key_is_asked_for_everywhere_but_health_and_preflights():
    a = Access("sekret")
    assert a.allows("GET", "/v1/models", "Bearer sekret") and a.allows("POST", "/v1/completions", "bearer  sekret")
    assert not a.allows("GET", "/v1/models", None) and not a.allows("GET", "/v1/models", "Bearer sekre")
    assert not a.allows("GET", "/v1/models", "sekret") and not a.allows("GET", "/v1/models", "Basic sekret")
    assert a.allows("GET", "/health", None) and a.allows("OPTIONS", "/v1/chat/completions", None)
    assert Access().allows("POST", "/v1/chat/completions", None)  # no key: open, as before


def test_cors_headers_only_for_allowed_origins():
    a = Access(origins=("http://localhost:3000",))
    assert a.cors_headers("http://evil.example", False, None) == {} and a.cors_headers(None, True, None) == {}
    plain = a.cors_headers("http://localhost:3000", False, None)
    assert plain == {"Access-Control-Allow-Origin": "http://localhost:3000", "Vary": "Origin"}
    pre = a.cors_headers("http://localhost:3000", True, "authorization, content-type, x-stainless-os")
    assert "POST" in pre["Access-Control-Allow-Methods"] and "x-stainless-os" in pre["Access-Control-Allow-Headers"]
    assert Access(origins=("*",)).cors_headers("https://any.where", False, None)["Access-Control-Allow-Origin"] == \
        "https://any.where"


def test_origins_parse_from_repeats_and_commas():
    assert parse_origins(["http://a.test/, https://b.test", "*"]) == ("http://a.test", "https://b.test", "*")
    assert parse_origins(None) == ()
    with pytest.raises(MlxspecError, match="takes origins such as"):
        parse_origins(["localhost:3000"])
