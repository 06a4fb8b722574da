"""Kubernetes manifests as the tests read them: deploy/kubernetes/ as checked in, or the Helm
chart rendered with other values (through scripts/render_manifests.py, the one renderer)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml  # type: ignore[import-untyped, unused-ignore]

__all__ = [
    "REPO",
    "Document",
    "Manifests",
    "container",
    "container_port",
    "pod_spec",
    "render_chart",
    "role_of",
]

Document = dict[str, Any]

REPO: Final = Path(__file__).resolve().parents[1]
RENDER_SCRIPT: Final = REPO / "scripts" / "render_manifests.py"


@dataclass(frozen=True)
class Manifests:
    """The documents of a directory of manifests, with what the tests look up in them."""

    documents: tuple[tuple[str, Document], ...]

    @classmethod
    def load(cls, directory: Path) -> Manifests:
        documents: list[tuple[str, Document]] = []
        for path in sorted(directory.glob("*.yaml")):
            with path.open(encoding="utf-8") as handle:
                documents += [(path.name, doc) for doc in yaml.safe_load_all(handle) if doc]
        return cls(tuple(documents))

    def objects(self, kind: str) -> list[Document]:
        return [document for _, document in self.documents if document["kind"] == kind]

    def one(self, kind: str) -> Document:
        found = self.objects(kind)
        assert len(found) == 1, f"expected one {kind}, found {len(found)}"
        return found[0]

    def workloads(self) -> list[Document]:
        return [*self.objects("Deployment"), *self.objects("StatefulSet")]

    def workload_of_role(self, role: str) -> Document:
        found = [workload for workload in self.workloads() if role_of(workload) == role]
        assert len(found) == 1, f"expected one workload with --role {role}, found {len(found)}"
        return found[0]

    def service_of(self, workload: Document) -> Document:
        found = [service for service in self.objects("Service") if selects(service, workload)]
        assert len(found) == 1, f"expected one Service for {workload['metadata']['name']}"
        return found[0]

    def configmap_toml(self, key: str = "pyshuffle-daemon.toml") -> str:
        data: Mapping[str, str] = self.one("ConfigMap")["data"]
        assert key in data, f"the ConfigMap has no {key}"
        return data[key]

    def token_secret_name(self) -> str:
        """The Secret every daemon pod mounts its token from."""
        names: set[str] = {
            volume["secret"]["secretName"]
            for workload in self.workloads()
            for volume in pod_spec(workload)["volumes"]
            if volume["name"] == "token"
        }
        assert len(names) == 1, f"the pods mount different token Secrets: {names}"
        return names.pop()


def pod_spec(workload: Document) -> Document:
    spec: Document = workload["spec"]["template"]["spec"]
    return spec


def container(workload: Document) -> Document:
    containers: list[Document] = pod_spec(workload)["containers"]
    assert len(containers) == 1, workload["metadata"]["name"]
    return containers[0]


def container_port(workload: Document, name: str) -> int:
    ports = {port["name"]: port["containerPort"] for port in container(workload)["ports"]}
    assert name in ports, f"{workload['metadata']['name']} has no port named {name!r}"
    port: int = ports[name]
    return port


def role_of(workload: Document) -> str:
    args: list[str] = container(workload)["args"]
    return args[args.index("--role") + 1]


def selects(service: Document, workload: Document) -> bool:
    selector: Mapping[str, str] = service["spec"]["selector"]
    labels: Mapping[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return all(labels.get(key) == value for key, value in selector.items())


def render_chart(out: Path, values: Iterable[str] = ()) -> subprocess.CompletedProcess[str]:
    """Render the chart into ``out`` with ``--set`` ``values`` (KEY=VALUE) over the plain ones."""
    command = [sys.executable, str(RENDER_SCRIPT), "--out", str(out)]
    for value in values:
        command += ["--set", value]
    return subprocess.run(command, capture_output=True, text=True, check=False)
