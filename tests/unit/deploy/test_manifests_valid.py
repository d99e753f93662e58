"""Every Kubernetes manifest of deploy/k8s is valid: the built-in kinds against the Kubernetes schemas
(kubernetes-validate, strict: no unknown field) of the oldest version the manifests need (1.27: native gRPC probes
are GA there) and of the newest the package bundles; KEDA's ScaledObjects against tests/support/keda.py; the
kustomization names files that exist, each once."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from tests.support.keda import SCALED_OBJECT
from tests.support.scaling import K8S, manifests

VERSIONS = ("1.27.0", kubernetes_validate.latest_version())


def validate(doc: dict[str, Any]) -> None:
    if doc["kind"] == "ScaledObject":
        jsonschema.validate(doc, SCALED_OBJECT)
        return
    for version in VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


def resources() -> list[dict[str, Any]]:
    return [d for d in manifests() if d["kind"] != "Kustomization"]


@pytest.mark.parametrize("doc", resources(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_each_manifest_is_valid(doc: dict[str, Any]) -> None:
    validate(doc)


def test_the_kustomization_names_every_manifest_once() -> None:
    (kustomization,) = [d for d in manifests() if d["kind"] == "Kustomization"]
    listed = kustomization["resources"]
    assert len(listed) == len(set(listed))
    assert set(listed) == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}


def test_a_broken_manifest_is_refused() -> None:
    docs = {d["kind"]: d for d in resources()}
    deployment = copy.deepcopy(docs["Deployment"])
    deployment["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)
    misspelt = copy.deepcopy(docs["Deployment"])
    misspelt["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(misspelt)
    scaled = copy.deepcopy(docs["ScaledObject"])
    scaled["spec"]["minReplicas"] = 1
    with pytest.raises(jsonschema.ValidationError):
        validate(scaled)
    scaled = copy.deepcopy(docs["ScaledObject"])
    scaled["spec"]["triggers"][0]["metadata"]["threshold"] = 500
    with pytest.raises(jsonschema.ValidationError):
        validate(scaled)
