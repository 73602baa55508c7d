"""Deployment files: Docker cannot run here, so parse them and check that they agree with each
other and with voxgate (ports, probe paths, mounted files, settings names and values)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.runtime.settings import Settings, SettingsError

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"


# What an operator puts in deploy/.env (compose) or the Secret voxgate-secrets (Kubernetes).
SECRETS = {"REDIS_PASSWORD": "0123456789abcdef" * 2, "VOXGATE_CACHE_SECRET": "fedcba9876543210" * 2}


def interpolate(text: str, values: dict[str, str]) -> str:
    """Compose's variable interpolation: ``${NAME}``, ``${NAME:?message}`` (required) and
    ``$$`` (a literal ``$``). A required variable without a value fails, as compose does."""

    def one(m: re.Match[str]) -> str:
        if m[0] == "$$":
            return "$"
        if m[1] not in values:
            raise KeyError(f"compose needs {m[1]}: {m[2]}")
        return values[m[1]]

    return re.sub(r"\$\$|\$\{(\w+)(?::\?([^}]*))?\}", one, text)


def compose(values: dict[str, str] = SECRETS) -> dict[str, Any]:
    text = interpolate((DEPLOY / "compose.yaml").read_text(), values)
    return dict(yaml.safe_load(text))


def container_env(container: dict[str, Any], secrets: dict[str, str]) -> dict[str, str]:
    """A container's environment as Kubernetes makes it: ``secretKeyRef`` values from
    ``secrets`` (by key), ``$(NAME)`` expanded from the variables defined before it."""
    env: dict[str, str] = {}
    for e in container.get("env", []):
        if "valueFrom" in e:
            env[e["name"]] = secrets[e["valueFrom"]["secretKeyRef"]["key"]]
        else:
            env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], e["value"])
    return env


K8S_SECRETS = {
    "redis-password": SECRETS["REDIS_PASSWORD"],
    "cache-secret": SECRETS["VOXGATE_CACHE_SECRET"],
}


def k8s_docs() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    for name in kustomization["resources"]:
        docs.extend(d for d in yaml.safe_load_all((K8S / name).read_text()) if d)
    return docs


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}"
    return matches[0]


def voxgate_env(env: dict[str, str]) -> dict[str, str]:
    """The VOXGATE_* variables that name a setting (others, e.g. another part's, are kept out
    only while no setting of that name exists: Settings ignores unknown env names)."""
    known = {f"VOXGATE_{n.upper()}" for n in Settings.names()}
    return {k: v for k, v in env.items() if k in known}


def mount_source(volume: str) -> tuple[Path, str]:
    src, target = volume.split(":")[:2]
    return (DEPLOY / src).resolve(), target


def test_dockerfile_matches_the_settings() -> None:
    text = (ROOT / "Dockerfile").read_text()
    env = dict(re.findall(r"(VOXGATE_[A-Z_]+)=(\S+)", text))
    settings = Settings.load(env=env)  # every value is valid
    assert settings.host == "0.0.0.0"
    assert re.search(rf"^EXPOSE {settings.port}$", text, re.M)
    assert f"127.0.0.1:{settings.port}/healthz" in text
    assert re.search(r'^ENTRYPOINT \["voxgate"\]$', text, re.M)
    assert re.search(r'^CMD \["serve"\]$', text, re.M)
    assert "STOPSIGNAL SIGTERM" in text
    for src in re.findall(r"^COPY (\S+) \./", text, re.M):
        if src != "README.md":  # written at the top level by the project's README task
            assert (ROOT / src).exists(), src
    assert str(settings.cache_dir) in re.findall(r'VOLUME \["([^"]+)"\]', text)


def dockerfile_pip_install(build_args: dict[str, str]) -> list[str]:
    """The arguments the Dockerfile's ``RUN pip install`` passes to pip, under ``build_args``
    (``docker build --build-arg``), expanded by a real ``sh`` as ``RUN`` would."""
    text = (ROOT / "Dockerfile").read_text()
    found = re.findall(r'^ARG (\w+)=(?:"([^"]*)"|(\S*))$', text, re.M)
    args = {name: quoted or bare for name, quoted, bare in found}
    args.update(build_args)
    m = re.search(r"^RUN (pip install [^\n]*?)(?: \\)?$", text, re.M)
    assert m is not None, "the Dockerfile installs voxgate with one `RUN pip install` line"
    script = 'pip() { printf "%s\\n" "$@"; }\n' + m.group(1)
    out = subprocess.run(
        ["sh", "-c", script],
        env={"PATH": os.defpath, **args},
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return out.stdout.splitlines()


def test_dockerfile_builds_slim_by_default_and_coqui_with_a_build_arg() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    # slim: the base install, no torch and no torch index (pip would ask it for every package)
    assert dockerfile_pip_install({}) == ["install", "."]
    assert not any(
        d.split("=")[0].startswith(("torch", "coqui")) for d in pyproject["project"]["dependencies"]
    )
    coqui = dockerfile_pip_install({"EXTRAS": "coqui"})
    assert coqui[-1] == ".[coqui]"
    assert coqui[1:3] == ["--extra-index-url", "https://download.pytorch.org/whl/cpu"]
    assert any(d.startswith("torch==") for d in extras["coqui"])
    assert any(d.startswith("coqui-tts==") for d in extras["coqui"])


def test_compose_services_ports_and_settings() -> None:
    c = compose()
    services = c["services"]
    assert set(services) == {"voxgate", "redis", "prometheus", "grafana"}
    vox = services["voxgate"]
    assert (DEPLOY / vox["build"]["context"] / vox["build"]["dockerfile"]).is_file()
    env = {k: str(v) for k, v in vox["environment"].items()}
    settings = Settings.load(env=voxgate_env(env))
    assert f"{settings.port}:{settings.port}" in vox["ports"]
    assert settings.topology().gateway_processes >= 2
    grace = int(vox["stop_grace_period"].rstrip("s"))
    assert grace > settings.shutdown_timeout_s
    redis_url = env.get("VOXGATE_REDIS_URL", "")
    assert redis_url.startswith(f"redis://:{SECRETS['REDIS_PASSWORD']}@redis:6379")
    assert settings.cache_secret.get_secret_value() == SECRETS["VOXGATE_CACHE_SECRET"]
    assert "redis" in vox["depends_on"]
    # Issue 12: Redis has a password and no published port; both secrets are required.
    redis = services["redis"]
    assert "ports" not in redis
    assert "requirepass" in " ".join(redis["command"])
    assert redis["environment"]["REDIS_PASSWORD"] == SECRETS["REDIS_PASSWORD"]
    for name in SECRETS:
        with pytest.raises(KeyError, match=name):
            compose({k: v for k, v in SECRETS.items() if k != name})
    for volume in vox["volumes"]:
        assert volume.split(":")[0] in c["volumes"]


def test_compose_prometheus_scrapes_voxgate_and_loads_the_alert_rules(tmp_path: Path) -> None:
    c = compose()
    prom = c["services"]["prometheus"]
    mounts = dict(mount_source(v) for v in prom["volumes"] if v.startswith("."))
    by_target = {target: src for src, target in mounts.items()}
    config_src = by_target["/etc/prometheus/prometheus.yml"]
    assert by_target["/etc/prometheus/alerts.yml"] == ROOT / "docs" / "ops" / "alerts.yml"
    config = yaml.safe_load(config_src.read_text())
    job = config["scrape_configs"][0]
    assert job["metrics_path"] == "/metrics"
    vox_port = Settings.load(env=voxgate_env(c["services"]["voxgate"]["environment"])).port
    assert job["static_configs"][0]["targets"] == [f"voxgate:{vox_port}"]
    # Lay the files out as the container sees them and let promtool check config + rules.
    for target, src in by_target.items():
        dest = tmp_path / target.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dest)
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool missing: apt-get install -y prometheus"
    check = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "etc/prometheus/prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS" in check.stdout


def test_compose_grafana_provisions_the_dashboard() -> None:
    c = compose()
    grafana = c["services"]["grafana"]
    by_target = {t: s for s, t in (mount_source(v) for v in grafana["volumes"])}
    provisioning = by_target["/etc/grafana/provisioning"]
    dashboard_path = next(t for t, s in by_target.items() if s.name == "grafana-dashboard.json")
    assert by_target[dashboard_path] == ROOT / "docs" / "ops" / "grafana-dashboard.json"
    providers = yaml.safe_load((provisioning / "dashboards" / "voxgate.yml").read_text())
    assert Path(dashboard_path).parent == Path(providers["providers"][0]["options"]["path"])
    assert grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"] == dashboard_path
    sources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    source = sources["datasources"][0]
    assert source["type"] == "prometheus"
    prom_port = c["services"]["prometheus"]["ports"][0].split(":")[-1]
    assert source["url"] == f"http://prometheus:{prom_port}"
    dashboard = json.loads(by_target[dashboard_path].read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["query"] == source["type"]
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"], panel["title"]


def test_k8s_deployment_probes_service_and_config(tmp_path: Path) -> None:
    docs = k8s_docs()
    deployment = find(docs, "Deployment", "voxgate")
    pod = deployment["spec"]["template"]
    assert (
        deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    )
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["port"] in ports

    # The config file the container is told to read is the ConfigMap's, and it loads.
    args = container["args"]
    assert args[0] == "serve"
    config_path = Path(args[args.index("--config") + 1])
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(config_path.parent))
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
    configmap = find(docs, "ConfigMap", volume["configMap"]["name"])
    toml = configmap["data"][config_path.name]
    env = container_env(container, K8S_SECRETS)
    settings = Settings.load(config_file=_write(toml, tmp_path), env=voxgate_env(env))
    assert ports["http"] == settings.port
    assert settings.host == "0.0.0.0"
    assert any(m["mountPath"] == str(settings.cache_dir) for m in container["volumeMounts"])
    pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["spec"]["terminationGracePeriodSeconds"] > settings.shutdown_timeout_s + pre_stop
    assert pod["spec"]["securityContext"]["runAsUser"] == 10001  # the Dockerfile's user

    service = find(docs, "Service", "voxgate")
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert service["spec"]["ports"][0]["targetPort"] in ports
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/path"] == "/metrics"
    assert int(annotations["prometheus.io/port"]) == settings.port


def test_k8s_redis_matches_the_url_voxgate_uses() -> None:
    docs = k8s_docs()
    container = find(docs, "Deployment", "voxgate")["spec"]["template"]["spec"]["containers"][0]
    env = container_env(container, K8S_SECRETS)
    password = K8S_SECRETS["redis-password"]
    url = env["VOXGATE_REDIS_URL"]
    host, port = re.match(rf"redis://:{password}@([^:/]+):(\d+)/", url).groups()  # type: ignore[union-attr]
    assert Settings.load(env=voxgate_env(env)).cache_secret.get_secret_value()
    service = find(docs, "Service", host)
    assert service["spec"]["ports"][0]["port"] == int(port)
    redis = find(docs, "Deployment", "voxgate-redis")
    pod = redis["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    redis_ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    assert redis_ports[service["spec"]["ports"][0]["targetPort"]] == int(port)
    # Issue 12: Redis asks for the password voxgate's URL carries, and only voxgate reaches it.
    redis_container = pod["spec"]["containers"][0]
    assert container_env(redis_container, K8S_SECRETS)["REDIS_PASSWORD"] == password
    assert "requirepass" in " ".join(redis_container["args"])
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
    policy = find(docs, "NetworkPolicy", "voxgate-redis")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    voxgate_labels = find(docs, "Deployment", "voxgate")["spec"]["template"]["metadata"]["labels"]
    (rule,) = policy["spec"]["ingress"]
    (source,) = rule["from"]
    assert source["podSelector"]["matchLabels"].items() <= voxgate_labels.items()


def test_configmap_with_a_bad_value_would_fail_naming_the_key(tmp_path: Path) -> None:
    toml = find(k8s_docs(), "ConfigMap", "voxgate-config")["data"]["voxgate.toml"]
    broken = toml.replace('log_format = "json"', 'log_format = "yaml"')
    assert broken != toml
    with pytest.raises(SettingsError, match="'log_format'"):
        Settings.load(config_file=_write(broken, tmp_path), env={})


def _write(text: str, directory: Path) -> Path:
    path = directory / "voxgate.toml"
    path.write_text(text)
    return path
