"""The container and Kubernetes files (Dockerfile, compose.yaml, deploy/kubernetes/): every YAML
file parses; every ``konduit`` command line in them (a container's command or args, a probe, a
health check, the image's ENTRYPOINT + CMD) is one the CLI accepts, parsed by the CLI's own
command tree (subcommands, flags, their values); every ``KONDUIT_*`` variable they set is a
setting; every metric an autoscaler queries is exported; the stop grace covers the worker's
drain; and KEDA's PostgreSQL scaler's queries answer what the exported gauges say, on a real
database. ``.ci/run`` builds the image itself (deploy/container/build-local.sh)."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

import konduit
from konduit.cli import command_tree
from konduit.observe.metrics import serve
from konduit.settings import Settings, variable
from konduit.worker.config import WorkerConfig
from tests.test_metrics import scrape

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "compose.yaml"
KUBERNETES = ROOT / "deploy" / "kubernetes"
KEDA_PROMETHEUS = KUBERNETES / "keda" / "scaledobject-prometheus.yaml"
KEDA_POSTGRESQL = KUBERNETES / "keda" / "scaledobject-postgresql.yaml"
YAML_FILES = [COMPOSE, *sorted(KUBERNETES.rglob("*.yaml"))]
WORKER_DEPLOYMENT = "konduit-worker-default"
# Time to record what finished and hand the rest back after the drain, before a SIGKILL (the
# systemd unit's TimeoutStopSec keeps the same margin: tests/test_deploy.py).
STOP_MARGIN = 10.0


def documents(path: Path) -> list[dict[str, Any]]:
    found = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert found and all(isinstance(d, dict) for d in found), path
    return found


def kubernetes_objects() -> list[tuple[Path, dict[str, Any]]]:
    return [(p, d) for p in YAML_FILES if p != COMPOSE for d in documents(p)]


def pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    for _, obj in kubernetes_objects():
        if obj["kind"] in ("Deployment", "Job"):
            yield obj["metadata"]["name"], obj["spec"]["template"]["spec"]


# -- konduit command lines -----------------------------------------------------------------------


def konduit_argv(command: list[str]) -> list[str] | None:
    """The arguments after ``konduit`` of a command line that runs it, else None."""
    return [str(a) for a in command[1:]] if command and command[0] == "konduit" else None


def compose_command_lines() -> Iterator[tuple[str, list[str]]]:
    [compose] = documents(COMPOSE)
    for name, service in compose["services"].items():
        if not str(service.get("image", "")).startswith("konduit"):
            continue
        yield f"compose {name}", [str(a) for a in service["command"]]  # the entrypoint's args
        test = service.get("healthcheck", {}).get("test")
        if test:
            assert test[0] == "CMD", (name, test)
            argv = konduit_argv(test[1:])
            assert argv is not None, (name, test)
            yield f"compose {name} healthcheck", argv


def kubernetes_command_lines() -> Iterator[tuple[str, list[str]]]:
    for name, spec in pod_specs():
        for container in spec.get("initContainers", []) + spec["containers"]:
            where = f"{name}/{container['name']}"
            if "command" in container:
                argv = konduit_argv(container["command"])
                assert argv is not None, (where, container["command"])
                yield where, argv + [str(a) for a in container.get("args", [])]
            else:  # the image's entrypoint: konduit
                yield where, [str(a) for a in container["args"]]
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                run = container.get(probe, {}).get("exec")
                if run:
                    argv = konduit_argv(run["command"])
                    assert argv is not None, (where, probe, run)
                    yield f"{where} {probe}", argv


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) of each instruction, continuation lines joined, comments dropped."""
    lines = [line for line in DOCKERFILE.read_text().splitlines()
             if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    found = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def dockerfile_exec_form(instruction: str) -> list[str]:
    [rest] = [r for i, r in dockerfile_instructions() if i == instruction]
    if instruction == "HEALTHCHECK":
        rest = rest[rest.index(" CMD ") + len(" CMD "):]
    value = json.loads(rest)  # exec form: no shell between the signal and the process
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), (instruction, rest)
    return value


def dockerfile_command_lines() -> Iterator[tuple[str, list[str]]]:
    entrypoint = dockerfile_exec_form("ENTRYPOINT")
    assert entrypoint == ["konduit"]
    yield "Dockerfile ENTRYPOINT + CMD", dockerfile_exec_form("CMD")
    health = konduit_argv(dockerfile_exec_form("HEALTHCHECK"))
    assert health is not None
    yield "Dockerfile HEALTHCHECK", health


def every_command_line() -> list[tuple[str, list[str]]]:
    return [*dockerfile_command_lines(), *compose_command_lines(), *kubernetes_command_lines()]


def check_command_line(argv: list[str]) -> None:
    """Parse ``konduit ARGV`` with the CLI's command tree, as running it would, without running
    it: an unknown subcommand or flag, a flag without its value or a value of the wrong type
    raises."""
    node, path, rest = command_tree(), ["konduit"], list(argv)
    while getattr(node, "commands", None) and rest and rest[0] in node.commands:
        path.append(rest[0])
        node = node.commands[rest.pop(0)]
    if getattr(node, "commands", None):  # a group: only its own flags (--help, --version)
        flags = {o for p in node.params for o in p.opts} | {"--help"}
        assert rest and all(a in flags for a in rest), f"{' '.join(path)} {rest}: no such command"
        return
    node.make_context(" ".join(path), rest)


def test_every_yaml_file_parses() -> None:
    assert COMPOSE in YAML_FILES and KEDA_POSTGRESQL in YAML_FILES and len(YAML_FILES) >= 7
    kinds = {obj["kind"] for _, obj in kubernetes_objects()}
    assert {"Secret", "ConfigMap", "Job", "Deployment", "Service", "PodDisruptionBudget",
            "ScaledObject"} <= kinds


def test_every_konduit_command_line_is_one_the_cli_accepts() -> None:
    lines = every_command_line()
    commands = {argv[0] for _, argv in lines if argv}
    assert {"worker", "dashboard", "db", "health", "metrics", "--help"} <= commands, commands
    for where, argv in lines:
        try:
            check_command_line(argv)
        except Exception as exc:
            pytest.fail(f"{where}: konduit {' '.join(argv)}: {exc}")


@pytest.mark.parametrize("argv", [["worker", "app:app", "--queues", "default"],
                                  ["worker", "app:app", "--concurrency", "many"],
                                  ["worker", "--concurrency", "4"],
                                  ["db", "upgrade"], ["health", "--workers"]])
def test_the_command_line_check_catches_a_wrong_one(argv: list[str]) -> None:
    with pytest.raises(Exception):  # noqa: B017 - click's usage errors, from typer's copy or not
        check_command_line(argv)


def test_every_konduit_variable_is_a_setting() -> None:
    settings = {variable(field) for field in Settings.model_fields}
    texts = {p.name: p.read_text() for p in [DOCKERFILE, *YAML_FILES]}
    used = {(name, v) for name, text in texts.items() for v in re.findall(r"KONDUIT_[A-Z_]+", text)}
    assert {v for _, v in used} >= {"KONDUIT_DATABASE_URL", "KONDUIT_API_TOKEN"}
    assert not {(n, v) for n, v in used if v not in settings}, sorted(used)


def test_the_stop_grace_covers_the_workers_drain() -> None:
    default = WorkerConfig.__dataclass_fields__["shutdown_grace"].default

    def drain(argv: list[str]) -> float:
        return float(argv[argv.index("--shutdown-grace") + 1]) if "--shutdown-grace" in argv \
            else float(default)

    workers = [(where, argv) for where, argv in every_command_line() if argv[:1] == ["worker"]]
    assert len(workers) == 2, workers
    [spec] = [s for name, s in pod_specs() if name == WORKER_DEPLOYMENT]
    [(_, argv)] = [w for w in workers if w[0].startswith(WORKER_DEPLOYMENT)]
    assert spec["terminationGracePeriodSeconds"] >= drain(argv) + STOP_MARGIN
    [compose] = documents(COMPOSE)
    service = compose["services"]["worker"]
    stop = float(service["stop_grace_period"].removesuffix("s"))
    assert stop >= drain([str(a) for a in service["command"]]) + STOP_MARGIN


def test_compose_migrates_before_anything_else_starts() -> None:
    [compose] = documents(COMPOSE)
    services = compose["services"]
    assert services["migrate"]["command"] == ["db", "migrate"]
    assert services["migrate"]["restart"] == "no"
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("worker", "dashboard"):
        assert services[name]["depends_on"]["migrate"]["condition"] == \
            "service_completed_successfully", name
        assert services[name]["environment"]["KONDUIT_DATABASE_URL"], name
    assert services["worker"]["deploy"]["replicas"] >= 2
    # The dashboard listens on every interface: only behind a token, which compose requires.
    assert "${KONDUIT_API_TOKEN:?" in services["dashboard"]["environment"]["KONDUIT_API_TOKEN"]


def test_the_pods_run_as_the_images_non_root_user() -> None:
    user = [r for i, r in dockerfile_instructions() if i == "USER"]
    assert user == ["10001:10001"]
    for name, spec in pod_specs():
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["runAsUser"] == 10001, name
        for container in spec["containers"]:
            assert container["securityContext"]["allowPrivilegeEscalation"] is False, name
            assert container["securityContext"]["readOnlyRootFilesystem"] is True, name


def test_the_dockerfile_builds_the_wheel_in_a_stage_and_installs_it_in_a_slim_one() -> None:
    instructions = dockerfile_instructions()
    stages = [r for i, r in instructions if i == "FROM"]
    assert stages == ["${BASE} AS build", "${BASE}"], stages
    args = [r for i, r in instructions if i == "ARG"]
    assert "BASE=python:3.11-slim" in args
    build = " ".join(r for i, r in instructions if i == "RUN")
    assert "pip wheel" in build and "konduit_pg-*.whl" in build
    assert ["--from=build", "/opt/konduit/venv", "/opt/konduit/venv"] in \
        [r.split() for i, r in instructions if i == "COPY"]
    # Only what the wheel is built from goes into the build context.
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in ignored and "!src/" in ignored


# -- the autoscalers ------------------------------------------------------------------------------


def scaled_objects() -> dict[Path, dict[str, Any]]:
    return {p: d for p in (KEDA_PROMETHEUS, KEDA_POSTGRESQL) for d in documents(p)
            if d["kind"] == "ScaledObject"}


def test_the_scaled_objects_target_the_worker_deployment_and_read_its_url() -> None:
    [worker] = [s for n, s in pod_specs() if n == WORKER_DEPLOYMENT]
    env = {e["name"] for e in worker["containers"][0]["env"]}
    for path, scaled in scaled_objects().items():
        assert scaled["spec"]["scaleTargetRef"]["name"] == WORKER_DEPLOYMENT, path
        for trigger in scaled["spec"]["triggers"]:
            source = trigger["metadata"].get("connectionFromEnv")
            if trigger["type"] == "postgresql":
                # KEDA resolves it in the target container's env (a named variable).
                assert source in env, (path, source)


def test_the_prometheus_scaled_object_is_the_one_docs_scaling_shows() -> None:
    text = (ROOT / "docs" / "scaling.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)
    [shown] = [yaml.safe_load(b) for b in blocks if "kind: ScaledObject" in b]
    assert scaled_objects()[KEDA_PROMETHEUS]["spec"] == shown["spec"]


def queried_metrics() -> set[str]:
    found: set[str] = set()
    for scaled in scaled_objects().values():
        for trigger in scaled["spec"]["triggers"]:
            if trigger["type"] == "prometheus":
                found |= set(re.findall(r"\bkonduit_[a-z_]+", trigger["metadata"]["query"]))
    return found


def postgresql_queries() -> dict[str, str]:
    return {t["name"]: t["metadata"]["query"]
            for t in scaled_objects()[KEDA_POSTGRESQL]["spec"]["triggers"]
            if t["type"] == "postgresql"}


def queue_workflow(name: str, queue: str) -> konduit.Workflow:
    wf = konduit.Workflow(name, version=1)

    @wf.step(queue=queue)
    def work(ctx: konduit.Context) -> None:
        return None

    return wf


@pytest.mark.storage
def test_the_postgresql_scaler_answers_what_the_exported_gauges_say(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    """KEDA's PostgreSQL scaler (no Prometheus) and the Prometheus one read the same numbers:
    the ready backlog of queue "default" summed over its workflows, and its oldest ready task's
    age, with tasks of another queue and tasks not due yet left out."""
    queries = postgresql_queries()
    assert set(queries) == {"ready-tasks", "oldest-ready-age"}

    def scaler(name: str) -> int:
        with psycopg.connect(db_url) as conn:
            [(answer,)] = conn.execute(queries[name]).fetchall()
        assert isinstance(answer, int), (name, answer)  # KEDA reads an integer
        return answer

    def gauges() -> tuple[float, float, set[str]]:
        with serve(db_url, port=0) as exporter:
            samples = scrape(exporter.url)
        ready = sum(s.value for s in samples["konduit_queue_ready_tasks"]
                    if s.labels["queue"] == "default")
        oldest = max([s.value for s in samples["konduit_queue_oldest_ready_age_seconds"]
                      if s.labels["queue"] == "default"], default=0.0)
        return ready, oldest, set(samples)

    assert (scaler("ready-tasks"), scaler("oldest-ready-age")) == (0, 0)  # nothing ready
    app = make_app(queue_workflow("scaled-a", "default"), queue_workflow("scaled-b", "default"),
                   queue_workflow("scaled-bulk", "bulk"))
    for i in range(5):
        app.start("scaled-a", i)
    for i in range(3):
        app.start("scaled-b", i)
    for i in range(4):
        app.start("scaled-bulk", i)  # another queue: not this Deployment's backlog
    later = app.start("scaled-b", 99)
    with psycopg.connect(db_url) as conn:
        # One not due for an hour (a retry's backoff): no worker can take it yet.
        conn.execute("UPDATE konduit_tasks SET run_at = now() + interval '1 hour' "
                     "WHERE execution_id = %s", (later.id,))
        # The oldest waited 100 s.
        conn.execute("UPDATE konduit_tasks SET run_at = now() - interval '100 seconds' "
                     "WHERE id = (SELECT id FROM konduit_tasks WHERE workflow LIKE 'scaled-a@%%' "
                     "ORDER BY run_at, id LIMIT 1)")

    ready, oldest, exported = gauges()
    assert queried_metrics() <= exported, queried_metrics() - exported
    assert ready == 8
    assert scaler("ready-tasks") == ready
    began = time.monotonic()
    age = scaler("oldest-ready-age")
    assert 100 <= oldest < 160
    # Whole seconds, read a moment apart from the gauge.
    assert math.floor(oldest) - 1 <= age <= math.floor(oldest) + 1 + (time.monotonic() - began)


def test_the_prometheus_queries_name_exported_metrics_only() -> None:
    # Checked against a real scrape in the test above; here, that the queries name the queue
    # gauges the PostgreSQL variant mirrors.
    assert queried_metrics() == {"konduit_queue_ready_tasks",
                                 "konduit_queue_oldest_ready_age_seconds"}
