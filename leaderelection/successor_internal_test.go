package leaderelection

import (
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestWithSuccessor(t *testing.T) {
	lease := func(holder string, ann map[string]string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Annotations: ann}, Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder)}}
	}
	named := func(s string) func() string { return func() string { return s } }
	for _, tc := range []struct {
		name      string
		in        *coordinationv1.Lease
		successor func() string
		want      string // "" for no annotation
	}{
		{"release names the successor", lease("", nil), named("b_2"), "b_2"},
		{"release replaces an older name", lease("", map[string]string{AnnotationSuccessor: "c_3"}), named("b_2"), "b_2"},
		{"release naming none clears it", lease("", map[string]string{AnnotationSuccessor: "c_3"}), named(""), ""},
		{"release naming itself names none", lease("", nil), named("a_1"), ""},
		{"release without a Successor clears it", lease("", map[string]string{AnnotationSuccessor: "c_3", "other": "x"}), nil, ""},
		{"renewal clears it", lease("a_1", map[string]string{AnnotationSuccessor: "a_1"}), named("b_2"), ""},
		{"acquisition clears it", lease("b_2", map[string]string{AnnotationSuccessor: "b_2"}), nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.in.DeepCopy()
			out := withSuccessor(tc.in, "a_1", tc.successor)
			got, ok := out.Annotations[AnnotationSuccessor]
			if got != tc.want || ok != (tc.want != "") {
				t.Errorf("annotation = %q (set %t), want %q", got, ok, tc.want)
			}
			if tc.in.Annotations["other"] != "" && out.Annotations["other"] != "x" {
				t.Errorf("other annotations lost: %v", out.Annotations)
			}
			if !equalAnnotations(before.Annotations, tc.in.Annotations) {
				t.Errorf("the input was modified: %v, was %v", tc.in.Annotations, before.Annotations)
			}
		})
	}
}

func equalAnnotations(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
