package docs_test

import (
	"fmt"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/handoff-dev/handoff/protocol"
)

// The schemas of docs/protocol.yaml and the Go types they describe.
var schemaTypes = map[string]reflect.Type{
	"DrainStatus":   reflect.TypeFor[protocol.DrainStatus](),
	"ReturnRequest": reflect.TypeFor[protocol.ReturnRequest](),
	"ReturnResult":  reflect.TypeFor[protocol.ReturnResult](),
	"Leadership":    reflect.TypeFor[protocol.Leadership](),
	"LeadershipAck": reflect.TypeFor[protocol.LeadershipAck](),
	"Step":          reflect.TypeFor[protocol.Step](),
	"LeaseRelease":  reflect.TypeFor[protocol.LeaseRelease](),
	"Report":        reflect.TypeFor[protocol.Report](),
	"LeaseStatus":   reflect.TypeFor[protocol.LeaseStatus](),
	"Status":        reflect.TypeFor[protocol.Status](),
}

// Schemas without a Go struct: the app API's error body (package worker
// writes it) and the Outcome enum, checked with the other enums.
var otherSchemas = []string{"Error", "Outcome"}

// optionalOnTheWire are fields the Go type always sends that the protocol
// lets another sender leave out: `required` in protocol.yaml lists what
// every sender sends.
var optionalOnTheWire = map[string]string{
	"DrainStatus.receiving": "an app that does not count its waits leaves it out",
}

// The enums of the protocol's typed strings.
var enums = map[string][]string{
	"Outcome": {string(protocol.OutcomeDrained), string(protocol.OutcomeReturned), string(protocol.OutcomeCanceled),
		string(protocol.OutcomeAbandoned), string(protocol.OutcomeAppGone)},
	"Step.name": {string(protocol.StepTriggered), string(protocol.StepStopClaiming), string(protocol.StepDrained),
		string(protocol.StepDrainDeadline), string(protocol.StepClaimsHandled), string(protocol.StepRevoked),
		string(protocol.StepReleased), string(protocol.StepDone)},
	"Report.trigger":    {string(protocol.TriggerPreStop), string(protocol.TriggerSignal), string(protocol.TriggerDeletion)},
	"LeaseRelease.kind": {string(protocol.LeaseKindPartition), string(protocol.LeaseKindRole)},
	"LeaseStatus.kind":  {string(protocol.LeaseKindPartition), string(protocol.LeaseKindRole)},
	"Status.phase":      {string(protocol.PhaseRunning), string(protocol.PhaseShuttingDown), string(protocol.PhaseRearming), string(protocol.PhaseDone)},
}

type schema struct {
	Type       string             `json:"type"`
	Format     string             `json:"format"`
	Ref        string             `json:"$ref"`
	AllOf      []schema           `json:"allOf"`
	Items      *schema            `json:"items"`
	Enum       []string           `json:"enum"`
	Required   []string           `json:"required"`
	Properties map[string]*schema `json:"properties"`
	Default    any                `json:"default"`
	Desc       string             `json:"description"`
}

type document struct {
	Paths      map[string]map[string]any `json:"paths"`
	Components struct {
		Schemas map[string]*schema `json:"schemas"`
	} `json:"components"`
}

func readDoc(t *testing.T) document {
	t.Helper()
	b, err := os.ReadFile("protocol.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc document
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("docs/protocol.yaml: %v", err)
	}
	return doc
}

// TestProtocolYAMLMatchesTheGoTypes: every schema of docs/protocol.yaml has
// exactly the JSON fields of its Go type in package protocol, each of the
// Go field's type, required exactly when the Go type always sends it (no
// omitempty or omitzero; then without a default, and not called optional),
// else called optional; the typed strings' enums are the Go constants; its
// paths and their methods are the protocol's.
func TestProtocolYAMLMatchesTheGoTypes(t *testing.T) {
	doc := readDoc(t)
	var names []string
	for name := range doc.Components.Schemas {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if _, ok := schemaTypes[name]; !ok && !slices.Contains(otherSchemas, name) {
			t.Errorf("protocol.yaml schema %s has no Go type in package protocol", name)
		}
	}
	for name, typ := range schemaTypes {
		s := doc.Components.Schemas[name]
		if s == nil {
			t.Errorf("protocol.yaml has no schema %s for protocol.%s", name, typ.Name())
			continue
		}
		checkStruct(t, name, s, typ)
	}
	for key, want := range enums {
		var s *schema
		if schemaName, field, ok := strings.Cut(key, "."); ok {
			if p := doc.Components.Schemas[schemaName]; p != nil {
				s = p.Properties[field]
			}
		} else {
			s = doc.Components.Schemas[key]
		}
		if s == nil || !slices.Equal(s.Enum, want) {
			t.Errorf("protocol.yaml enum of %s = %v, want the Go constants %v, in their order", key, enumOf(s), want)
		}
	}
	wantPaths := []string{protocol.PreStopPath, protocol.StatusPath, protocol.StopClaimingPath, protocol.DrainPath,
		protocol.ReturnPath, protocol.LeasePathPrefix + "{lease}"}
	var paths []string
	for p := range doc.Paths {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	sort.Strings(wantPaths)
	if !slices.Equal(paths, wantPaths) {
		t.Errorf("protocol.yaml paths %v, want the protocol's %v", paths, wantPaths)
	}
	for p, ops := range doc.Paths {
		for _, m := range []string{"post", "get", "put", "delete", "patch", "head"} {
			if _, ok := ops[m]; ok && m != wantMethod[p] {
				t.Errorf("protocol.yaml %s %s: the protocol serves %s with %s only", strings.ToUpper(m), p, p, strings.ToUpper(wantMethod[p]))
			}
		}
		if _, ok := ops[wantMethod[p]]; !ok {
			t.Errorf("protocol.yaml %s has no %s", p, strings.ToUpper(wantMethod[p]))
		}
	}
}

var wantMethod = map[string]string{
	protocol.PreStopPath: "post", protocol.StatusPath: "get", protocol.StopClaimingPath: "post",
	protocol.DrainPath: "get", protocol.ReturnPath: "post", protocol.LeasePathPrefix + "{lease}": "put",
}

func enumOf(s *schema) any {
	if s == nil {
		return "no such schema"
	}
	return s.Enum
}

func checkStruct(t *testing.T, name string, s *schema, typ reflect.Type) {
	t.Helper()
	if s.Type != "object" {
		t.Errorf("protocol.yaml %s: type %q, want object", name, s.Type)
	}
	var required []string
	seen := map[string]bool{}
	for i := range typ.NumField() {
		f := typ.Field(i)
		tag := f.Tag.Get("json")
		jname, opts, _ := strings.Cut(tag, ",")
		if jname == "-" || !f.IsExported() {
			continue
		}
		if jname == "" {
			jname = f.Name
		}
		seen[jname] = true
		where := name + "." + jname
		p := s.Properties[jname]
		if p == nil {
			t.Errorf("protocol.yaml %s has no property %s (protocol.%s.%s)", name, jname, typ.Name(), f.Name)
			continue
		}
		if err := sameType(p, f.Type); err != nil {
			t.Errorf("protocol.yaml %s: %v", where, err)
		}
		omitted := strings.Contains(","+opts+",", ",omitempty,") || strings.Contains(","+opts+",", ",omitzero,")
		if !omitted && optionalOnTheWire[where] == "" {
			required = append(required, jname)
		}
	}
	for p := range s.Properties {
		if !seen[p] {
			t.Errorf("protocol.yaml %s has property %s, which protocol.%s does not have", name, p, typ.Name())
		}
	}
	for p, ps := range s.Properties {
		req := slices.Contains(s.Required, p)
		optional := strings.Contains(strings.ToLower(ps.Desc), "optional")
		switch {
		case req && ps.Default != nil:
			t.Errorf("protocol.yaml %s.%s is required and has a default %v: every sender sends it, so there is none to apply", name, p, ps.Default)
		case req && optional:
			t.Errorf("protocol.yaml %s.%s is required, yet its description calls it optional", name, p)
		case !req && !optional:
			t.Errorf("protocol.yaml %s.%s is not required: its description must say it is optional (omitted when zero)", name, p)
		}
	}
	got := slices.Clone(s.Required)
	sort.Strings(got)
	sort.Strings(required)
	if !slices.Equal(got, required) {
		t.Errorf("protocol.yaml %s required %v, want %v: the fields protocol.%s always sends (no omitempty or omitzero), but for %v", name, got, required, typ.Name(), optionalOnTheWire)
	}
}

var timeType = reflect.TypeFor[time.Time]()

// sameType says whether p describes values of the Go type t.
func sameType(p *schema, t reflect.Type) error {
	ref := p.Ref
	if ref == "" && len(p.AllOf) == 1 {
		ref = p.AllOf[0].Ref
	}
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == timeType:
		if p.Type != "string" || p.Format != "date-time" {
			return fmt.Errorf("type %q format %q, want string date-time (time.Time)", p.Type, p.Format)
		}
	case t.Kind() == reflect.Struct:
		if want := "#/components/schemas/" + t.Name(); ref != want {
			return fmt.Errorf("$ref %q, want %q", ref, want)
		}
	case t.Kind() == reflect.Slice:
		if p.Type != "array" || p.Items == nil {
			return fmt.Errorf("type %q, want an array", p.Type)
		}
		if err := sameType(p.Items, t.Elem()); err != nil {
			return fmt.Errorf("items: %w", err)
		}
	case t.Kind() == reflect.String && t.Name() != "string":
		// A typed string: its own schema (Outcome), or an enum in place.
		if ref != "" {
			if want := "#/components/schemas/" + t.Name(); ref != want {
				return fmt.Errorf("$ref %q, want %q", ref, want)
			}
		} else if p.Type != "string" || len(p.Enum) == 0 {
			return fmt.Errorf("type %q, want a string enum (protocol.%s)", p.Type, t.Name())
		}
	case t.Kind() == reflect.String:
		if p.Type != "string" {
			return fmt.Errorf("type %q, want string", p.Type)
		}
	case t.Kind() == reflect.Bool:
		if p.Type != "boolean" {
			return fmt.Errorf("type %q, want boolean", p.Type)
		}
	case t.Kind() == reflect.Int64:
		if p.Type != "integer" || p.Format != "int64" {
			return fmt.Errorf("type %q format %q, want integer int64", p.Type, p.Format)
		}
	case t.Kind() == reflect.Int:
		if p.Type != "integer" || p.Format != "" {
			return fmt.Errorf("type %q format %q, want integer without a format (a count)", p.Type, p.Format)
		}
	default:
		return fmt.Errorf("Go type %s not handled by this test", t)
	}
	return nil
}
