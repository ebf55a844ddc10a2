package inject

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// templatePaths is where each workload kind keeps its pod template; the
// pod itself is at the root.
var templatePaths = map[schema.GroupKind][]string{
	{Group: "", Kind: "Pod"}:             {},
	{Group: "apps", Kind: "Deployment"}:  {"spec", "template"},
	{Group: "apps", Kind: "StatefulSet"}: {"spec", "template"},
	{Group: "apps", Kind: "DaemonSet"}:   {"spec", "template"},
	{Group: "apps", Kind: "ReplicaSet"}:  {"spec", "template"},
	{Group: "batch", Kind: "Job"}:        {"spec", "template"},
	{Group: "batch", Kind: "CronJob"}:    {"spec", "jobTemplate", "spec", "template"},
}

// Change is what Manifests did to one object.
type Change struct {
	Kind, Namespace, Name string
	Result                Result
}

// Manifests reads a stream of YAML documents (or JSON objects) and writes
// it back with every pod template of a Pod, Deployment, StatefulSet,
// DaemonSet, ReplicaSet, Job or CronJob injected as Pod does, including
// the items of a List. Documents it does not change are written as they
// were read; changed ones are written as YAML with sorted keys (comments in
// them are lost). If any object cannot be injected it writes nothing and
// returns every object's errors, each prefixed with its kind and name.
func Manifests(in io.Reader, out io.Writer, o Options) ([]Change, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(in))
	var (
		buf     bytes.Buffer
		changes []Change
		errs    []error
		docs    int
	)
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading document %d: %w", docs+1, err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		docs++
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(doc, &obj.Object); err != nil {
			return nil, fmt.Errorf("document %d: %w", docs, err)
		}
		changed := false
		items := []*unstructured.Unstructured{obj}
		if obj.IsList() { // the items share the list's maps: injecting them changes it
			items = nil
			if err := obj.EachListItem(func(item runtime.Object) error {
				items = append(items, item.(*unstructured.Unstructured))
				return nil
			}); err != nil {
				return nil, fmt.Errorf("document %d: %w", docs, err)
			}
		}
		for _, item := range items {
			c, err := object(item, o)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s %s: %w", c.Kind, objectName(c), err))
				continue
			}
			changes = append(changes, c)
			changed = changed || c.Result == Injected
		}
		if docs > 1 {
			buf.WriteString("---\n")
		}
		if !changed {
			buf.Write(bytes.TrimLeft(doc, "\n"))
			if !bytes.HasSuffix(doc, []byte("\n")) {
				buf.WriteByte('\n')
			}
			continue
		}
		y, err := yaml.Marshal(obj.Object)
		if err != nil {
			return nil, err
		}
		buf.Write(y)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	_, err := buf.WriteTo(out)
	return changes, err
}

// object injects the pod template of one object, if its kind has one.
func object(obj *unstructured.Unstructured, o Options) (Change, error) {
	c := Change{Kind: obj.GetKind(), Namespace: obj.GetNamespace(), Name: obj.GetName(), Result: Skipped}
	path, ok := templatePaths[obj.GroupVersionKind().GroupKind()]
	if !ok {
		return c, nil
	}
	raw := obj.Object
	if len(path) > 0 {
		m, found, err := unstructured.NestedMap(obj.Object, path...)
		if err != nil || !found {
			return c, fmt.Errorf("%s: no pod template", strings.Join(path, "."))
		}
		raw = m
	}
	var t corev1.PodTemplateSpec
	tmpl := map[string]any{"metadata": raw["metadata"], "spec": raw["spec"]}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(tmpl, &t); err != nil {
		return c, err
	}
	res, err := Pod(&t.ObjectMeta, &t.Spec, o)
	if err != nil || res != Injected {
		c.Result = res
		return c, err
	}
	out, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&t)
	if err != nil {
		return c, err
	}
	meta, _ := out["metadata"].(map[string]any)
	if meta != nil && meta["creationTimestamp"] == nil {
		delete(meta, "creationTimestamp") // the converter's rendering of a zero time
	}
	raw["metadata"], raw["spec"] = meta, out["spec"]
	if len(path) > 0 {
		if err := unstructured.SetNestedMap(obj.Object, raw, path...); err != nil {
			return c, err
		}
	}
	c.Result = Injected
	return c, nil
}

func objectName(c Change) string {
	switch {
	case c.Name == "":
		return "(unnamed)"
	case c.Namespace == "":
		return c.Name
	}
	return c.Namespace + "/" + c.Name
}

// stripComments drops whole-line YAML comments, to tell an empty document.
func stripComments(doc []byte) []byte {
	var b bytes.Buffer
	for _, line := range bytes.Split(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			b.Write(line)
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}
