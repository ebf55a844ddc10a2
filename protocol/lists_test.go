package protocol_test

import (
	"go/ast"
	"go/parser"
	gotoken "go/token"
	"slices"
	"strconv"
	"testing"

	"github.com/handoff-dev/handoff/protocol"
)

// constsOf returns the values of the constants of type typ declared in
// protocol.go, in order.
func constsOf(t *testing.T, typ string) []string {
	t.Helper()
	f, err := parser.ParseFile(gotoken.NewFileSet(), "protocol.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != gotoken.CONST {
			continue
		}
		for _, s := range g.Specs {
			v := s.(*ast.ValueSpec)
			if id, ok := v.Type.(*ast.Ident); !ok || id.Name != typ {
				continue
			}
			for _, e := range v.Values {
				if lit, ok := e.(*ast.BasicLit); ok {
					s, _ := strconv.Unquote(lit.Value)
					out = append(out, s)
				}
			}
		}
	}
	return out
}

// Outcomes and Steps list every value declared: they are the label values
// the sidecar exports at 0, and an alert on a missing one would not fire.
func TestListsHoldEveryValue(t *testing.T) {
	var outcomes, steps []string
	for _, o := range protocol.Outcomes() {
		outcomes = append(outcomes, string(o))
	}
	for _, s := range protocol.Steps() {
		steps = append(steps, string(s))
	}
	if want := constsOf(t, "Outcome"); !slices.Equal(outcomes, want) || len(want) == 0 {
		t.Errorf("Outcomes() = %v, want the declared %v", outcomes, want)
	}
	if want := constsOf(t, "StepName"); !slices.Equal(steps, want) || len(want) == 0 {
		t.Errorf("Steps() = %v, want the declared %v", steps, want)
	}
}
