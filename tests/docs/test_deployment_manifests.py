"""The Kubernetes manifests in docs/deployment.md are valid YAML with the fields their kinds
require, every mount names a declared volume, image volumes are mounted read-only, and each
``ctbuild`` command in them parses with the real CLI. Written and checked, not run."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

DOC = Path(__file__).resolve().parents[2] / "docs" / "deployment.md"
BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)


def documents() -> list[dict]:
    """Whole manifests (with a kind); fragments showing a few fields are left out."""
    docs = [d for block in BLOCK.findall(DOC.read_text()) for d in yaml.safe_load_all(block)
            if isinstance(d, dict) and "kind" in d]
    assert docs, "no YAML manifests found in docs/deployment.md"
    return docs


def pod_spec(doc: dict) -> dict | None:
    """Where the kind keeps its pod spec (None: the kind has none)."""
    kind = doc["kind"]
    if kind == "Pod":
        return doc["spec"]
    if kind in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
        return doc["spec"]["template"]["spec"]
    if kind == "InferenceService":
        return doc["spec"]["predictor"]
    return None


def check_pod_spec(spec: dict, where: str) -> None:
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    assert len(volumes) == len(spec.get("volumes", [])), f"{where}: duplicate volume names"
    for v in volumes.values():
        sources = set(v) - {"name"}
        assert len(sources) == 1, f"{where}: volume {v['name']} needs exactly one source, has {sources}"
        if "image" in v:
            ref = v["image"]["reference"]
            assert "@sha256:" in ref or ":" in ref.rsplit("/", 1)[-1], f"{where}: image volume {ref} unpinned"
            assert v["image"].get("pullPolicy", "IfNotPresent") in ("Always", "IfNotPresent", "Never")
    containers = spec.get("containers")
    assert containers, f"{where}: no containers"
    for container in [*spec.get("initContainers", []), *containers]:
        assert container.get("name") and container.get("image"), f"{where}: a container needs name and image"
        for mount in container.get("volumeMounts", []):
            assert mount["name"] in volumes, f"{where}: mount {mount['name']} names no volume"
            assert mount["mountPath"].startswith("/"), f"{where}: mountPath must be absolute"
            if "image" in volumes[mount["name"]]:
                assert mount.get("readOnly") is True, f"{where}: image volume {mount['name']} must be read-only"
        for env in container.get("env", []):
            assert env.get("name") and ("value" in env or "valueFrom" in env), f"{where}: env entry incomplete"
        check_ctbuild_command(container, where)


def check_ctbuild_command(container: dict, where: str) -> None:
    """A ``ctbuild ...`` command (a list, or one line given to ``sh -c``) parses with the CLI."""
    from ctbuild.cli import build_parser

    words = [str(w) for w in [*container.get("command", []), *container.get("args", [])]]
    if words[:2] == ["sh", "-c"]:
        line = " ".join(words[2:])
        words = shlex.split(line) if not re.search(r"&&|\||;", line) else []
    if words[:1] != ["ctbuild"]:
        return
    try:
        build_parser(only=words[1]).parse_args(words[1:])
    except SystemExit:
        pytest.fail(f"{where}: `{' '.join(words)}` does not parse with the ctbuild CLI")


def test_deployment_manifests_are_well_formed():
    kinds = []
    for doc in documents():
        assert doc.get("apiVersion"), f"manifest without apiVersion: {doc}"
        where = f"{doc['kind']} {doc['metadata']['name']}"
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", doc["metadata"]["name"]), f"{where}: bad name"
        kinds.append(doc["kind"])
        spec = pod_spec(doc)
        if spec is not None:
            check_pod_spec(spec, where)
        if doc["kind"] == "Deployment":
            labels = doc["spec"]["template"]["metadata"]["labels"]
            assert doc["spec"]["selector"]["matchLabels"].items() <= labels.items(), f"{where}: selector"
        if doc["kind"] == "GKMCache":
            assert doc["apiVersion"] == "gkm.io/v1alpha1" and "@sha256:" in doc["spec"]["image"], where
        if doc["kind"] == "InferenceService":
            assert doc["apiVersion"] == "serving.kserve.io/v1beta1", where
        if doc["kind"] == "PersistentVolumeClaim":
            assert doc["spec"]["accessModes"] and doc["spec"]["resources"]["requests"]["storage"], where
    image_volumes = [d for d in documents() if pod_spec(d) and any("image" in v for v in pod_spec(d)["volumes"])]
    assert image_volumes, "the image-volume example is gone"
    assert {"GKMCache", "InferenceService", "Pod", "Deployment"} <= set(kinds)
