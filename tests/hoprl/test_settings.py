"""The ``HOPRL_*`` settings: read on every call, empty means unset, bad values name the variable."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from hoprl.clients.http import api_key
from hoprl.settings import DEFAULT_BROKER_URL, HoprlSettings, get_settings


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in HoprlSettings.model_fields:
        monkeypatch.delenv(f"HOPRL_{name.upper()}", raising=False)


def test_defaults() -> None:
    config = get_settings()
    assert config.api_key is None and config.database_url is None and config.bf16 is None
    assert config.rollout_bf16 is None  # rollouts decode as training does
    assert config.rollout_prefill_bf16 is None  # and prefill as training does
    assert config.runs_dir == Path("runs") and config.fanout_timeout == 3600.0
    assert config.broker_url == DEFAULT_BROKER_URL and config.celery_eager is False


def test_each_call_reads_the_environment_as_it_is_now(monkeypatch: pytest.MonkeyPatch) -> None:
    assert api_key() is None
    monkeypatch.setenv("HOPRL_API_KEY", "k1")
    monkeypatch.setenv("HOPRL_RUNS_DIR", "/tmp/somewhere")
    monkeypatch.setenv("HOPRL_CELERY_EAGER", "1")
    monkeypatch.setenv("HOPRL_BF16", "off")
    config = get_settings()
    assert config.api_key is not None and config.api_key.get_secret_value() == "k1"
    assert "k1" not in repr(config)  # secrets stay out of logs
    assert config.runs_dir == Path("/tmp/somewhere") and config.celery_eager and config.bf16 is False
    assert api_key() == "k1" and api_key("") is None and api_key("other") == "other"


def test_an_empty_variable_is_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOPRL_API_KEY", "")
    monkeypatch.setenv("HOPRL_RUNS_DIR", "")
    monkeypatch.setenv("HOPRL_CELERY_BROKER_URL", "")
    config = get_settings()
    assert config.api_key is None and config.runs_dir == Path("runs")
    assert config.broker_url == DEFAULT_BROKER_URL


def test_the_cache_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert get_settings().cache_dir == tmp_path / "xdg" / "hoprl"
    monkeypatch.setenv("HOPRL_CACHE", str(tmp_path / "mine"))
    assert get_settings().cache_dir == tmp_path / "mine"


@pytest.mark.parametrize(("name", "value"), [("HOPRL_FANOUT_TIMEOUT", "0"), ("HOPRL_TORCH_THREADS", "x")])
def test_a_bad_value_names_the_variable(name: str, value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match=name.removeprefix("HOPRL_").lower()):
        get_settings()
