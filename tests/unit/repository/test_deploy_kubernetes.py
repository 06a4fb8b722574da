"""The Helm chart deploy/helm/pyshuffle and the plain manifests rendered from it
(deploy/kubernetes/), checked without a cluster: helm lints and renders the chart, every object
validates against the Kubernetes schemas, and the pods agree with the daemon config they run.

Every check of the objects runs on two renders: the plain manifests as checked in (the chart's
defaults), and the chart with other values (TLS, a ServiceMonitor, the chart's own token Secret,
a tier store, a quota, extra variables, a service account, other ports, sizes and counts), so
that no value is right only by coincidence with a default.
What needs a cluster (helm's lookup keeping a generated token across upgrades, a real
Prometheus Operator) is not checked here."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import kubernetes_validate
import promql_parser
import pytest

from external_shuffle.ops.metrics import DaemonMetrics
from external_shuffle.options import (
    AUTH_TOKEN,
    AUTH_TOKEN_FILE,
    BIND_HOST,
    COORDINATOR_ADDRESS,
    COORDINATOR_PORT,
    COORDINATOR_STATUS_PORT,
    DAEMON_OPTIONS,
    METRICS_PORT,
    SHUTDOWN_GRACE,
    TLS_CA_FILE,
    TLS_CERT_FILE,
    TLS_KEY_FILE,
    WORKER_ADVERTISED_HOST,
    WORKER_APPLICATION_QUOTA,
    WORKER_DATA_PORT,
    WORKER_MEMORY_BUDGET,
    WORKER_PORT,
    WORKER_STORE_URL,
    WORKER_TIER_HIGH_WATER,
    WORKER_TIER_URL,
)
from shuffle_api.config import ENV_PREFIX, ConfigOption, Configuration
from shuffle_api.options import CORE_OPTIONS
from tests.kubernetes_manifests import (
    REPO,
    Document,
    Manifests,
    container,
    container_port,
    pod_spec,
    render_chart,
)
from tests.metric_samples import sample_names

CHART: Final = REPO / "deploy" / "helm" / "pyshuffle"
PLAIN: Final = REPO / "deploy" / "kubernetes"
HELM: Final = Path(sys.executable).parent / "helm"

# The oldest Kubernetes the chart is written for (Chart.yaml), and the newest schema bundled.
KUBERNETES_VERSIONS: Final = ("1.33.0", "1.37.0")
# Kinds without a schema in kubernetes_validate (custom resources), checked by hand below.
CUSTOM_KINDS: Final = {"ServiceMonitor", "PrometheusRule"}
DAEMON_ALL: Final[tuple[ConfigOption[Any], ...]] = (*CORE_OPTIONS, *DAEMON_OPTIONS)

# The tier store's credentials as a user passes them: a plain value and one from a Secret.
EXTRA_ENV: Final = (
    {"name": "AWS_REGION", "value": "eu-west-1"},
    {
        "name": "AWS_SECRET_ACCESS_KEY",
        "valueFrom": {"secretKeyRef": {"name": "shuffle-tier", "key": "secret-access-key"}},
    },
)
ROLE_ARN: Final = "arn:aws:iam::123456789012:role/pyshuffle-tier"

# The chart with every value that changes the objects set away from its default.
FULL_VALUES: Final = (
    "auth.existingSecret=",
    "auth.token=a-test-token-of-the-chart",
    "tls.enabled=true",
    "tls.secretName=pyshuffle-tls",
    "metrics.serviceMonitor.enabled=true",
    "metrics.serviceMonitor.labels.release=prometheus",
    "metrics.prometheusRule.enabled=true",
    "metrics.prometheusRule.labels.release=prometheus",
    "metrics.prometheusRule.storeFreeBelowGiB=20",
    "metrics.prometheusRule.authFailuresPer10m=3",
    "networkPolicy.enabled=true",
    "networkPolicy.clientPodSelector.matchLabels.spark-role=executor",
    "networkPolicy.clientNamespaces={etl,batch}",
    "networkPolicy.clientNamespaceSelector.matchLabels.team=data",
    "networkPolicy.monitoringNamespaceSelector.matchLabels.name=monitoring",
    "worker.replicas=5",
    "worker.port=7001",
    "worker.memoryBudgetMiB=3072",
    "worker.memoryOverheadMiB=1024",
    "worker.storage.storageClassName=local-ssd",
    "worker.applicationQuotaMiB=2048",
    "worker.tier.url=s3://shuffle-tier/pyshuffle",
    "worker.tier.highWaterMiB=40960",
    "extraEnv[0].name=AWS_REGION",
    "extraEnv[0].value=eu-west-1",
    "extraEnv[1].name=AWS_SECRET_ACCESS_KEY",
    "extraEnv[1].valueFrom.secretKeyRef.name=shuffle-tier",
    "extraEnv[1].valueFrom.secretKeyRef.key=secret-access-key",
    "serviceAccount.create=true",
    "serviceAccount.name=pyshuffle-daemons",
    rf"serviceAccount.annotations.eks\.amazonaws\.com/role-arn={ROLE_ARN}",
    "coordinator.replicas=3",
    "coordinator.serviceName=coordinators",
    "coordinator.port=7000",
    "coordinator.statusPort=-1",
    "config.metricsPort=7002",
    "config.shutdownGraceSeconds=60",
    "config.logLevel=debug",
    "imagePullSecrets[0]=registry",
)


def _helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(HELM), *args], capture_output=True, text=True, check=False)


def _render(tmp_path: Path, *values: str) -> Manifests:
    completed = render_chart(tmp_path, values)
    assert completed.returncode == 0, completed.stderr
    return Manifests.load(tmp_path)


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> Manifests:
    return _render(tmp_path_factory.mktemp("full"), *FULL_VALUES)


@pytest.fixture(params=["plain", "full"])
def manifests(request: pytest.FixtureRequest) -> Iterator[Manifests]:
    if request.param == "plain":
        yield Manifests.load(PLAIN)
    else:
        yield request.getfixturevalue("full")


def _config(manifests: Manifests, tmp_path: Path) -> Configuration:
    path = tmp_path / "daemon.toml"
    path.write_text(manifests.configmap_toml(), encoding="utf-8")
    return Configuration.load(toml_file=path, environ={})


def _mounted_files(workload: Document, secret_name: str, keys: set[str]) -> set[Path]:
    """The paths at which ``workload``'s container sees the ``keys`` of a Secret."""
    volumes = {
        volume["name"]: volume["secret"]
        for volume in pod_spec(workload)["volumes"]
        if volume.get("secret", {}).get("secretName") == secret_name
    }
    return {
        Path(mount["mountPath"]) / key
        for mount in container(workload)["volumeMounts"]
        if mount["name"] in volumes and "items" not in volumes[mount["name"]]
        for key in keys
    }


def _mebibytes(quantity: str) -> int:
    match = re.fullmatch(r"(\d+)(Mi|Gi)", quantity)
    assert match is not None, f"not a Mi/Gi quantity: {quantity}"
    return int(match.group(1)) * (1024 if match.group(2) == "Gi" else 1)


# --- the chart and the plain manifests ---------------------------------------------------------


def test_the_chart_passes_helm_lint() -> None:
    linted = _helm("lint", "--strict", str(CHART), "--kube-version", "1.33.0")
    assert linted.returncode == 0, linted.stdout + linted.stderr


def test_the_plain_manifests_are_the_chart_rendered_with_its_defaults() -> None:
    checked = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "render_manifests.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_plain_manifests_carry_no_token() -> None:
    # Applying deploy/kubernetes/ must never install a known token: users create the Secret.
    plain = Manifests.load(PLAIN)
    assert plain.objects("Secret") == []
    assert plain.token_secret_name() == "pyshuffle-token"
    assert "kubectl -n pyshuffle create secret generic pyshuffle-token" in (
        (REPO / "deploy" / "README.md").read_text(encoding="utf-8")
    )


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("coordinator.serviceName=pyshuffle-coordinator", "serviceName"),
        ("worker.replicas=0", "replicas"),
        ("coordinator.replicas=0", "replicas"),
        ("tls.enabled=true", "secretName"),
        ("worker.replica=3", "replica"),
        ("config.logFormat=xml", "logFormat"),
        ("config.logLevel=verbose", "logLevel"),
        ("worker.memoryBudgetMiB=1g", "memoryBudgetMiB"),
        ("coordinator.statusPort=0", "statusPort"),
        ("worker.applicationQuotaMiB=2g", "applicationQuotaMiB"),
        ("worker.tier.highWaterMiB=-1", "highWaterMiB"),
        ("networkPolicy.clientNamespaces={Spark_Jobs}", "clientNamespaces"),
        ("extraEnv[0].value=no-name", "extraEnv.0: name is required"),
    ],
)
def test_the_chart_refuses_bad_values(tmp_path: Path, value: str, complaint: str) -> None:
    completed = render_chart(tmp_path, [value])
    assert completed.returncode != 0
    assert complaint in completed.stderr
    assert not list(tmp_path.glob("*.yaml"))


def test_the_chart_makes_a_random_token_when_none_is_given(tmp_path: Path) -> None:
    tokens = []
    for attempt in ("first", "second"):
        rendered = _render(tmp_path / attempt, "auth.existingSecret=")
        secret = rendered.one("Secret")
        assert secret["metadata"]["name"] == rendered.token_secret_name()
        # helm uninstall keeps it: running Spark jobs and a reinstall hold this token.
        assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        tokens.append(secret["stringData"]["token"])
    assert all(len(token) >= 32 for token in tokens)
    assert tokens[0] != tokens[1]


def test_pods_restart_when_the_config_changes_and_only_then(tmp_path: Path) -> None:
    def checksums(rendered: Manifests) -> set[str]:
        return {
            workload["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
            for workload in rendered.workloads()
        }

    same = checksums(_render(tmp_path / "same", "worker.replicas=7"))
    changed = checksums(_render(tmp_path / "changed", "config.chunkSize=8m"))
    assert same == checksums(Manifests.load(PLAIN))
    assert len(same) == 1 and len(changed) == 1
    assert same != changed


# --- every object, in both renders ------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_validates_against_the_kubernetes_schema(
    manifests: Manifests, version: str
) -> None:
    for name, document in manifests.documents:
        if document["kind"] in CUSTOM_KINDS:
            continue
        validated = kubernetes_validate.validate(document, version, strict=True)
        assert validated == version.rsplit(".", 1)[0], (name, document["kind"])


def test_the_renders_define_the_expected_kinds(manifests: Manifests, full: Manifests) -> None:
    kinds = {document["kind"] for _, document in manifests.documents}
    expected = {"ConfigMap", "Service", "StatefulSet", "PodDisruptionBudget"}
    if manifests is full:
        expected |= {
            "Secret",
            "ServiceMonitor",
            "PrometheusRule",
            "NetworkPolicy",
            "ServiceAccount",
        }
    assert kinds == expected


def test_objects_leave_the_namespace_to_the_installer(manifests: Manifests) -> None:
    assert [doc for _, doc in manifests.documents if "namespace" in doc["metadata"]] == []


def test_the_coordinator_address_names_every_coordinator_pod(
    manifests: Manifests, tmp_path: Path
) -> None:
    coordinators = manifests.workload_of_role("coordinator")
    assert coordinators["spec"]["replicas"] >= 2
    assert coordinators["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    service = manifests.service_of(coordinators)
    # Names resolve before the pods are ready: a starting worker registers with each.
    assert service["spec"]["publishNotReadyAddresses"] is True
    config = _config(manifests, tmp_path)
    pods = [
        f"{coordinators['metadata']['name']}-{index}.{service['metadata']['name']}"
        for index in range(coordinators["spec"]["replicas"])
    ]
    port = container_port(coordinators, "grpc")
    assert config.get(COORDINATOR_ADDRESS).split(",") == [f"{pod}:{port}" for pod in pods]
    assert config.get(COORDINATOR_PORT) == port
    assert port in {item["port"] for item in service["spec"]["ports"]}


def test_workers_keep_their_store_on_a_claim_across_restarts(
    manifests: Manifests, tmp_path: Path
) -> None:
    workers = manifests.workload_of_role("worker")
    assert workers["kind"] == "StatefulSet"
    assert workers["spec"]["replicas"] >= 2
    claims = {claim["metadata"]["name"] for claim in workers["spec"]["volumeClaimTemplates"]}
    mounts = {m["mountPath"]: m["name"] for m in container(workers)["volumeMounts"]}
    store = _config(manifests, tmp_path).get(WORKER_STORE_URL)
    assert mounts.get(store) in claims, f"store-url {store!r} is not on a volumeClaimTemplate"


@pytest.mark.parametrize("role", ["coordinator", "worker"])
def test_daemons_are_stateful_sets_governed_by_a_headless_service(
    manifests: Manifests, role: str
) -> None:
    workload = manifests.workload_of_role(role)
    service = manifests.service_of(workload)
    assert workload["kind"] == "StatefulSet"
    assert workload["spec"]["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None"


def test_voluntary_disruptions_take_daemons_one_at_a_time(manifests: Manifests) -> None:
    budgets = manifests.objects("PodDisruptionBudget")
    for role in ("coordinator", "worker"):
        selector = manifests.workload_of_role(role)["spec"]["selector"]["matchLabels"]
        [budget] = [b for b in budgets if b["spec"]["selector"]["matchLabels"] == selector]
        assert budget["spec"]["maxUnavailable"] == 1, role
    assert len(budgets) == 2


def test_workers_advertise_their_pod_ip(manifests: Manifests) -> None:
    variable = WORKER_ADVERTISED_HOST.env_name
    env = {item["name"]: item for item in container(manifests.workload_of_role("worker"))["env"]}
    assert variable in env, f"the worker container does not set {variable}"
    assert env[variable]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


def test_every_pyshuffle_variable_in_the_pods_is_a_daemon_option(manifests: Manifests) -> None:
    known = {option.env_name for option in DAEMON_ALL}
    for workload in manifests.workloads():
        names = {item["name"] for item in container(workload).get("env", [])}
        assert {name for name in names if name.startswith(ENV_PREFIX)} <= known


def test_no_service_injects_pyshuffle_variables_into_pods(manifests: Manifests) -> None:
    # Kubernetes gives pods a NAME_SERVICE_HOST, NAME_PORT, ... variable for every Service of
    # their namespace; a PYSHUFFLE_* one is an unknown option to pyshuffle (Spark's pods too).
    for service in manifests.objects("Service"):
        prefix = re.sub(r"[^A-Za-z0-9]", "_", service["metadata"]["name"]).upper() + "_"
        assert not prefix.startswith(ENV_PREFIX), service["metadata"]["name"]
    for workload in manifests.workloads():
        assert pod_spec(workload)["enableServiceLinks"] is False, workload["metadata"]["name"]


def test_containers_run_unprivileged_on_a_read_only_root(manifests: Manifests) -> None:
    for workload in manifests.workloads():
        name = workload["metadata"]["name"]
        security = container(workload)["securityContext"]
        assert security["runAsNonRoot"] is True, name
        assert security["readOnlyRootFilesystem"] is True, name
        assert security["allowPrivilegeEscalation"] is False, name
        assert security["capabilities"]["drop"] == ["ALL"], name
        assert pod_spec(workload)["securityContext"]["runAsUser"] != 0, name
        assert pod_spec(workload)["automountServiceAccountToken"] is False, name


def test_containers_request_and_limit_cpu_and_memory(manifests: Manifests) -> None:
    for workload in manifests.workloads():
        resources = container(workload)["resources"]
        for bound in ("requests", "limits"):
            assert set(resources[bound]) >= {"cpu", "memory"}, workload["metadata"]["name"]


def test_the_workers_memory_is_their_budget_and_room_for_the_rest(
    manifests: Manifests, tmp_path: Path
) -> None:
    resources = container(manifests.workload_of_role("worker"))["resources"]
    limit = _mebibytes(resources["limits"]["memory"])
    budget = _config(manifests, tmp_path).get(WORKER_MEMORY_BUDGET) >> 20
    assert _mebibytes(resources["requests"]["memory"]) == limit
    # Python, pyarrow and gRPC need at least 1 GiB beside what the budget lets the worker hold.
    assert limit - budget >= 1024, (limit, budget)


def test_pods_outlive_the_daemons_shutdown_grace(manifests: Manifests, tmp_path: Path) -> None:
    grace = _config(manifests, tmp_path).get(SHUTDOWN_GRACE)
    for workload in manifests.workloads():
        period = pod_spec(workload)["terminationGracePeriodSeconds"]
        assert period > grace, f"{workload['metadata']['name']}: {period} s <= {grace} s"


def test_container_ports_are_the_ports_the_config_serves(
    manifests: Manifests, tmp_path: Path
) -> None:
    config = _config(manifests, tmp_path)
    coordinator = manifests.workload_of_role("coordinator")
    workers = manifests.workload_of_role("worker")
    assert container_port(coordinator, "grpc") == config.get(COORDINATOR_PORT)
    assert container_port(workers, "grpc") == config.get(WORKER_PORT)
    assert container_port(workers, "data") == config.get(WORKER_DATA_PORT)
    for workload in (coordinator, workers):
        assert container_port(workload, "metrics") == config.get(METRICS_PORT)
    ports = container(coordinator)["ports"]
    status = [port["containerPort"] for port in ports if port["name"] == "status"]
    expected = config.get(COORDINATOR_STATUS_PORT)
    assert status == ([] if expected == -1 else [expected])


def test_services_expose_the_container_ports(manifests: Manifests) -> None:
    for workload in manifests.workloads():
        service = manifests.service_of(workload)
        for port in service["spec"]["ports"]:
            target = port["targetPort"]
            number = container_port(workload, target) if isinstance(target, str) else target
            assert port["port"] == number, f"{service['metadata']['name']}: {port}"


def test_startup_asks_the_grpc_health_service_then_the_http_probes_follow(
    manifests: Manifests,
) -> None:
    for workload in manifests.workloads():
        probes = container(workload)
        assert probes["startupProbe"]["grpc"]["port"] == container_port(workload, "grpc")
        assert probes["startupProbe"]["grpc"].get("service", "") == ""
        for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
            http = probes[probe]["httpGet"]
            assert http["path"] == path, probe
            assert container_port(workload, http["port"]) == container_port(workload, "metrics")


def test_pods_are_annotated_for_prometheus_scraping(manifests: Manifests) -> None:
    for workload in manifests.workloads():
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert int(annotations["prometheus.io/port"]) == container_port(workload, "metrics")
        assert annotations["prometheus.io/path"] == "/metrics"


def test_configmap_toml_is_a_valid_daemon_config(manifests: Manifests, tmp_path: Path) -> None:
    config = _config(manifests, tmp_path)
    config.validate(DAEMON_ALL)
    assert config.contains(WORKER_STORE_URL)
    assert config.get(BIND_HOST) in ("0.0.0.0", "::")


def test_pods_mount_the_configmap_toml_they_are_started_with(manifests: Manifests) -> None:
    configmap = manifests.one("ConfigMap")["metadata"]["name"]
    for workload in manifests.workloads():
        args: list[str] = container(workload)["args"]
        config = Path(args[args.index("--config") + 1])
        volumes = {
            volume["name"]
            for volume in pod_spec(workload)["volumes"]
            if volume.get("configMap", {}).get("name") == configmap
        }
        mounted = [
            mount
            for mount in container(workload)["volumeMounts"]
            if mount["name"] in volumes and Path(mount["mountPath"]) == config.parent
        ]
        assert mounted, f"{workload['metadata']['name']} does not mount {config}"
        assert config.name in manifests.one("ConfigMap")["data"]


def test_the_token_file_is_inside_the_mounted_token_secret(
    manifests: Manifests, tmp_path: Path
) -> None:
    config = _config(manifests, tmp_path)
    assert not config.get(AUTH_TOKEN), "the token belongs in the Secret"
    name = manifests.token_secret_name()
    made = [secret for secret in manifests.objects("Secret") if secret["metadata"]["name"] == name]
    # A Secret the user creates holds the key "token" (deploy/README.md's kubectl command).
    keys = {*made[0].get("stringData", {}), *made[0].get("data", {})} if made else {"token"}
    for workload in manifests.workloads():
        files = _mounted_files(workload, name, keys)
        assert Path(config.get(AUTH_TOKEN_FILE)) in files, sorted(map(str, files))


# --- what only the full render has ------------------------------------------------------------


def test_tls_files_are_inside_the_mounted_tls_secret(full: Manifests, tmp_path: Path) -> None:
    config = _config(full, tmp_path)
    keys = {"tls.crt", "tls.key", "ca.crt"}
    for workload in full.workloads():
        files = _mounted_files(workload, "pyshuffle-tls", keys)
        for option in (TLS_CERT_FILE, TLS_KEY_FILE, TLS_CA_FILE):
            assert Path(config.get(option)) in files, (option.key, sorted(map(str, files)))


def test_the_plain_manifests_run_without_tls(tmp_path: Path) -> None:
    config = _config(Manifests.load(PLAIN), tmp_path)
    assert not config.get(TLS_CERT_FILE)
    for workload in Manifests.load(PLAIN).workloads():
        assert "tls" not in {volume["name"] for volume in pod_spec(workload)["volumes"]}


def test_the_service_monitor_scrapes_every_daemon(full: Manifests) -> None:
    monitor = full.one("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    selector = monitor["spec"]["selector"]["matchLabels"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    for workload in full.workloads():
        service = full.service_of(workload)
        assert selector.items() <= service["metadata"]["labels"].items()
        ports = {port["name"]: port for port in service["spec"]["ports"]}
        assert endpoint["port"] in ports
        target = ports[endpoint["port"]]["targetPort"]
        assert container_port(workload, target) == 7002


def _exported_metrics() -> set[str]:
    """Every sample name a daemon of both roles exports, or will once it has counted."""
    families = DaemonMetrics().registry.collect()
    return set().union(*(sample_names(family.name, family.type) for family in families))


def test_the_alert_rules_parse_and_watch_metrics_the_daemons_export(full: Manifests) -> None:
    rule = full.one("PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    (group,) = rule["spec"]["groups"]
    alerts = {entry["alert"]: entry for entry in group["rules"]}
    assert set(alerts) == {
        "PyshuffleCoordinatorDown",
        "PyshuffleWorkersDown",
        "PyshuffleStoreNearlyFull",
        "PyshuffleAuthenticationFailures",
        "PyshufflePushesRefused",
    }
    exported = _exported_metrics()
    for name, alert in alerts.items():
        promql_parser.parse(alert["expr"])  # raises on what Prometheus would refuse
        watched = set(re.findall(r"\bpyshuffle_\w+", alert["expr"]))
        assert watched and watched <= exported, (name, sorted(watched - exported))
        assert alert["labels"]["severity"] in ("warning", "critical")
        assert alert["annotations"]["summary"]
    # The values reach the thresholds.
    assert alerts["PyshuffleWorkersDown"]["expr"].endswith("< 5")
    assert alerts["PyshuffleStoreNearlyFull"]["expr"].endswith(f"< {20 << 30}")
    assert alerts["PyshuffleAuthenticationFailures"]["expr"].endswith("> 3")
    assert 'method="PushData"' in alerts["PyshufflePushesRefused"]["expr"]


def _policy_of(manifests: Manifests, workload: Document) -> Document:
    labels = workload["spec"]["template"]["metadata"]["labels"]
    [policy] = [
        policy
        for policy in manifests.objects("NetworkPolicy")
        if _selects(policy["spec"]["podSelector"], labels)
    ]
    return policy


def _selects(selector: Document, labels: Mapping[str, str]) -> bool:
    """Whether a Kubernetes label selector selects ``labels`` (``{}`` selects everything)."""
    terms: list[Document] = selector.get("matchExpressions", [])
    # The chart writes only In (a namespace by name); another operator would need reading here.
    assert all(term["operator"] == "In" for term in terms), terms
    return selector.get("matchLabels", {}).items() <= labels.items() and all(
        labels.get(term["key"]) in term["values"] for term in terms
    )


def _admits(policy: Document, port: str, pod: Mapping[str, str], namespace: str, home: str) -> bool:
    """Whether ``policy``, installed in namespace ``home``, lets a pod labelled ``pod`` in
    ``namespace`` reach ``port``, as Kubernetes reads a NetworkPolicy's peers."""
    # Kubernetes labels every namespace with its name.
    namespace_labels = {"kubernetes.io/metadata.name": namespace}
    for rule in policy["spec"]["ingress"]:
        if port not in {item["port"] for item in rule["ports"]}:
            continue
        for peer in rule["from"]:
            if "namespaceSelector" in peer:
                in_namespace = _selects(peer["namespaceSelector"], namespace_labels)
            else:
                in_namespace = namespace == home
            if in_namespace and _selects(peer.get("podSelector", {}), pod):
                return True
    return False


def _documented_namespaces() -> tuple[str, str]:
    """(pyshuffle's, Spark's): the namespaces deploy/README.md installs them in."""
    readme = (REPO / "deploy" / "README.md").read_text(encoding="utf-8")
    release = re.search(r"helm install pyshuffle deploy/helm/pyshuffle -n (\S+)", readme)
    spark = re.search(r"kubectl -n (\S+) create secret generic pyshuffle-token --from-file", readme)
    assert release is not None and spark is not None, "deploy/README.md's Kubernetes steps"
    return release.group(1), spark.group(1)


def test_network_policies_open_each_port_to_whom_it_is_for(full: Manifests) -> None:
    pyshuffle = {"app.kubernetes.io/name": "pyshuffle", "app.kubernetes.io/instance": "pyshuffle"}
    executors = {"matchLabels": {"spark-role": "executor"}}
    clients = [
        {"podSelector": executors},
        {
            "podSelector": executors,
            "namespaceSelector": {
                "matchExpressions": [
                    {
                        "key": "kubernetes.io/metadata.name",
                        "operator": "In",
                        "values": ["etl", "batch"],
                    }
                ]
            },
        },
        {"podSelector": executors, "namespaceSelector": {"matchLabels": {"team": "data"}}},
    ]
    monitoring = {"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}
    for workload, served, watched in (
        (full.workload_of_role("coordinator"), {"grpc"}, {"metrics"}),
        (full.workload_of_role("worker"), {"grpc", "data"}, {"metrics"}),
    ):
        policy = _policy_of(full, workload)
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        allowed = {
            port["port"]: rule["from"]
            for rule in policy["spec"]["ingress"]
            for port in rule["ports"]
        }
        # Every port the container serves, and none it does not (FULL_VALUES has no status page).
        assert set(allowed) == {port["name"] for port in container(workload)["ports"]}
        for name in served:
            assert allowed[name] == [*clients, {"podSelector": {"matchLabels": pyshuffle}}]
        for name in watched:
            assert allowed[name] == [monitoring]


def test_the_default_network_policies_admit_spark_where_the_docs_run_it(tmp_path: Path) -> None:
    release, spark = _documented_namespaces()
    assert spark != release, "the docs run Spark beside pyshuffle: nothing to check"
    executor = {"spark-role": "executor", "spark-app-selector": "spark-0123"}
    by_default = _render(tmp_path / "default", "networkPolicy.enabled=true")
    # A list given replaces the default whole.
    moved = _render(
        tmp_path / "moved", "networkPolicy.enabled=true", "networkPolicy.clientNamespaces={etl}"
    )
    for workload in by_default.workloads():
        for port in {item["name"] for item in container(workload)["ports"]} & {"grpc", "data"}:
            policy = _policy_of(by_default, workload)
            assert _admits(policy, port, executor, spark, release), (port, spark)
            assert _admits(policy, port, executor, release, release), (port, release)
            assert not _admits(policy, port, executor, "elsewhere", release), port
            policy = _policy_of(moved, workload)
            assert _admits(policy, port, executor, "etl", release), port
            assert not _admits(policy, port, executor, spark, release), port
            assert _admits(policy, port, executor, release, release), port


def test_values_reach_the_objects(full: Manifests, tmp_path: Path) -> None:
    workers = full.workload_of_role("worker")
    config = _config(full, tmp_path)
    assert workers["spec"]["replicas"] == 5
    assert config.get(WORKER_MEMORY_BUDGET) == 3072 << 20
    assert container(workers)["resources"]["limits"]["memory"] == "4096Mi"
    (claim,) = workers["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == "local-ssd"
    assert pod_spec(workers)["terminationGracePeriodSeconds"] == 75
    assert config.get(WORKER_APPLICATION_QUOTA) == 2048 << 20
    assert config.get(WORKER_TIER_URL) == "s3://shuffle-tier/pyshuffle"
    assert config.get(WORKER_TIER_HIGH_WATER) == 40960 << 20
    account = full.one("ServiceAccount")
    assert account["metadata"]["name"] == "pyshuffle-daemons"
    assert account["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": ROLE_ARN}
    assert account["automountServiceAccountToken"] is False
    for workload in full.workloads():
        assert pod_spec(workload)["imagePullSecrets"] == [{"name": "registry"}]
        # Both roles reach the tier: the workers move partitions, coordinators answer for them.
        assert pod_spec(workload)["serviceAccountName"] == "pyshuffle-daemons"
        env = container(workload)["env"]
        assert all(variable in env for variable in EXTRA_ENV), workload["metadata"]["name"]
    assert full.one("Secret")["stringData"]["token"] == "a-test-token-of-the-chart"


def test_the_plain_manifests_have_no_tier_quota_or_account_of_their_own(tmp_path: Path) -> None:
    plain = Manifests.load(PLAIN)
    config = _config(plain, tmp_path)
    assert not config.contains(WORKER_TIER_URL)
    assert not config.contains(WORKER_APPLICATION_QUOTA)
    assert plain.objects("ServiceAccount") == []
    for workload in plain.workloads():
        assert "serviceAccountName" not in pod_spec(workload), "the namespace's default"


@pytest.mark.parametrize(
    ("values", "made", "used"),
    [
        (("serviceAccount.create=true",), True, "pyshuffle"),
        (("serviceAccount.name=shared-identity",), False, "shared-identity"),
    ],
)
def test_pods_run_as_the_service_account_made_or_named(
    tmp_path: Path, values: tuple[str, ...], made: bool, used: str
) -> None:
    rendered = _render(tmp_path, *values)
    accounts = [account["metadata"]["name"] for account in rendered.objects("ServiceAccount")]
    assert accounts == ([used] if made else [])
    for workload in rendered.workloads():
        assert pod_spec(workload)["serviceAccountName"] == used
