"""Every kubernetes=yes render passes what the API server checks on `kubectl apply`: the TrainJob against
the official Kubeflow Trainer v2.3.0 CRD, the PyTorchJob against the Training Operator v1.9.4 CRD (both
verbatim in ../shared/schemas/kubeflow, with unknown fields refused), the CRDs' CEL rules, and
k8s/storage.yaml against Kubernetes' own schemas (kubernetes-validate, strict)."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest
import yaml
from conftest import require_rendered
from kubernetes_schemas import (
    PYTORCHJOB_CRD,
    SHARED_SCHEMAS,
    TRAINJOB_CRD,
    cel_failures,
    cel_rules,
    cel_rules_met,
    crd_schema,
    is_transition_rule,
    schema_errors,
)
from template_helpers import LONG_NAME, REPO

pytestmark = pytest.mark.skipif(
    not SHARED_SCHEMAS.is_dir(), reason=f"the Kubeflow schemas are not in {SHARED_SCHEMAS}"
)

BASE = {"kubernetes": "yes", "backend": "nccl", "precision": "bf16"}
CPU = {"gpus_per_node": "0", "backend": "gloo"}
RENDERS = {
    "cpu": {**BASE, **CPU, "model_type": "text-classification"},
    "1-gpu": {**BASE, "gpus_per_node": "1", "precision": "fp16", "model_type": "image-classification"},
    # A 60-character project name: the jobs' name is cut to 48.
    "8-gpus-x-2-nodes": {**BASE, "gpus_per_node": "8", "num_nodes": "2", "project_name": LONG_NAME},
    "fsdp2": {**BASE, "gpus_per_node": "8", "num_nodes": "4", "strategy": "fsdp2", "model_type": "causal-lm"},
    "lora": {**BASE, "gpus_per_node": "1", "num_nodes": "3", "finetune": "lora"},
    "custom-cpu-x-9": {**BASE, **CPU, "num_nodes": "9", "model_type": "custom"},
}
# The create-time CEL rules of the TrainJob CRD, quoted, and whether a rendered TrainJob can break them.
NAME_RULES = {
    "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')": "the job's name (a DNS-1035 label)",
    "size(self.metadata.name) <= 63": "the job's name (at most 63 characters)",
}
RULES_OF_FIELDS_NOT_RENDERED = {
    "self == '' || self.matches('^[A-Za-z][A-Za-z0-9+.-]*://.+$')": "spec.initializer.*.storageUri",
    "self in ['trainer.kubeflow.org/trainjob-controller', 'kueue.x-k8s.io/multikueue']": "spec.managedBy",
    "has(self.lastUpdatedTime)": "status.trainerStatus, written by the controller",
}


@pytest.fixture(scope="module")
def manifests(cookies_session):
    """`manifests(render)` -> {file name: [documents]} of k8s/, each render baked once per module."""
    baked = {}

    def _manifests(render: str) -> dict[str, list[dict]]:
        if render not in baked:
            result = cookies_session.bake(extra_context=RENDERS[render], template=str(REPO))
            project = require_rendered(result)
            baked[render] = {
                path.name: list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
                for path in sorted((project.path / "k8s").glob("*.yaml"))
            }
        return baked[render]

    return _manifests


@pytest.mark.parametrize("render", RENDERS)
def test_the_trainjob_passes_the_trainer_v2_crd(manifests, render):
    (trainjob,) = manifests(render)["trainjob.yaml"]
    assert schema_errors(trainjob, TRAINJOB_CRD) == []
    assert list(cel_failures(crd_schema(TRAINJOB_CRD), trainjob)) == []
    assert {rule for _, rule in cel_rules_met(crd_schema(TRAINJOB_CRD), trainjob)} == set(NAME_RULES)


@pytest.mark.parametrize("render", RENDERS)
def test_the_pytorchjob_passes_the_training_operator_v1_crd(manifests, render):
    (pytorchjob,) = manifests(render)["pytorchjob.yaml"]
    assert schema_errors(pytorchjob, PYTORCHJOB_CRD) == []
    assert list(cel_failures(crd_schema(PYTORCHJOB_CRD), pytorchjob)) == []


@pytest.mark.parametrize("render", RENDERS)
def test_the_storage_passes_kubernetes_own_schemas(manifests, render):
    documents = manifests(render)["storage.yaml"]
    assert [document["kind"] for document in documents] == ["PersistentVolumeClaim", "Pod"]
    for version in ("1.29.0", kubernetes_validate.latest_version()):
        for document in documents:
            kubernetes_validate.validate(document, version, strict=True)  # raises on an error


def test_every_cel_rule_of_the_trainjob_crd_is_known():
    """A new rule in a later CRD fails here until it is read and, where a render can break it, tested."""
    rules = [rule for _, rule in cel_rules(crd_schema(TRAINJOB_CRD))]
    create_time = {rule["rule"] for rule in rules if not is_transition_rule(rule)}
    assert create_time == NAME_RULES.keys() | RULES_OF_FIELDS_NOT_RENDERED.keys()
    # The rest compare with the stored object (`oldSelf`): an update may not change spec.trainer,
    # runtimeRef, runtimePatches' pods and so on. The README says to delete the TrainJob and apply again.
    assert {rule["rule"] for rule in rules if is_transition_rule(rule)} == {"self == oldSelf"}


def test_the_validators_refuse_what_the_api_server_refuses(manifests):
    """Each check can fail: a misspelt field, a wrong type, a repeated map key, and a name each CEL rule
    refuses."""
    (trainjob,) = manifests("cpu")["trainjob.yaml"]
    broken = copy.deepcopy(trainjob)
    broken["spec"]["trainer"]["numProcsPerNode"] = 1  # misspelt: the API server would drop it
    broken["spec"]["trainer"]["numNodes"] = "2"
    patched_jobs = broken["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    patched_jobs["replicatedJobs"].append({"name": "node"})
    errors = "\n".join(schema_errors(broken, TRAINJOB_CRD))
    assert "'numProcsPerNode' was unexpected" in errors
    assert "'2' is not of type 'integer'" in errors
    assert "duplicate keys ['name']" in errors
    for name, rule in [("Job-1", 0), ("x" * 64, 1)]:
        broken = {**trainjob, "metadata": {"name": name}}
        failed = [rule["rule"] for _, rule in cel_failures(crd_schema(TRAINJOB_CRD), broken)]
        assert failed == [list(NAME_RULES)[rule]], name
    (pytorchjob,) = manifests("cpu")["pytorchjob.yaml"]
    broken = copy.deepcopy(pytorchjob)
    container = broken["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    container["volumeMount"] = container.pop("volumeMounts")  # misspelt, deep in the pod template
    assert any("'volumeMount' was unexpected" in error for error in schema_errors(broken, PYTORCHJOB_CRD))
    claim = copy.deepcopy(manifests("cpu")["storage.yaml"][0])
    claim["spec"]["accessMode"] = ["ReadWriteMany"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(claim, kubernetes_validate.latest_version(), strict=True)
