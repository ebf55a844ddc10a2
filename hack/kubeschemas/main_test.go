package main

import (
	"encoding/json"
	"reflect"
	"testing"
)

// A Kubernetes-like swagger: a kind with a $ref, an int-or-string, and a
// definition that refers to itself.
const swagger = `{
 "io.k8s.api.apps.v1.Deployment": {
  "description": "dropped",
  "type": "object",
  "properties": {"apiVersion": {"type": "string"}, "spec": {"$ref": "#/definitions/io.k8s.api.apps.v1.DeploymentSpec"}},
  "x-kubernetes-group-version-kind": [{"group": "apps", "kind": "Deployment", "version": "v1"}]
 },
 "io.k8s.api.apps.v1.DeploymentSpec": {
  "type": "object",
  "properties": {"maxSurge": {"format": "int-or-string", "type": "string"}, "labels": {"type": "object", "additionalProperties": {"type": "string"}}, "props": {"$ref": "#/definitions/io.k8s.api.apps.v1.Props"}}
 },
 "io.k8s.api.apps.v1.Props": {"type": "object", "properties": {"not": {"$ref": "#/definitions/io.k8s.api.apps.v1.Props"}}},
 "io.k8s.api.core.v1.Service": {"type": "object", "properties": {"kind": {"type": "string"}},
  "x-kubernetes-group-version-kind": [{"group": "", "kind": "Service", "version": "v1"}]},
 "io.k8s.api.rbac.v1.Role": {"type": "object", "properties": {},
  "x-kubernetes-group-version-kind": [{"group": "rbac.authorization.k8s.io", "kind": "Role", "version": "v1"}]}
}`

func TestConvert(t *testing.T) {
	var defs map[string]map[string]any
	if err := json.Unmarshal([]byte(swagger), &defs); err != nil {
		t.Fatal(err)
	}
	out, err := convert(defs)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for n := range out {
		names = append(names, n)
	}
	for _, want := range []string{"deployment-apps-v1.json", "service-v1.json", "role-rbac-v1.json"} {
		if out[want] == nil {
			t.Errorf("no %s among %v (kubeconform's file names)", want, names)
		}
	}
	got, _ := json.Marshal(out["deployment-apps-v1.json"])
	want := `{"$schema":"http://json-schema.org/schema#","additionalProperties":false,"properties":{` +
		`"apiVersion":{"type":["string","null"]},` +
		`"spec":{"additionalProperties":false,"properties":{` +
		`"labels":{"additionalProperties":{"type":"string"},"type":["object","null"]},` +
		`"maxSurge":{"oneOf":[{"type":"string"},{"type":"integer"},{"type":"null"}]},` +
		`"props":{"additionalProperties":false,"properties":{"not":{}},"type":["object","null"]}},` +
		`"type":["object","null"]}},"type":"object"}`
	var a, b any
	_ = json.Unmarshal(got, &a)
	_ = json.Unmarshal([]byte(want), &b)
	if !reflect.DeepEqual(a, b) {
		t.Errorf("Deployment's schema:\n%s\nwant (refs inlined, a loop as {}, int-or-string either, strict, nullable fields, no descriptions):\n%s", got, want)
	}
}

func TestConvertRefusesAnUnknownRef(t *testing.T) {
	defs := map[string]map[string]any{"x.Kind": {"properties": map[string]any{"a": map[string]any{"$ref": "#/definitions/missing"}},
		"x-kubernetes-group-version-kind": []any{map[string]any{"group": "", "kind": "Kind", "version": "v1"}}}}
	if _, err := convert(defs); err == nil {
		t.Error("a $ref to no definition was taken")
	}
}
