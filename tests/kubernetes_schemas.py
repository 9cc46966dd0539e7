"""Validate a custom resource the way the API server does on create, from its CRD's verbatim schema.

The CRD's `openAPIV3Schema` is a structural schema: the API server drops (and `kubectl apply`'s strict
field validation reports) every field the schema does not declare, so here an undeclared field is an error
(`additionalProperties: false` on each object without `x-kubernetes-preserve-unknown-fields`). Lists of
type `map` may not repeat a key, nor lists of type `set` an item. The CRD's `x-kubernetes-validations`
(CEL) rules are run by cel-python at every node of the document their schema node describes; transition
rules (those that read `oldSelf`) apply to updates only, as in the API server.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import celpy
import jsonschema
import yaml

# Where every developer and CI have the team's shared files (../shared/README.md).
SHARED_SCHEMAS = Path(__file__).resolve().parents[2] / "shared" / "schemas" / "kubeflow"
TRAINJOB_CRD = "trainer-v2.3.0-trainjobs.crd.yaml"
PYTORCHJOB_CRD = "training-operator-v1.9.4-pytorchjobs.crd.yaml"
TORCH_RUNTIME = "trainer-v2.3.0-torch-distributed-runtime.yaml"
# ObjectMeta is validated by the API server itself, not by the CRD (whose schema says `type: object`);
# these are the fields a manifest of ours may set.
OBJECT_META = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string"},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}


def shared_file(name: str) -> Path:
    return SHARED_SCHEMAS / name


@cache
def crd_schema(crd_file: str) -> dict:
    """The `openAPIV3Schema` of the CRD's served storage version."""
    crd = yaml.safe_load(shared_file(crd_file).read_text(encoding="utf-8"))
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    return version["schema"]["openAPIV3Schema"]


def _strict(node: dict) -> dict:
    node = dict(node)
    if node.get("nullable") and "type" in node:
        node["type"] = [node["type"], "null"]
    if node.get("type") == "object" and not node.get("x-kubernetes-preserve-unknown-fields"):
        node.setdefault("additionalProperties", False)
    for key in ("properties", "patternProperties"):
        if key in node:
            node[key] = {name: _strict(child) for name, child in node[key].items()}
    for key in ("items", "additionalProperties", "not"):
        if isinstance(node.get(key), dict):
            node[key] = _strict(node[key])
    for key in ("allOf", "anyOf", "oneOf"):
        if key in node:
            node[key] = [_strict(child) for child in node[key]]
    return node


@cache
def _validator(crd_file: str) -> jsonschema.Draft4Validator:
    schema = _strict(copy.deepcopy(crd_schema(crd_file)))
    schema["properties"]["metadata"] = OBJECT_META
    # OpenAPI 3.0's schema objects are JSON Schema draft 4/5 (boolean exclusiveMinimum and so on).
    return jsonschema.Draft4Validator(schema)


def schema_errors(document: dict, crd_file: str) -> list[str]:
    """What the API server would refuse in `document` against the CRD's structural schema."""
    errors = [
        f"{'.'.join(map(str, error.absolute_path)) or '<root>'}: {error.message}"
        for error in _validator(crd_file).iter_errors(document)
    ]
    return errors + list(_list_key_errors(crd_schema(crd_file), document, "<root>"))


def _children(schema: dict, value: object, path: str) -> Iterator[tuple[dict, object, str]]:
    if isinstance(value, dict):
        for key, child in value.items():
            child_schema = schema.get("properties", {}).get(key)
            if child_schema is None and isinstance(schema.get("additionalProperties"), dict):
                child_schema = schema["additionalProperties"]
            if child_schema is not None:
                yield child_schema, child, f"{path}.{key}"
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, child in enumerate(value):
            yield schema["items"], child, f"{path}[{index}]"


def _list_key_errors(schema: dict, value: object, path: str) -> Iterator[str]:
    if isinstance(value, list):
        list_type = schema.get("x-kubernetes-list-type")
        if list_type == "map":
            keys = [tuple(item.get(key) for key in schema["x-kubernetes-list-map-keys"]) for item in value]
            if len(set(keys)) < len(keys):
                yield f"{path}: duplicate keys {schema['x-kubernetes-list-map-keys']} in a map list: {keys}"
        elif list_type == "set" and len({yaml.safe_dump(item) for item in value}) < len(value):
            yield f"{path}: duplicate items in a set list"
    for child_schema, child, child_path in _children(schema, value, path):
        yield from _list_key_errors(child_schema, child, child_path)


def cel_rules(schema: dict, path: str = "<root>") -> Iterator[tuple[str, dict]]:
    """Every (schema path, rule) of the CRD: `.properties` steps as `.`, `items` as `[]`."""
    for rule in schema.get("x-kubernetes-validations", []):
        yield path, rule
    for name, child in schema.get("properties", {}).items():
        yield from cel_rules(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from cel_rules(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from cel_rules(schema["additionalProperties"], f"{path}{{}}")


def is_transition_rule(rule: dict) -> bool:
    return "oldSelf" in rule["rule"]


@cache
def _program(rule: str) -> celpy.Runner:
    environment = celpy.Environment()
    return environment.program(environment.compile(rule))


def cel_failures(schema: dict, document: object, path: str = "<root>") -> Iterator[tuple[str, dict]]:
    """(document path, rule) for each create-time CEL rule that `document` breaks."""
    for rule in schema.get("x-kubernetes-validations", []):
        if not is_transition_rule(rule):
            result = _program(rule["rule"]).evaluate({"self": celpy.json_to_cel(document)})
            if result != celpy.celtypes.BoolType(True):
                yield path, rule
    for child_schema, child, child_path in _children(schema, document, path):
        yield from cel_failures(child_schema, child, child_path)


def cel_rules_met(schema: dict, document: object, path: str = "<root>") -> Iterator[tuple[str, str]]:
    """(document path, rule) of every create-time rule that applies to a node of `document`."""
    for rule in schema.get("x-kubernetes-validations", []):
        if not is_transition_rule(rule):
            yield path, rule["rule"]
    for child_schema, child, child_path in _children(schema, document, path):
        yield from cel_rules_met(child_schema, child, child_path)
