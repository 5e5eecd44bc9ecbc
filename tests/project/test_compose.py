"""docker-compose.yml: the services a deployment needs, running commands that exist."""

from pathlib import Path

import yaml
from click.testing import CliRunner

from relstream.cli import main

REPO = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())


def cli_accepts(argv: list[str]) -> None:
    """The relstream command and every option it is given exist (checked via --help)."""
    assert argv[0] == "relstream"
    command = main.commands[argv[1]]
    known = {opt for param in command.params for opt in param.opts}
    given = {word for word in argv[2:] if word.startswith("--")}
    assert given <= known, given - known
    assert CliRunner().invoke(main, [argv[1], "--help"]).exit_code == 0


def test_services_and_their_wiring():
    services = COMPOSE["services"]
    assert {"kafka", "topics", "worker", "engine", "prometheus"} <= set(services)
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert "broker,controller" in services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"]  # KRaft
    assert services["prometheus"]["profiles"] == ["monitoring"]
    gpu = services["engine"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["capabilities"] == ["gpu"]
    for name in ("worker", "engine"):
        assert (
            services[name]["depends_on"]["topics"]["condition"] == "service_completed_successfully"
        )


def test_commands_exist_in_the_cli():
    for name in ("worker", "engine"):
        cli_accepts(COMPOSE["services"][name]["command"])


def test_topic_script_matches_the_topic_layout():
    from relstream.kafka.clients.topics import Topics

    script = (REPO / "deploy" / "create-topics.sh").read_text()
    for topic, partitions in Topics().layout().items():
        assert f"create {topic} {partitions}" in script


def test_deploy_files_exist():
    for path in (
        "deploy/Dockerfile.worker",
        "deploy/Dockerfile.engine",
        "deploy/queries.toml",
        "deploy/prometheus.yml",
    ):
        assert (REPO / path).exists(), path
    from relstream.stream.registrations import load_registrations

    assert load_registrations(REPO / "deploy" / "queries.toml")[0].table == "reviews"


def test_the_engine_model_is_a_hub_id_or_a_mounted_folder_and_the_context_is_lean():
    engine = COMPOSE["services"]["engine"]
    command = engine["command"]
    model = command[command.index("--model") + 1]
    assert model.startswith("${RELSTREAM_MODEL:-") and "/" in model  # a Hub id by default
    assert "hf-cache:/root/.cache/huggingface" in engine["volumes"]
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".venv*", ".git", "models", "docs/benchmarks"} <= set(ignored)


def test_the_worker_and_the_engine_say_when_they_are_ready():
    # Both by their ready files (relstream.ready), as the launcher and the tests wait.
    for service in (COMPOSE["services"]["worker"], COMPOSE["services"]["engine"]):
        ready_file = service["command"][service["command"].index("--ready-file") + 1]
        assert service["healthcheck"]["test"] == ["CMD", "test", "-f", ready_file]
    engine = COMPOSE["services"]["engine"]
    port = engine["command"][engine["command"].index("--metrics-port") + 1]
    assert engine["ports"] == [port]  # published on an ephemeral host port per replica


def test_prometheus_scrapes_every_engine_replica():
    engine = COMPOSE["services"]["engine"]["command"]
    scrape = yaml.safe_load((REPO / "deploy" / "prometheus.yml").read_text())
    (job,) = scrape["scrape_configs"]
    (discovery,) = job["dns_sd_configs"]  # one address per replica, not one fixed target
    assert discovery["names"] == ["engine"] and discovery["type"] == "A"
    assert str(discovery["port"]) == engine[engine.index("--metrics-port") + 1]


def test_the_engine_image_says_which_vllm_it_runs_and_the_gpu_extra_admits_it():
    import re
    import tomllib

    dockerfile = (REPO / "deploy" / "Dockerfile.engine").read_text()
    (version,) = re.findall(r"^FROM vllm/vllm-openai:v(\d+\.\d+\.\d+)$", dockerfile, re.M)
    comment = " ".join(line for line in dockerfile.splitlines() if line.startswith("#"))
    assert f"vLLM {version}" in comment
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (vllm,) = [r for r in project["optional-dependencies"]["gpu"] if r.startswith("vllm")]
    low, high = re.fullmatch(r"vllm>=([\d.]+),<([\d.]+)", vllm).groups()
    as_tuple = lambda v: tuple(int(p) for p in v.split("."))  # noqa: E731
    assert as_tuple(low) <= as_tuple(version) < as_tuple(high)
