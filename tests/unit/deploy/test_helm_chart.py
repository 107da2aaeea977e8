"""The Helm chart (helm/attnstore), rendered and linted by the Helm SDK itself (PyPI
`helm-python-sdk`, no helm binary) for several values sets, every rendered object validated
against the Kubernetes OpenAPI schemas (`kubernetes-validate --strict`), and the services'
settings in the rendered pods validated as the services would load them."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from deploy_support import REPO, check_settings_env

from attnstore_scheduler.auth import ApiKeys

CHART = REPO / "helm" / "attnstore"
RELEASE, NAMESPACE = "kv", "serving"
# The chart's floor (Chart.yaml kubeVersion) and the newest schemas kubernetes-validate ships.
KUBE_VERSIONS = ["1.27.0", kubernetes_validate.utils.latest_version()]
# Example values sets beside the chart (chart-testing's ci/ convention), plus the defaults.
VALUE_SETS = {"defaults": {}} | {
    path.name.removesuffix("-values.yaml"): yaml.safe_load(path.read_text())
    for path in sorted((CHART / "ci").glob("*-values.yaml"))
}
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}  # not in the Kubernetes schemas
PREFIXES = {
    "kvstore-daemon": ("kvstore-daemon", "ATTNSTORE_DAEMON_"),
    "inference-worker": ("inference-worker", "ATTNSTORE_WORKER_"),
    "scheduler": ("scheduler", "ATTNSTORE_SCHEDULER_"),
}
QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
SAMPLE_HOST_IP = "10.1.2.3"
SAMPLE_POD_IP, SAMPLE_NODE = "10.244.1.7", "gpu-node-1"
SAMPLE_SECRET_URL = "redis://:pw@redis.example:6379/0"


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def render(chart: helm.Chart, values: dict) -> list[dict]:
    """The rendered objects (NOTES.txt and empty documents dropped)."""
    rendered = chart.render(values=copy.deepcopy(values), name=RELEASE, namespace=NAMESPACE)
    return [
        doc
        for path, text in sorted(rendered.items())
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


@pytest.fixture(scope="module")
def rendered(chart: helm.Chart) -> dict[str, list[dict]]:
    return {name: render(chart, values) for name, values in VALUE_SETS.items()}


def objects(docs: list[dict], kind: str) -> list[dict]:
    return [doc for doc in docs if doc["kind"] == kind]


def one(docs: list[dict], kind: str, component: str) -> dict:
    [found] = [
        doc
        for doc in objects(docs, kind)
        if doc["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    return found


def workloads(docs: list[dict]) -> list[dict]:
    return [doc for doc in docs if doc["kind"] in {"Deployment", "DaemonSet", "StatefulSet"}]


def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def container(workload: dict, name: str) -> dict:
    [found] = [c for c in pod_spec(workload)["containers"] if c["name"] == name]
    return found


def settings_env(workload: dict, container_name: str) -> dict[str, str]:
    """The container's environment as the process sees it: fieldRefs and secretKeyRefs
    filled with sample values, $(VAR) references expanded as the kubelet does."""
    env: dict[str, str] = {}
    for entry in container(workload, container_name).get("env", []):
        if "value" in entry:
            env[entry["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), entry["value"])
        elif "fieldRef" in entry["valueFrom"]:
            path = entry["valueFrom"]["fieldRef"]["fieldPath"]
            env[entry["name"]] = {
                "status.hostIP": SAMPLE_HOST_IP, "status.podIP": SAMPLE_POD_IP, "spec.nodeName": SAMPLE_NODE,
                "metadata.namespace": NAMESPACE,
            }[path]  # fmt: skip
        else:
            assert "secretKeyRef" in entry["valueFrom"], entry
            env[entry["name"]] = SAMPLE_SECRET_URL
    return env


def port_number(container_spec: dict, name: str) -> int:
    [port] = [p["containerPort"] for p in container_spec["ports"] if p["name"] == name]
    return port


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


# ---- the chart as Helm sees it -------------------------------------------------------------


@pytest.mark.parametrize("values_set", VALUE_SETS)
def test_lint_is_clean(values_set: str) -> None:
    for kube_version in KUBE_VERSIONS:
        report = helm.lint(
            CHART, VALUE_SETS[values_set], strict=True, namespace=NAMESPACE, kube_version=f"v{kube_version}"
        )
        problems = [m for m in report["messages"] if m["severity"] >= 2]  # warnings and errors
        assert not report["errors"] and not problems, report


@pytest.mark.parametrize("values_set", VALUE_SETS)
def test_every_object_is_valid_kubernetes(rendered: dict[str, list[dict]], values_set: str) -> None:
    docs = [doc for doc in rendered[values_set] if (doc["apiVersion"], doc["kind"]) not in CRD_KINDS]
    assert docs
    for kube_version in KUBE_VERSIONS:
        for doc in docs:
            try:
                kubernetes_validate.validate(doc, kube_version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(
                    f"{doc['kind']}/{doc['metadata']['name']} on {kube_version}: {exc.message} at {list(exc.path)}"
                )


@pytest.mark.parametrize("values_set", VALUE_SETS)
def test_objects_are_named_and_namespaced(rendered: dict[str, list[dict]], values_set: str) -> None:
    seen = set()
    for doc in rendered[values_set]:
        name = doc["metadata"]["name"]
        assert DNS_LABEL.match(name), name
        assert doc["metadata"]["namespace"] == NAMESPACE
        assert (doc["kind"], name) not in seen, f"two {doc['kind']} named {name}"
        seen.add((doc["kind"], name))
        assert doc["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE


@pytest.mark.parametrize("values_set", VALUE_SETS)
def test_resource_quantities_parse(rendered: dict[str, list[dict]], values_set: str) -> None:
    for workload in workloads(rendered[values_set]):
        for spec in pod_spec(workload)["containers"] + pod_spec(workload).get("initContainers", []):
            for kind in ("requests", "limits"):
                for resource, quantity in spec.get("resources", {}).get(kind, {}).items():
                    assert QUANTITY.match(str(quantity)), (
                        f"{workload['metadata']['name']} {resource}={quantity!r}"
                    )


@pytest.mark.parametrize("values_set", VALUE_SETS)
def test_selectors_select_the_chart_pods(rendered: dict[str, list[dict]], values_set: str) -> None:
    docs = rendered[values_set]
    pod_labels = []
    for workload in workloads(docs):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert matches(workload["spec"]["selector"]["matchLabels"], labels)
        pod_labels.append((workload, labels))
    for doc in objects(docs, "Service") + objects(docs, "PodDisruptionBudget"):
        selector = (
            doc["spec"]["selector"] if doc["kind"] == "Service" else doc["spec"]["selector"]["matchLabels"]
        )
        selected = [w for w, labels in pod_labels if matches(selector, labels)]
        assert len(selected) == 1, (
            f"{doc['kind']}/{doc['metadata']['name']} selects {len(selected)} workloads"
        )
        if doc["kind"] == "Service":  # every target port is a named port of the selected pods
            names = {p["name"] for c in pod_spec(selected[0])["containers"] for p in c.get("ports", [])}
            for port in doc["spec"]["ports"]:
                assert port["targetPort"] in names, (
                    f"{doc['metadata']['name']}: no container port {port['targetPort']}"
                )


@pytest.mark.parametrize("values_set", VALUE_SETS)
def test_pods_run_as_non_root_with_a_read_only_root(rendered: dict[str, list[dict]], values_set: str) -> None:
    for workload in workloads(rendered[values_set]):
        spec = pod_spec(workload)
        assert spec["securityContext"]["runAsNonRoot"] is True
        for c in spec["containers"]:
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
        for init in spec.get("initContainers", []):  # only chown, as root, with CAP_CHOWN alone
            assert init["command"][0] == "chown"
            assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}


@pytest.mark.parametrize("values_set", VALUE_SETS)
def test_attnstore_pods_probe_grpc_health(rendered: dict[str, list[dict]], values_set: str) -> None:
    for component in PREFIXES:
        docs = rendered[values_set]
        kind = "DaemonSet" if component == "kvstore-daemon" else "Deployment"
        candidates = [
            d
            for d in objects(docs, kind)
            if d["metadata"]["labels"]["app.kubernetes.io/component"] == component
        ]
        for workload in candidates:
            spec = container(workload, component)
            # Native gRPC probes speak no TLS: under TLS they go to the plaintext health port.
            port = "grpc-health" if VALUE_SETS[values_set].get("tls", {}).get("enabled") else "grpc"
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                assert spec[probe]["grpc"] == {"port": port_number(spec, port)}, (component, probe)


# ---- the services' settings in the pods ------------------------------------------------------


@pytest.mark.parametrize("values_set", VALUE_SETS)
@pytest.mark.parametrize("component", PREFIXES)
def test_pod_environment_is_valid_settings(
    rendered: dict[str, list[dict]], settings_classes, values_set: str, component: str
) -> None:
    kind = "DaemonSet" if component == "kvstore-daemon" else "Deployment"
    docs = rendered[values_set]
    found = [
        d for d in objects(docs, kind) if d["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    if not found:
        pytest.skip(f"{component} is disabled in {values_set}")
    workload = found[0]
    env = settings_env(workload, component)
    settings = check_settings_env(settings_classes[PREFIXES[component][0]], env)
    spec = container(workload, component)
    assert settings.listen_address == f"0.0.0.0:{port_number(spec, 'grpc')}"
    assert settings.metrics_port == port_number(spec, "metrics")
    if component == "scheduler":  # the OpenAI-compatible HTTP API, on by default
        assert settings.openai_listen_address == f"0.0.0.0:{port_number(spec, 'http')}"
    # The grace Kubernetes gives before SIGKILL covers the service's own shutdown grace.
    needed = settings.shutdown_grace_seconds * (2 if component == "inference-worker" else 1)
    assert pod_spec(workload)["terminationGracePeriodSeconds"] > needed


@pytest.fixture(params=VALUE_SETS)
def daemon_set(
    request: pytest.FixtureRequest, rendered: dict[str, list[dict]], settings_classes
) -> tuple[str, dict, Any]:
    """Each values set's name, its kvstore-daemon DaemonSet and the daemon settings that the
    DaemonSet's environment gives."""
    daemon = one(rendered[request.param], "DaemonSet", "kvstore-daemon")
    settings = check_settings_env(settings_classes["kvstore-daemon"], settings_env(daemon, "kvstore-daemon"))
    return request.param, daemon, settings


def test_daemon_keeps_its_tiers_on_the_node(daemon_set: tuple[str, dict, Any]) -> None:
    values_set, daemon, settings = daemon_set
    spec = container(daemon, "kvstore-daemon")
    mounts = {m["mountPath"]: m["name"] for m in spec["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(daemon)["volumes"]}
    values = VALUE_SETS[values_set].get("daemon", {})
    host_paths = values.get("ssd", {}).get("hostPaths", ["/var/lib/attnstore/ssd"])
    assert [volumes[mounts[str(d)]]["hostPath"]["path"] for d in settings.ssd_dirs] == host_paths
    shm = volumes[mounts[str(settings.shm_dir)]]["hostPath"]
    assert shm == {"path": str(settings.shm_dir), "type": "DirectoryOrCreate"}
    # The arena's tmpfs pages are charged to the daemon: its memory must hold the arena.
    limit, request = spec["resources"]["limits"]["memory"], spec["resources"]["requests"]["memory"]
    assert int(limit) == int(request) > settings.dram_capacity_bytes


@pytest.mark.parametrize("values_set", VALUE_SETS)
def test_workers_share_the_arena_of_their_nodes_daemon(
    rendered: dict[str, list[dict]], settings_classes, values_set: str
) -> None:
    docs = rendered[values_set]
    daemon = one(docs, "DaemonSet", "kvstore-daemon")
    worker = one(docs, "Deployment", "inference-worker")
    daemon_settings = check_settings_env(
        settings_classes["kvstore-daemon"], settings_env(daemon, "kvstore-daemon")
    )
    worker_settings = check_settings_env(
        settings_classes["inference-worker"], settings_env(worker, "inference-worker")
    )
    assert worker_settings.kvstore_use_shm
    worker_mounts = {m["mountPath"]: m["name"] for m in container(worker, "inference-worker")["volumeMounts"]}
    worker_volumes = {v["name"]: v for v in pod_spec(worker)["volumes"]}
    shm_volume = worker_volumes[worker_mounts[str(worker_settings.kvstore_shm_dir)]]
    assert shm_volume["hostPath"]["path"] == str(daemon_settings.shm_dir)
    # Scheduled only beside a daemon of this release.
    [term] = pod_spec(worker)["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert matches(term["labelSelector"]["matchLabels"], daemon["spec"]["template"]["metadata"]["labels"])
    # ... and dialing that daemon, never one on another node.
    daemon_port = port_number(container(daemon, "kvstore-daemon"), "grpc")
    if VALUE_SETS[values_set].get("daemon", {}).get("addressMode", "service") == "service":
        [service] = [s for s in objects(docs, "Service") if s["spec"].get("internalTrafficPolicy") == "Local"]
        assert matches(service["spec"]["selector"], daemon["spec"]["template"]["metadata"]["labels"])
        assert (
            worker_settings.kvstore_address
            == f"{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
        )
        assert service["spec"]["ports"][0]["port"] == daemon_port
    else:
        assert worker_settings.kvstore_address == f"{SAMPLE_HOST_IP}:{daemon_port}"
        [grpc_port] = [p for p in container(daemon, "kvstore-daemon")["ports"] if p["name"] == "grpc"]
        assert grpc_port["hostPort"] == daemon_port


def test_gpu_workers_ask_for_gpus_and_cpu_workers_do_not(
    rendered: dict[str, list[dict]], settings_classes
) -> None:
    gpu = one(rendered["defaults"], "Deployment", "inference-worker")
    cpu = one(rendered["cpu-worker"], "Deployment", "inference-worker")
    assert container(gpu, "inference-worker")["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "nvidia.com/gpu" not in container(cpu, "inference-worker")["resources"].get("limits", {})
    assert container(gpu, "inference-worker")["image"].endswith("-cuda")
    assert container(cpu, "inference-worker")["image"].endswith("-cpu")
    workers = settings_classes["inference-worker"]
    assert check_settings_env(workers, settings_env(gpu, "inference-worker")).device == "cuda"
    assert check_settings_env(workers, settings_env(cpu, "inference-worker")).device == "cpu"
    big = one(rendered["big-node"], "Deployment", "inference-worker")
    assert container(big, "inference-worker")["resources"]["limits"]["nvidia.com/gpu"] == 2


def test_daemon_settings_pass_through_config(rendered: dict[str, list[dict]], settings_classes) -> None:
    daemon = one(rendered["big-node"], "DaemonSet", "kvstore-daemon")
    settings = check_settings_env(settings_classes["kvstore-daemon"], settings_env(daemon, "kvstore-daemon"))
    assert settings.dram_capacity_bytes == 64 * 1024**3  # no float exponent on the way
    assert settings.ssd_capacity_bytes == 3 * 1024**4
    assert (settings.eviction_policy, settings.io_threads, settings.persist_on_commit) == ("lru", 16, False)
    assert pod_spec(daemon)["nodeSelector"] == {"attnstore.io/kvstore": "true"}
    assert "initContainers" not in pod_spec(daemon)


def test_the_eviction_policy_reaches_the_daemons_and_the_schedulers_hints(
    chart: helm.Chart, rendered: dict[str, list[dict]], settings_classes
) -> None:
    docs = render(
        chart,
        {
            "eviction": {
                "policy": "predictive",
                "declinedAdmission": "ssd_only",
                "predictIntervalSeconds": 2.5,
            }
        },
    )
    daemon = check_settings_env(
        settings_classes["kvstore-daemon"],
        settings_env(one(docs, "DaemonSet", "kvstore-daemon"), "kvstore-daemon"),
    )
    scheduler = check_settings_env(
        settings_classes["scheduler"], settings_env(one(docs, "Deployment", "scheduler"), "scheduler")
    )
    assert (daemon.eviction_policy, daemon.declined_admission) == ("predictive", "ssd_only")
    assert (scheduler.hints.policy, scheduler.hints.predict_interval_seconds) == ("predictive", 2.5)
    defaults = one(rendered["defaults"], "Deployment", "scheduler")
    assert check_settings_env(
        settings_classes["scheduler"], settings_env(defaults, "scheduler")
    ).hints.policy == ("lookahead")


# ---- the scheduler, its secrets and Redis ----------------------------------------------------


def scheduler_settings(rendered, settings_classes, values_set: str):
    scheduler = one(rendered[values_set], "Deployment", "scheduler")
    return scheduler, check_settings_env(settings_classes["scheduler"], settings_env(scheduler, "scheduler"))


@pytest.mark.parametrize("values_set", VALUE_SETS)
def test_scheduler_can_watch_pods_when_it_discovers_them(
    rendered: dict[str, list[dict]], settings_classes, values_set: str
) -> None:
    docs = rendered[values_set]
    scheduler, settings = scheduler_settings(rendered, settings_classes, values_set)
    if not settings.kubernetes_discovery:
        assert not objects(docs, "Role") and settings.nodes
        return
    assert settings.kubernetes_namespace == NAMESPACE
    [role], [binding] = objects(docs, "Role"), objects(docs, "RoleBinding")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    account = pod_spec(scheduler)["serviceAccountName"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
    assert [sa["metadata"]["name"] for sa in objects(docs, "ServiceAccount")] == [account]
    assert pod_spec(scheduler)["automountServiceAccountToken"] is True
    # Its label selectors find exactly the daemon and worker pods.
    for selector, component in (
        (settings.kubernetes_daemon_selector, "kvstore-daemon"),
        (settings.kubernetes_worker_selector, "inference-worker"),
    ):
        wanted = dict(term.split("=") for term in selector.split(","))
        selected = [
            w for w in workloads(docs) if matches(wanted, w["spec"]["template"]["metadata"]["labels"])
        ]
        assert [w["metadata"]["labels"]["app.kubernetes.io/component"] for w in selected] == [component]


def test_api_key_hashes_reach_the_scheduler_through_a_secret(
    rendered: dict[str, list[dict]], settings_classes, tmp_path: Path
) -> None:
    scheduler, settings = scheduler_settings(rendered, settings_classes, "external-redis")
    [secret] = [
        s for s in objects(rendered["external-redis"], "Secret") if "api-keys.yaml" in s["stringData"]
    ]
    assert (
        yaml.safe_load(secret["stringData"]["api-keys.yaml"])
        == VALUE_SETS["external-redis"]["scheduler"]["auth"]["apiKeyHashes"]
    )
    mount = next(m for m in container(scheduler, "scheduler")["volumeMounts"] if m["name"] == "api-keys")
    volume = next(v for v in pod_spec(scheduler)["volumes"] if v["name"] == "api-keys")
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    [item] = volume["secret"]["items"]
    assert settings.auth_enabled and settings.api_keys_file == Path(mount["mountPath"]) / item["path"]
    assert mount["readOnly"] is True
    # The file loads as the scheduler loads it.
    keys_file = tmp_path / "api-keys.yaml"
    keys_file.write_text(secret["stringData"]["api-keys.yaml"])
    ApiKeys.load(keys_file, settings.admin_tenant)
    # An existing Secret is mounted instead of one the chart makes.
    scheduler, settings = scheduler_settings(rendered, settings_classes, "existing-secrets")
    volume = next(v for v in pod_spec(scheduler)["volumes"] if v["name"] == "api-keys")
    assert volume["secret"]["secretName"] == "attnstore-api-keys"
    assert volume["secret"]["items"] == [{"key": "keys.yaml", "path": "api-keys.yaml"}]
    assert not [s for s in objects(rendered["existing-secrets"], "Secret")]


def test_redis_in_chart_external_or_none(rendered: dict[str, list[dict]], settings_classes) -> None:
    # In the chart: a StatefulSet and its Service, dialed by name.
    _, settings = scheduler_settings(rendered, settings_classes, "defaults")
    redis = one(rendered["defaults"], "StatefulSet", "redis")
    service = one(rendered["defaults"], "Service", "redis")
    assert (
        settings.redis_url == f"redis://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}/0"
    )
    assert matches(service["spec"]["selector"], redis["spec"]["template"]["metadata"]["labels"])
    # An external URL: kept in a Secret the chart makes, read through secretKeyRef.
    scheduler = one(rendered["external-redis"], "Deployment", "scheduler")
    assert not objects(rendered["external-redis"], "StatefulSet")
    [entry] = [
        e for e in container(scheduler, "scheduler")["env"] if e["name"] == "ATTNSTORE_SCHEDULER_REDIS_URL"
    ]
    ref = entry["valueFrom"]["secretKeyRef"]
    [secret] = [
        s for s in objects(rendered["external-redis"], "Secret") if s["metadata"]["name"] == ref["name"]
    ]
    assert secret["stringData"][ref["key"]] == VALUE_SETS["external-redis"]["externalRedis"]["url"]
    # A Secret of the user's.
    scheduler = one(rendered["existing-secrets"], "Deployment", "scheduler")
    [entry] = [
        e for e in container(scheduler, "scheduler")["env"] if e["name"] == "ATTNSTORE_SCHEDULER_REDIS_URL"
    ]
    assert entry["valueFrom"]["secretKeyRef"] == {"name": "attnstore-redis", "key": "url"}
    # None: the scheduler's in-memory store.
    _, settings = scheduler_settings(rendered, settings_classes, "cpu-worker")
    assert settings.redis_url is None


TLS_ON = {"enabled": True, "secretName": "attnstore-tls"}
AUTH_ON = {"enabled": True, "secretName": "attnstore-tokens", "adminTokenSha256": ["ab" * 32]}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"tls": {"enabled": True}}, "needs tls.secretName"),
        ({"internalAuth": AUTH_ON}, "needs tls.enabled"),
        ({"tls": TLS_ON, "internalAuth": {"enabled": True}}, "adminTokenSha256"),
        ({"tls": {**TLS_ON, "mutual": False}, "internalAuth": AUTH_ON}, "workerTokenSha256"),
        ({"redis": {"enabled": False}, "scheduler": {"replicas": 2}}, "needs shared session metadata"),
        ({"externalRedis": {"url": "redis://r:6379/0"}}, "exclusive"),
        ({"scheduler": {"kubernetesDiscovery": False}}, "static topology"),
        ({"redis": {"enabled": False}, "daemon": {"pool": {"enabled": True}}}, "the pool's ledger"),
        (
            {"redis": {"enabled": False}, "worker": {"longContext": {"enabled": True}}},
            "lists the workers that lend",
        ),
    ],
)
def test_inconsistent_values_fail_with_a_message(chart: helm.Chart, values: dict, message: str) -> None:
    with pytest.raises(helm.HelmError, match=message):
        render(chart, values)


# ---- the data plane and the pool ------------------------------------------------------------


def test_the_daemons_data_plane_port_is_open(
    rendered: dict[str, list[dict]], daemon_set: tuple[str, dict, Any]
) -> None:
    values_set, daemon, settings = daemon_set
    assert settings.data_plane_port == port_number(container(daemon, "kvstore-daemon"), "data-plane")
    services = [
        s
        for s in objects(rendered[values_set], "Service")
        if s["metadata"]["name"].endswith("kvstore-daemon")
    ]
    for service in services:  # the client dials the port number the daemon reports: the same here
        [port] = [p for p in service["spec"]["ports"] if p["name"] == "data-plane"]
        assert port["port"] == settings.data_plane_port and port["targetPort"] == "data-plane"


def test_pooled_daemons_join_the_schedulers_ledger_by_pod_ip_under_tls(
    rendered: dict[str, list[dict]], settings_classes
) -> None:
    values = VALUE_SETS["pool"]
    daemon = one(rendered["pool"], "DaemonSet", "kvstore-daemon")
    settings = check_settings_env(settings_classes["kvstore-daemon"], settings_env(daemon, "kvstore-daemon"))
    _, scheduler = scheduler_settings(rendered, settings_classes, "pool")
    assert settings.pool_redis_url == scheduler.redis_url  # the ledger is in the scheduler's Redis
    assert settings.pool_node == SAMPLE_NODE
    assert (
        settings.pool_advertise_address
        == f"{SAMPLE_POD_IP}:{port_number(container(daemon, 'kvstore-daemon'), 'grpc')}"
    )
    assert settings.pool_capacity_bytes == values["daemon"]["pool"]["capacityBytes"]
    assert settings.pool_replace_borrowed is values["daemon"]["pool"]["replaceBorrowed"] is False
    channel, files = settings.pool_channel, mounted_files(daemon, "kvstore-daemon")
    assert channel.tls and channel.server_name == values["tls"]["serverName"]  # peers are dialed by IP
    assert files[channel.ca_file] == (values["tls"]["secretName"], "ca.crt")
    assert files[channel.cert_file] == (values["tls"]["secretName"], "tls.crt")  # mutual TLS between peers
    off = one(rendered["defaults"], "DaemonSet", "kvstore-daemon")
    assert (
        check_settings_env(
            settings_classes["kvstore-daemon"], settings_env(off, "kvstore-daemon")
        ).pool_redis_url
        is None
    )


def test_long_context_workers_advertise_their_pod_ip_and_lend_through_the_ledger(
    rendered: dict[str, list[dict]], settings_classes
) -> None:
    """On (the pool set): each worker is named to the others by its pod IP and gRPC port,
    lists itself in the scheduler's Redis (the daemons' ledger) on its node as its daemon
    does, lends what the values say, and calls its peers under the release's TLS; config
    adds the long_context fields the chart leaves alone. Off (every other set): none of it."""
    values = VALUE_SETS["pool"]
    long_values = values["worker"]["longContext"]
    worker = one(rendered["pool"], "Deployment", "inference-worker")
    settings = check_settings_env(
        settings_classes["inference-worker"], settings_env(worker, "inference-worker")
    )
    daemon = one(rendered["pool"], "DaemonSet", "kvstore-daemon")
    daemon_settings = check_settings_env(
        settings_classes["kvstore-daemon"], settings_env(daemon, "kvstore-daemon")
    )
    _, scheduler = scheduler_settings(rendered, settings_classes, "pool")
    long = settings.long_context
    assert (
        long.advertise_address
        == f"{SAMPLE_POD_IP}:{port_number(container(worker, 'inference-worker'), 'grpc')}"
    )
    assert long.pool_redis_url == daemon_settings.pool_redis_url == scheduler.redis_url
    assert long.pool_node == daemon_settings.pool_node == SAMPLE_NODE
    assert long.max_context_tokens == long_values["maxContextTokens"]
    assert long.segment_tokens == 4096 and long.dgfm.period_seconds == 10  # the default; config's
    assert settings.micro_attention.max_held_bytes == long_values["lending"]["maxHeldBytes"]
    assert settings.micro_attention.max_inflight_key_tokens == 4194304
    channel, files = long.peer_channel, mounted_files(worker, "inference-worker")
    assert channel.tls and channel.server_name == values["tls"]["serverName"]  # peers are dialed by IP
    assert files[channel.ca_file] == (values["tls"]["secretName"], "ca.crt")
    assert files[channel.cert_file] == (values["tls"]["secretName"], "tls.crt")
    for values_set, docs in rendered.items():
        if values_set != "pool":
            env = settings_env(one(docs, "Deployment", "inference-worker"), "inference-worker")
            assert not any(
                k.startswith(("ATTNSTORE_WORKER_LONG_CONTEXT", "ATTNSTORE_WORKER_MICRO")) for k in env
            )


def test_a_long_context_worker_that_does_not_lend_only_borrows(chart: helm.Chart, settings_classes) -> None:
    values = {
        "worker": {"gpu": {"enabled": False}, "longContext": {"enabled": True, "lending": {"enabled": False}}}
    }
    worker = one(render(chart, values), "Deployment", "inference-worker")
    settings = check_settings_env(
        settings_classes["inference-worker"], settings_env(worker, "inference-worker")
    )
    assert settings.micro_attention.max_held_bytes == 0  # lends none, so it is not listed as a lender
    assert settings.long_context.pool_redis_url and settings.long_context.advertise_address  # borrows
    assert settings.long_context.peer_channel.tls is False  # no TLS in the release


def test_a_worker_with_dedicated_cores_is_guaranteed_and_its_threads_spin_bound(
    chart: helm.Chart, settings_classes
) -> None:
    workers = settings_classes["inference-worker"]
    shared = one(render(chart, {"worker": {"gpu": {"enabled": False}}}), "Deployment", "inference-worker")
    settings = check_settings_env(workers, settings_env(shared, "inference-worker"))
    assert (settings.openmp_spin_count, settings.openmp_pin_threads) == (None, False)
    assert "cpu" not in container(shared, "inference-worker")["resources"]["limits"]  # Burstable
    values = {"worker": {"gpu": {"enabled": False}, "dedicatedCores": {"enabled": True, "cpus": 4}}}
    owned = one(render(chart, values), "Deployment", "inference-worker")
    settings = check_settings_env(workers, settings_env(owned, "inference-worker"))
    assert (settings.openmp_spin_count, settings.openmp_pin_threads) == (300000, True)
    resources = container(owned, "inference-worker")["resources"]
    assert resources["requests"] == resources["limits"] == {"cpu": "4", "memory": "8Gi"}  # Guaranteed


@pytest.mark.parametrize("values_set", VALUE_SETS)
def test_only_the_releases_pods_reach_the_daemons(rendered: dict[str, list[dict]], values_set: str) -> None:
    docs = rendered[values_set]
    policy = one(docs, "NetworkPolicy", "kvstore-daemon")
    daemon = one(docs, "DaemonSet", "kvstore-daemon")
    assert matches(
        policy["spec"]["podSelector"]["matchLabels"], daemon["spec"]["template"]["metadata"]["labels"]
    )
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    internal, scrapers = policy["spec"]["ingress"]
    peers = internal["from"]
    pods = {w["metadata"]["labels"]["app.kubernetes.io/component"]: w for w in workloads(docs)}
    for component in ("kvstore-daemon", "inference-worker", "scheduler"):
        if component in pods:
            labels = pods[component]["spec"]["template"]["metadata"]["labels"]
            assert any(matches(p.get("podSelector", {}).get("matchLabels", {}), labels) for p in peers), (
                component
            )
    assert all("podSelector" in p for p in peers) and not any("ipBlock" in p for p in peers)
    assert peers[3:] == VALUE_SETS[values_set].get("daemon", {}).get("networkPolicy", {}).get("extraFrom", [])
    container_ports = {p["name"] for p in container(daemon, "kvstore-daemon")["ports"]}
    assert {p["port"] for p in internal["ports"]} >= {"grpc", "data-plane"}
    assert {p["port"] for p in internal["ports"]} <= container_ports
    assert scrapers == {"ports": [{"port": "metrics", "protocol": "TCP"}]}  # no "from": Prometheus anywhere


def test_the_network_policy_can_be_left_out(chart: helm.Chart) -> None:
    assert not objects(render(chart, {"daemon": {"networkPolicy": {"enabled": False}}}), "NetworkPolicy")


# ---- Prometheus -----------------------------------------------------------------------------


@pytest.mark.parametrize("values_set", VALUE_SETS)
def test_every_component_has_a_metrics_service(rendered: dict[str, list[dict]], values_set: str) -> None:
    docs = rendered[values_set]
    metrics_services = [
        s for s in objects(docs, "Service") if s["metadata"]["labels"].get("attnstore.io/metrics") == "true"
    ]
    components = {s["metadata"]["labels"]["app.kubernetes.io/component"] for s in metrics_services}
    assert components == {w["metadata"]["labels"]["app.kubernetes.io/component"] for w in workloads(docs)} - {
        "redis"
    }
    for service in metrics_services:
        assert service["spec"]["clusterIP"] == "None"  # scraped per pod
        assert [p["name"] for p in service["spec"]["ports"]] == ["metrics"]


def test_service_monitor_only_when_asked(rendered: dict[str, list[dict]]) -> None:
    for name, docs in rendered.items():
        assert bool(objects(docs, "ServiceMonitor")) == (name == "servicemonitor"), name


def test_service_monitor_scrapes_the_metrics_services(rendered: dict[str, list[dict]]) -> None:
    """A CRD, so not in kubernetes-validate's schemas: its structure is checked here, as the
    Prometheus Operator reads it (selector -> Services in its namespaces -> named ports)."""
    docs = rendered["servicemonitor"]
    [monitor] = objects(docs, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor["spec"]) == {"namespaceSelector", "selector", "endpoints"}
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    selected = [
        s
        for s in objects(docs, "Service")
        if matches(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
    ]
    assert {s["metadata"]["labels"]["app.kubernetes.io/component"] for s in selected} == set(PREFIXES)
    for endpoint in monitor["spec"]["endpoints"]:
        assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout"}
        assert re.fullmatch(r"\d+(ms|s|m|h)", endpoint["interval"]) and re.fullmatch(
            r"\d+(ms|s|m|h)", endpoint["scrapeTimeout"]
        )
        assert endpoint["path"] == "/metrics"
        for service in selected:
            assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}


# ---- values.schema.json ----------------------------------------------------------------------


BAD_VALUES = {
    "unknown top-level key": {"deamon": {}},
    "typo in a component": {"daemon": {"dram": {"capacityByte": 1}}},
    "arena smaller than 1 MiB": {"daemon": {"dram": {"capacityBytes": 1000}}},
    "relative SSD path": {"daemon": {"ssd": {"hostPaths": ["var/lib/ssd"]}}},
    "no SSD path": {"daemon": {"ssd": {"hostPaths": []}}},
    "unknown address mode": {"daemon": {"addressMode": "nodePort"}},
    "port out of range": {"worker": {"grpcPort": 70000}},
    "unknown dtype": {"worker": {"dtype": "float16"}},
    "bad device": {"worker": {"device": "gpu"}},
    "config overrides a chart-managed setting": {"daemon": {"config": {"shm_dir": "/tmp"}}},
    "config sets the policy eviction.policy sets": {"daemon": {"config": {"eviction_policy": "lru"}}},
    "unknown eviction policy": {"eviction": {"policy": "random"}},
    "config key not a setting name": {"worker": {"config": {"Chunk-Tokens": 128}}},
    "API key stored in clear": {"scheduler": {"auth": {"apiKeyHashes": {"t": ["my-secret-key"]}}}},
    "API key hashes not a list": {"scheduler": {"auth": {"apiKeyHashes": {"t": "ab" * 32}}}},
    "tenant name the scheduler refuses": {"scheduler": {"auth": {"apiKeyHashes": {"team a": ["ab" * 32]}}}},
    "PDB bound neither a count nor a percentage": {
        "worker": {"podDisruptionBudget": {"minAvailable": "half"}}
    },
    "negative replicas": {"worker": {"replicas": -1}},
    "not a Redis URL": {"redis": {"enabled": False}, "externalRedis": {"url": "http://redis:6379"}},
    "bad quantity": {"worker": {"resources": {"limits": {"memory": "8 gigs"}}}},
    "bad scrape interval": {"metrics": {"serviceMonitor": {"enabled": True, "interval": "often"}}},
    "unknown pull policy": {"scheduler": {"image": {"pullPolicy": "Sometimes"}}},
    "TLS server name not a DNS name": {"tls": {"serverName": "attnstore internal"}},
    "admin token stored in clear": {"internalAuth": {"adminTokenSha256": ["my-admin-token"]}},
    "config sets what tls manages": {"worker": {"config": {"kvstore_channel": {"tls": False}}}},
    "negative lent bytes": {"worker": {"longContext": {"enabled": True, "lending": {"maxHeldBytes": -1}}}},
    "typo in longContext": {"worker": {"longContext": {"enabled": True, "maxContext": 1}}},
}


@pytest.mark.parametrize("values", BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_schema_rejects_bad_values(chart: helm.Chart, values: dict) -> None:
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema(chart.merge_values(copy.deepcopy(values)))
    with pytest.raises(helm.HelmValuesError):  # and so does an install
        render(chart, values)


@pytest.mark.parametrize("values_set", VALUE_SETS)
def test_schema_accepts_the_example_values(chart: helm.Chart, values_set: str) -> None:
    chart.validate_schema(chart.merge_values(copy.deepcopy(VALUE_SETS[values_set])))


def test_notes_name_the_api_and_warn_about_missing_keys(chart: helm.Chart) -> None:
    notes = chart.render(name=RELEASE, namespace=NAMESPACE)["attnstore/templates/NOTES.txt"]
    assert f"{RELEASE}-attnstore-scheduler.{NAMESPACE}.svc:50071" in notes
    assert "no API keys are configured" in notes
    notes = chart.render(values=VALUE_SETS["external-redis"], name=RELEASE, namespace=NAMESPACE)[
        "attnstore/templates/NOTES.txt"
    ]
    assert "no API keys" not in notes and "WARNING" not in notes


# ---- TLS and internal auth ----------------------------------------------------------------------


def mounted_files(workload: dict, container_name: str) -> dict[Path, tuple[str, str]]:
    """Path in the container -> (Secret name, key) for every Secret item it mounts."""
    volumes = {v["name"]: v for v in pod_spec(workload)["volumes"]}
    files = {}
    for mount in container(workload, container_name)["volumeMounts"]:
        secret = volumes[mount["name"]].get("secret")
        for item in (secret or {}).get("items", []):
            files[Path(mount["mountPath"]) / item["path"]] = (secret["secretName"], item["key"])
    return files


CHANNELS = {
    "kvstore-daemon": (),
    "inference-worker": ("kvstore_channel",),
    "scheduler": ("daemon_channel", "worker_channel"),
}


def test_tls_and_tokens_reach_every_service(rendered: dict[str, list[dict]], settings_classes) -> None:
    values = VALUE_SETS["tls"]
    secret, server_name = values["tls"]["secretName"], values["tls"]["serverName"]
    for component, (project, _) in PREFIXES.items():
        kind = "DaemonSet" if component == "kvstore-daemon" else "Deployment"
        workload = one(rendered["tls"], kind, component)
        settings = check_settings_env(settings_classes[project], settings_env(workload, component))
        files = mounted_files(workload, component)
        tls = settings.tls
        assert files[tls.cert_file] == (secret, "tls.crt") and files[tls.key_file] == (secret, "tls.key")
        assert files[tls.client_ca_file] == (secret, "ca.crt") and tls.require_client_cert
        for channel in (getattr(settings, name) for name in CHANNELS[component]):
            assert channel.tls and channel.server_name == server_name
            assert files[channel.ca_file] == (secret, "ca.crt")
            assert files[channel.cert_file] == (secret, "tls.crt")
            # Mutual TLS authenticates the workers; the scheduler adds the admin token.
            token = files[channel.token_file] if channel.token_file else None
            scheduler_token = (values["internalAuth"]["secretName"], "admin-token")
            assert token == (scheduler_token if component == "scheduler" else None)
        if component != "scheduler":
            admin_digests = tuple(values["internalAuth"]["adminTokenSha256"])
            assert settings.internal_auth.admin_token_sha256 == admin_digests
        health_port = port_number(container(workload, component), "grpc-health")
        assert tls.health_listen_address == f"0.0.0.0:{health_port}"
        assert container(workload, component)["readinessProbe"]["grpc"] == {"port": health_port}


def test_without_mutual_tls_workers_send_their_token(chart: helm.Chart, settings_classes) -> None:
    values = copy.deepcopy(VALUE_SETS["tls"])
    values["tls"]["mutual"] = False
    values["internalAuth"]["workerTokenSha256"] = ["ab" * 32]
    docs = render(chart, values)
    worker = one(docs, "Deployment", "inference-worker")
    worker_env = settings_env(worker, "inference-worker")
    settings = check_settings_env(settings_classes["inference-worker"], worker_env)
    channel = settings.kvstore_channel
    assert channel.cert_file is None and not settings.tls.require_client_cert
    token = mounted_files(worker, "inference-worker")[channel.token_file]
    assert token == (values["internalAuth"]["secretName"], "worker-token")
    daemon = one(docs, "DaemonSet", "kvstore-daemon")
    daemon_env = settings_env(daemon, "kvstore-daemon")
    daemon_settings = check_settings_env(settings_classes["kvstore-daemon"], daemon_env)
    assert daemon_settings.internal_auth.token_sha256 == ("ab" * 32,)
