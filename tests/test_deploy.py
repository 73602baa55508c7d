"""Deployment files: Docker cannot run here, so parse them and check that they agree with each
other and with voxgate (ports, probe paths, mounted files, settings names and values)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.runtime.settings import Settings, SettingsError

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"


# What an operator puts in deploy/.env (compose) or the Secret voxgate-secrets (Kubernetes).
SECRETS = {
    "REDIS_PASSWORD": "0123456789abcdef" * 2,
    "VOXGATE_CACHE_SECRET": "fedcba9876543210" * 2,
    "VOXGATE_METRICS_KEY": "abcdef0123456789" * 2,
}
# What the downward API gives a pod.
POD_FIELDS = {"status.podIP": "10.1.2.3", "metadata.namespace": "tts"}


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
    ``secrets`` (by key), ``fieldRef`` values from :data:`POD_FIELDS`, ``$(NAME)`` expanded from
    the variables defined before it."""
    env: dict[str, str] = {}
    for e in container.get("env", []):
        if "fieldRef" in e.get("valueFrom", {}):
            env[e["name"]] = POD_FIELDS[e["valueFrom"]["fieldRef"]["fieldPath"]]
        elif "valueFrom" in e:
            env[e["name"]] = secrets[e["valueFrom"]["secretKeyRef"]["key"]]
        else:
            env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], e["value"])
    return env


K8S_SECRETS = {
    "redis-password": SECRETS["REDIS_PASSWORD"],
    "cache-secret": SECRETS["VOXGATE_CACHE_SECRET"],
    "synthesis-key": "synthesis-key-secret",
}


def image_env() -> dict[str, str]:
    """The ``VOXGATE_*`` variables the Dockerfile sets (``ENV``): every container of the image
    starts with them, below what compose or Kubernetes set."""
    text = (ROOT / "Dockerfile").read_text()
    return dict(re.findall(r"(VOXGATE_[A-Z_]+)=(\S+)", text))


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
    settings = Settings.load(env=image_env())  # every value is valid
    assert settings.host == "0.0.0.0"
    # The health check asks the ops listener, which no flood of the serving port reaches.
    assert settings.ops_port not in (0, settings.port)
    assert re.search(rf"^EXPOSE {settings.port} {settings.ops_port}$", text, re.M)
    assert f"127.0.0.1:{settings.ops_port}/healthz" in text
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
    # Redis has a password and no published port; both secrets are required.
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
    vox = Settings.load(env=voxgate_env(c["services"]["voxgate"]["environment"]))
    assert vox.ops_port not in (0, vox.port)
    assert job["static_configs"][0]["targets"] == [f"voxgate:{vox.ops_port}"]
    check = " ".join(c["services"]["voxgate"]["healthcheck"]["test"])
    assert f"127.0.0.1:{vox.ops_port}/healthz" in check
    # /metrics needs a key: Prometheus sends the one compose mounts from VOXGATE_METRICS_KEY.
    (secret,) = prom["secrets"]
    credentials = Path(config_src).parent / job["authorization"]["credentials_file"]
    assert secret["target"] == "/etc/prometheus/" + credentials.name
    assert c["secrets"][secret["source"]] == {"environment": "VOXGATE_METRICS_KEY"}
    # Lay the files out as the container sees them and let promtool check config + rules.
    for target, src in by_target.items():
        dest = tmp_path / target.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dest)
    (tmp_path / secret["target"].lstrip("/")).write_text(SECRETS["VOXGATE_METRICS_KEY"])
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
    # Probes and scrapes on the ops listener, outside the serving port's connection cap.
    assert ports["ops"] == settings.ops_port != 0
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["port"] == "ops"
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
    assert int(annotations["prometheus.io/port"]) == settings.ops_port


def test_k8s_gateways_call_the_synthesis_hosts_as_an_upstream(tmp_path: Path) -> None:
    """The synthesis Deployment sits behind the gateways' cache: the gateway's upstreams file
    names its Service and port, with a key from the Secret; its pods load their own config and
    answer the host names the gateways send."""
    from urllib.parse import urlsplit

    from synth.upstream import check_config, load_upstreams

    docs = k8s_docs()
    gateway = find(docs, "Deployment", "voxgate")["spec"]["template"]["spec"]
    (container,) = gateway["containers"]
    configmap = find(docs, "ConfigMap", "voxgate-config")["data"]
    env = container_env(container, K8S_SECRETS)
    settings = Settings.load(
        config_file=_write(configmap["voxgate.toml"], tmp_path), env=voxgate_env(env)
    )
    # The file the settings name is the ConfigMap's, mounted beside voxgate.toml.
    upstreams_path = Path(settings.upstreams_file)
    assert upstreams_path.parent == Path("/etc/voxgate")
    local = tmp_path / upstreams_path.name
    local.write_text(configmap[upstreams_path.name])
    (fleet,) = load_upstreams(local)
    assert check_config(fleet, env) == "synthesis-key-secret"
    url = urlsplit(fleet.base_url)
    service = find(docs, "Service", str(url.hostname))
    assert service["spec"]["ports"][0]["port"] == (url.port or 80)
    synthesis = find(docs, "Deployment", "voxgate-synthesis")["spec"]["template"]
    assert service["spec"]["selector"].items() <= synthesis["metadata"]["labels"].items()
    (host,) = synthesis["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in host["ports"]}
    (tmp_path / "synthesis").mkdir()
    host_settings = Settings.load(
        config_file=_write(
            find(docs, "ConfigMap", "voxgate-synthesis-config")["data"]["voxgate.toml"],
            tmp_path / "synthesis",
        ),
        env=voxgate_env(container_env(host, K8S_SECRETS)),
    )
    assert ports[service["spec"]["ports"][0]["targetPort"]] == host_settings.port
    assert url.hostname in host_settings.allowed_hosts
    # It serves what the entry asks for (the bundled voice, on the Piper model).
    assert fleet.model == "piper" and fleet.voices == ("joe",)
    assert host_settings.api_keys_file and host_settings.metrics_auth
    # Only the gateways reach it.
    policy = find(docs, "NetworkPolicy", "voxgate-synthesis")["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= synthesis["metadata"]["labels"].items()
    senders = [f["podSelector"]["matchLabels"] for f in policy["ingress"][0]["from"]]
    assert {"app.kubernetes.io/name": "voxgate"} in senders


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
    # Redis asks for the password voxgate's URL carries, and only voxgate reaches it.
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


# ---- shipped locked (docs/security.md, "Deployment checklist") ------------------------------


def shipped(name: str, tmp_path: Path) -> tuple[Settings, dict[str, Any]]:
    """The settings a shipped configuration runs with (the image's ENV below compose's or the
    pod's env, the ConfigMap's file below both) and what it mounts where."""
    if name == "image":
        text = (ROOT / "Dockerfile").read_text()
        volumes = re.findall(r'^VOLUME \["([^"]+)"\]', text, re.M)
        return Settings.load(env=image_env()), {"volumes": volumes, "health_host": "127.0.0.1"}
    if name == "compose":
        vox = compose()["services"]["voxgate"]
        env = {**image_env(), **{k: str(v) for k, v in vox["environment"].items()}}
        volumes = [v.split(":")[1] for v in vox["volumes"]]
        redis = compose()["services"]["redis"]["command"]
        return Settings.load(env=voxgate_env(env)), {
            "volumes": volumes,
            "scrape_host": "voxgate",
            "redis_command": redis,
        }
    docs = k8s_docs()
    pod = find(docs, "Deployment", "voxgate")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    toml = find(docs, "ConfigMap", "voxgate-config")["data"]["voxgate.toml"]
    env = {**image_env(), **container_env(container, K8S_SECRETS)}
    settings = Settings.load(config_file=_write(toml, tmp_path), env=voxgate_env(env))
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    redis = find(docs, "Deployment", "voxgate-redis")["spec"]["template"]["spec"]["containers"][0]
    return settings, {
        "mounts": mounts,
        "volumes": volumes,
        "probe_host": POD_FIELDS["status.podIP"],
        "redis_command": redis["args"],
    }


@pytest.mark.parametrize("name", ["image", "compose", "k8s"])
def test_what_ships_is_locked(name: str, tmp_path: Path) -> None:
    settings, where = shipped(name, tmp_path)
    assert settings.host == "0.0.0.0"  # reachable from outside the container: so, locked
    # 1. A keys file: made at the first start in a volume of its own, or mounted from a Secret.
    keys_file = Path(settings.api_keys_file)
    assert keys_file.is_absolute()
    if name == "k8s":
        assert not settings.api_keys_init  # every replica must hold the same keys
        volume = where["volumes"][where["mounts"][str(keys_file.parent)]]
        assert volume["secret"]["secretName"] == "voxgate-secrets"
        assert volume["secret"]["items"] == [{"key": "api-keys.toml", "path": keys_file.name}]
        assert volume["secret"]["defaultMode"] & 0o007 == 0  # not readable by others
    else:
        assert settings.api_keys_init
        assert str(keys_file.parent) in where["volumes"]
        assert keys_file.parent != settings.cache_dir
    # 4. /metrics needs a key. 9. Only the listed host names answer (DNS rebinding), and those
    # include what the health check, the probes or Prometheus send.
    assert settings.metrics_auth
    assert settings.allowed_hosts and "attacker-rebound.example" not in settings.allowed_hosts
    for role in ("health_host", "scrape_host", "probe_host"):
        if role in where:
            assert where[role] in settings.allowed_hosts, role
    # 7. With Redis: a password in its URL and a cache secret; pins bounded below its memory.
    if settings.redis_url.get_secret_value():
        assert f":{SECRETS['REDIS_PASSWORD']}@" in settings.redis_url.get_secret_value()
        assert len(settings.cache_secret.get_secret_value()) >= 32
        # Pinned entries have no TTL, and volatile-lru evicts only keys with one.
        command = " ".join(where["redis_command"])
        assert "--maxmemory-policy volatile-lru" in command
        maxmemory = re.search(r"--maxmemory (\d+)gb", command)
        assert maxmemory is not None
        assert settings.pin_quota_mb * 1024 * 1024 <= int(maxmemory[1]) * 1024**3 // 4
    if name == "compose":
        assert (
            settings.api_keys_init_metrics_secret.get_secret_value()
            == SECRETS["VOXGATE_METRICS_KEY"]
        )
        with pytest.raises(KeyError, match="VOXGATE_METRICS_KEY"):
            compose({k: v for k, v in SECRETS.items() if k != "VOXGATE_METRICS_KEY"})


def test_the_first_start_makes_the_keys_file_and_shows_its_secret_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gateway.runtime.apikeys import KeyRing
    from tests.served import DefaultServer

    # The image's own start (its ENV, paths moved into tmp), as `docker run` would do it.
    env = image_env()
    keys_file = tmp_path / "state" / "keys.toml"
    env.update(
        VOXGATE_API_KEYS_FILE=str(keys_file),
        VOXGATE_API_KEYS_INIT_METRICS_SECRET=SECRETS["VOXGATE_METRICS_KEY"],
    )
    server = DefaultServer(tmp_path / "first", env=env)
    try:
        server.wait_ready()
        shown = re.findall(r"^    (\S{43})$", server.logs(), re.M)
        assert len(shown) == 1, server.logs()  # once, by the supervisor, not per process
        ring = KeyRing.load(keys_file)
        admin = ring.identify(shown[0])
        assert admin is not None and admin.name == "admin" and "admin" in admin.scopes
        scraper = ring.identify(SECRETS["VOXGATE_METRICS_KEY"])
        assert scraper is not None and scraper.scopes == {"metrics"}
        assert keys_file.stat().st_mode & 0o777 == 0o600
        assert shown[0] not in keys_file.read_text()
        # The DNS-rebinding page of the review: an unknown Host gets 421, /metrics a 401.
        rebound = urllib.request.Request(
            server.url + "/v1/prompts",
            data=b'{"prompts": ["Hi."]}',
            headers={"Host": "attacker-rebound.example", "Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(rebound, timeout=10)
        assert refused.value.code == 421
        assert server.get("/metrics")[0] == 401
        scrape = urllib.request.Request(
            server.url + "/metrics",
            headers={"Authorization": f"Bearer {SECRETS['VOXGATE_METRICS_KEY']}"},
        )
        with urllib.request.urlopen(scrape, timeout=10) as resp:
            assert resp.status == 200
    finally:
        server.close()
    # A later start (the same volume) keeps the file and shows nothing.
    from gateway.cli.serve import init_keys_file

    before = keys_file.read_bytes()
    init_keys_file(Settings.load(env=env))
    assert capsys.readouterr().err == "" and keys_file.read_bytes() == before


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
