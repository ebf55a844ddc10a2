// Command kubeschemas writes the JSON schemas kubeconform validates against
// for one Kubernetes version, offline: from api/openapi-spec/swagger.json of
// the k8s.io/kubernetes module of that version (the Go module proxy, or the
// module cache), in kubeconform's layout
// <out>/v<version>-standalone-strict/<kind>-<group>-<version>.json (core:
// <kind>-<version>.json), one file per kind the API serves. Each schema
// stands alone (every $ref inlined) and is strict: an object with
// properties accepts no other key, as kubeconform's -strict expects (the
// layout and rules of openapi2jsonschema --stand-alone --strict, which
// kubeconform's published schemas are made with). A finished directory is
// kept: a second run costs nothing.
//
// Usage: go run ./hack/kubeschemas -version v1.35.4 -out ~/.cache/handoff/kubeschemas
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

func main() {
	version := flag.String("version", "", "Kubernetes version, e.g. v1.35.4 (the k8s.io/kubernetes module's)")
	out := flag.String("out", "", "directory to write <version>-standalone-strict/ into")
	swagger := flag.String("swagger", "", "swagger.json to read instead of the module's")
	flag.Parse()
	if err := run(*version, *out, *swagger); err != nil {
		fmt.Fprintln(os.Stderr, "kubeschemas:", err)
		os.Exit(1)
	}
}

func run(version, out, swagger string) error {
	if !strings.HasPrefix(version, "v") || out == "" {
		return errors.New("want -version vX.Y.Z and -out DIR")
	}
	dir := filepath.Join(out, version+"-standalone-strict")
	done := filepath.Join(dir, ".complete")
	if _, err := os.Stat(done); err == nil {
		return nil
	}
	if swagger == "" {
		mod, err := moduleDir("k8s.io/kubernetes@" + version)
		if err != nil {
			return err
		}
		swagger = filepath.Join(mod, "api", "openapi-spec", "swagger.json")
	}
	data, err := os.ReadFile(swagger)
	if err != nil {
		return err
	}
	var spec struct {
		Definitions map[string]map[string]any `json:"definitions"`
	}
	if err := json.Unmarshal(data, &spec); err != nil {
		return fmt.Errorf("%s: %w", swagger, err)
	}
	schemas, err := convert(spec.Definitions)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, s := range schemas {
		b, err := json.Marshal(s)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "kubeschemas: %d schemas of Kubernetes %s in %s\n", len(schemas), version, dir)
	return os.WriteFile(done, nil, 0o644)
}

// moduleDir downloads (or finds in the module cache) a module and returns
// its directory.
func moduleDir(module string) (string, error) {
	cmd := exec.Command("go", "mod", "download", "-json", module)
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	cmd.Stderr = os.Stderr
	b, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s: %w", module, err)
	}
	var m struct{ Dir, Error string }
	if err := json.Unmarshal(b, &m); err != nil {
		return "", err
	}
	if m.Error != "" || m.Dir == "" {
		return "", fmt.Errorf("go mod download %s: %s", module, m.Error)
	}
	return m.Dir, nil
}

// convert makes one standalone strict schema per group, version and kind of
// the definitions, keyed by kubeconform's file name.
func convert(defs map[string]map[string]any) (map[string]any, error) {
	out := map[string]any{}
	for name, def := range defs {
		gvks, _ := def["x-kubernetes-group-version-kind"].([]any)
		for _, g := range gvks {
			gvk, _ := g.(map[string]any)
			group, _ := gvk["group"].(string)
			version, _ := gvk["version"].(string)
			kind, _ := gvk["kind"].(string)
			if version == "" || kind == "" {
				return nil, fmt.Errorf("%s: a group-version-kind without version or kind: %v", name, gvk)
			}
			file := strings.ToLower(kind)
			if group != "" {
				file += "-" + strings.ToLower(strings.Split(group, ".")[0])
			}
			file += "-" + strings.ToLower(version) + ".json"
			s, err := inline(def, defs, map[string]bool{name: true})
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			root := s.(map[string]any)
			root["$schema"] = "http://json-schema.org/schema#"
			out[file] = root
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no definition has x-kubernetes-group-version-kind")
	}
	return out, nil
}

const refPrefix = "#/definitions/"

// inline returns a copy of schema v with every $ref replaced by its
// definition (a reference back into a definition being inlined, as in
// JSONSchemaProps, becomes {}: anything), descriptions dropped, and the
// strict rules of strictify applied.
func inline(v any, defs map[string]map[string]any, stack map[string]bool) (any, error) {
	switch t := v.(type) {
	case map[string]any:
		if ref, ok := t["$ref"].(string); ok {
			name, found := strings.CutPrefix(ref, refPrefix)
			def, known := defs[name]
			if !found || !known {
				return nil, fmt.Errorf("unknown $ref %s", ref)
			}
			if stack[name] {
				return map[string]any{}, nil
			}
			stack[name] = true
			defer delete(stack, name)
			return inline(def, defs, stack)
		}
		m := make(map[string]any, len(t))
		for k, val := range t {
			if k == "description" || strings.HasPrefix(k, "x-kubernetes-") {
				continue
			}
			if k == "properties" {
				props := map[string]any{}
				for pk, pv := range val.(map[string]any) {
					c, err := inline(pv, defs, stack)
					if err != nil {
						return nil, err
					}
					props[pk] = nullable(c)
				}
				m[k] = props
				continue
			}
			c, err := inline(val, defs, stack)
			if err != nil {
				return nil, err
			}
			m[k] = c
		}
		return strictify(m), nil
	case []any:
		s := make([]any, len(t))
		for i, e := range t {
			c, err := inline(e, defs, stack)
			if err != nil {
				return nil, err
			}
			s[i] = c
		}
		return s, nil
	default:
		return v, nil
	}
}

// strictify turns the OpenAPI forms JSON Schema lacks into JSON Schema:
// int-or-string is either; an object with properties and no
// additionalProperties accepts no other key (kubeconform -strict).
func strictify(m map[string]any) map[string]any {
	if m["format"] == "int-or-string" {
		delete(m, "format")
		delete(m, "type")
		m["oneOf"] = []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}}
	}
	if _, ok := m["properties"]; ok {
		if _, set := m["additionalProperties"]; !set {
			m["additionalProperties"] = false
		}
	}
	return m
}

// nullable lets a property also be null, as a field left empty in YAML
// (key: with no value) decodes, and as the API server takes it.
func nullable(v any) any {
	m, ok := v.(map[string]any)
	if !ok {
		return v
	}
	switch t := m["type"].(type) {
	case string:
		m["type"] = []any{t, "null"}
	case nil:
		if one, ok := m["oneOf"].([]any); ok {
			m["oneOf"] = append(one, map[string]any{"type": "null"})
		}
	}
	return m
}
