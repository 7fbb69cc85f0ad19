"""The base of every service's settings: an unknown variable with the service's prefix fails.

pydantic-settings reads only the environment variables that name a field, so ``extra="forbid"``
never sees a misspelt one: ``POLICY_MAX_TOKEN=8`` (for ``POLICY_MAX_TOKENS``) would be ignored
and the service would start with the default. :class:`ServiceSettings` checks the environment
when a settings object is made, and an unknown ``<PREFIX>_*`` variable is an error naming it, the
closest valid name and every valid one::

    class RetrieverSettings(ServiceSettings):
        model_config = SettingsConfigDict(env_prefix="RETRIEVER_", extra="forbid")
"""

from __future__ import annotations

import difflib
import os
from typing import Any

from pydantic import model_validator
from pydantic_settings import BaseSettings, EnvSettingsSource


def environment_names(settings_cls: type[BaseSettings]) -> set[str]:
    """Every environment variable ``settings_cls`` reads (upper case), aliases included.

    The names come from pydantic-settings' own environment source, so they follow its rules
    (prefix, ``validation_alias``, ``AliasChoices``) rather than a copy of them.
    """
    source = EnvSettingsSource(settings_cls)
    return {
        env_name.upper()
        for name, field in settings_cls.model_fields.items()
        for _, env_name, _ in source._extract_field_info(field, name)
    }


def unknown_environment(
    settings_cls: type[BaseSettings], environ: dict[str, str] | None = None
) -> str | None:
    """A message naming the unknown ``<prefix>*`` variables in ``environ`` (default: os.environ), or None."""
    prefix = str(settings_cls.model_config.get("env_prefix") or "").upper()
    if not prefix:
        return None
    known = environment_names(settings_cls)
    env = os.environ if environ is None else environ
    unknown = sorted(k for k in env if k.upper().startswith(prefix) and k.upper() not in known)
    if not unknown:
        return None
    valid = sorted(k for k in known if k.startswith(prefix))
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name.upper(), valid, n=1, cutoff=0.8)
        hints.append(f"{name} (did you mean {close[0]}?)" if close else name)
    return (
        f"unknown environment variable{'s' if len(unknown) > 1 else ''} {', '.join(hints)}: "
        f"{settings_cls.__name__} reads only {', '.join(valid)}; unset or rename it"
    )


class ServiceSettings(BaseSettings):
    """``BaseSettings`` that refuses unknown environment variables with its ``env_prefix``."""

    @model_validator(mode="before")
    @classmethod
    def _known_environment(cls, data: Any) -> Any:
        problem = unknown_environment(cls)
        if problem:
            raise ValueError(problem)
        return data
