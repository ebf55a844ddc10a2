package inject

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/handoff-dev/handoff/config"
)

// templatePaths is where each workload kind keeps its pod template; the
// pod itself is at the root.
var templatePaths = map[schema.GroupKind][]string{
	{Group: "", Kind: "Pod"}:                   {},
	{Group: "", Kind: "PodTemplate"}:           {"template"},
	{Group: "", Kind: "ReplicationController"}: {"spec", "template"},
	{Group: "apps", Kind: "Deployment"}:        {"spec", "template"},
	{Group: "apps", Kind: "StatefulSet"}:       {"spec", "template"},
	{Group: "apps", Kind: "DaemonSet"}:         {"spec", "template"},
	{Group: "apps", Kind: "ReplicaSet"}:        {"spec", "template"},
	{Group: "batch", Kind: "Job"}:              {"spec", "template"},
	{Group: "batch", Kind: "CronJob"}:          {"spec", "jobTemplate", "spec", "template"},
}

// Change is what Manifests did to one object.
type Change struct {
	Kind, Namespace, Name string
	Result                Result
	// Warnings are Warnings of the injected pod template.
	Warnings []string
}

// Manifests reads a stream of YAML documents, or of JSON objects, and
// writes it back with the pod template of every Pod, PodTemplate,
// ReplicationController, Deployment, StatefulSet, DaemonSet, ReplicaSet, Job
// and CronJob (and of the items of a List) injected as Pod does. Documents
// it does not change are written as they were read, comments and
// separators included; changed ones are written as YAML with sorted keys
// (their comments are lost). A template is read strictly: a field the
// Kubernetes API does not know is an error, not dropped. If any object
// cannot be injected, Manifests writes nothing and returns every object's
// errors, each prefixed with its kind and name. Input that is not UTF-8 is
// an error naming its line.
func Manifests(in io.Reader, out io.Writer, o Options) ([]Change, error) {
	raw, err := io.ReadAll(in)
	if err != nil {
		return nil, err
	}
	if !utf8.Valid(raw) {
		line := 1 + bytes.Count(raw[:invalidUTF8(raw)], []byte("\n"))
		return nil, fmt.Errorf("line %d: not UTF-8; YAML and JSON manifests are UTF-8", line)
	}
	var (
		buf     bytes.Buffer
		changes []Change
		errs    []error
		n       int
	)
	for _, doc := range splitDocuments(raw) {
		buf.Write(doc.separator)
		values, err := jsonValues(doc.body)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", n+1, err)
		}
		if values == nil { // YAML: the whole document is one value
			values = [][]byte{doc.body}
		}
		for i, v := range values {
			if i > 0 {
				buf.WriteString("---\n") // several JSON values: one document each
			}
			if isBlank(v) {
				buf.Write(v) // comments and blank lines, as read
				continue
			}
			n++
			obj := &unstructured.Unstructured{}
			if err := readObject(v, &obj.Object); err != nil {
				return nil, fmt.Errorf("document %d: %w", n, err)
			}
			c, changed, err := injectObject(obj, o)
			changes = append(changes, c...)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if !changed {
				buf.Write(v)
				if !bytes.HasSuffix(v, []byte("\n")) {
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
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	_, err = buf.WriteTo(out)
	return changes, err
}

// injectObject injects obj, or each item of a List (their maps are the
// List's, so injecting them changes it).
func injectObject(obj *unstructured.Unstructured, o Options) ([]Change, bool, error) {
	items := []*unstructured.Unstructured{obj}
	// A List is of kind List or <Kind>List; another object with a
	// top-level items array (a custom resource, say) is not one.
	if obj.IsList() && strings.HasSuffix(obj.GetKind(), "List") {
		items = nil
		if err := obj.EachListItem(func(item runtime.Object) error {
			items = append(items, item.(*unstructured.Unstructured))
			return nil
		}); err != nil {
			return nil, false, fmt.Errorf("%s: %w", obj.GetKind(), err)
		}
	}
	var (
		changes []Change
		errs    []error
		changed bool
	)
	for _, item := range items {
		c, err := object(item, o)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", orNone(c.Kind), objectName(c), err))
			continue
		}
		changes = append(changes, c)
		changed = changed || c.Result == Injected
	}
	return changes, changed, errors.Join(errs...)
}

// object injects the pod template of one object, if it has one that asks
// for it.
func object(obj *unstructured.Unstructured, o Options) (Change, error) {
	c := Change{Kind: obj.GetKind(), Namespace: obj.GetNamespace(), Name: obj.GetName(), Result: Skipped}
	path, known := templatePaths[obj.GroupVersionKind().GroupKind()]
	if !known {
		for _, p := range [][]string{{"spec", "template"}, {"template"}} {
			if a, _, _ := unstructured.NestedStringMap(obj.Object, append(p, "metadata", "annotations")...); a[AnnotationInject] == "true" {
				return c, fmt.Errorf("%s asks for injection, but handoff injects only Pods, PodTemplates, ReplicationControllers, apps/v1 Deployments, StatefulSets, DaemonSets, ReplicaSets and batch/v1 Jobs and CronJobs",
					orNone(obj.GetAPIVersion()+" "+obj.GetKind()))
			}
		}
		return c, nil
	}
	raw := obj.Object
	if len(path) > 0 {
		m, found, err := unstructured.NestedMap(obj.Object, path...)
		if err != nil || !found {
			return c, nil // no template (a patch, say): nothing to inject
		}
		raw = m
	}
	meta, _ := raw["metadata"].(map[string]any)
	annotations, _ := meta["annotations"].(map[string]any)
	strs := map[string]string{}
	for k, v := range annotations {
		str, isString := v.(string)
		if !isString && strings.HasPrefix(k, config.AnnotationPrefix) {
			return c, fmt.Errorf("annotation %s: %v is not a string (annotation values are quoted); want %s", k, v, orAny(AcceptedForm(k)))
		}
		strs[k] = str
	}
	// Decided before the template is read: one that does not ask for
	// injection is passed through, however loosely typed.
	labels, _, _ := unstructured.NestedStringMap(raw, "metadata", "labels")
	if res, err := wanted(labels, strs); res != "" || err != nil {
		c.Result = res
		return c, err
	}

	var t corev1.PodTemplateSpec
	tmpl := map[string]any{"metadata": raw["metadata"], "spec": raw["spec"]}
	if err := readTemplate(tmpl, &t); err != nil {
		return c, fmt.Errorf("reading the pod template: %w", err)
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
	outMeta, _ := out["metadata"].(map[string]any)
	if outMeta != nil && outMeta["creationTimestamp"] == nil {
		delete(outMeta, "creationTimestamp") // the converter's rendering of a zero time
	}
	raw["metadata"], raw["spec"] = outMeta, out["spec"]
	if len(path) > 0 {
		if err := unstructured.SetNestedMap(obj.Object, raw, path...); err != nil {
			return c, err
		}
	}
	c.Result, c.Warnings = Injected, Warnings(&t.Spec)
	return c, nil
}

// readObject reads one YAML (or JSON) value into a map, as the API
// machinery reads an object: an integer as an int64, exactly (through a
// float64, 9223372036854775807 became 9223372036854775808, then
// -9223372036854775808), and only another number as a float64.
func readObject(doc []byte, into *map[string]any) error {
	j, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return err
	}
	return sigsjson.UnmarshalCaseSensitivePreserveInts(j, into)
}

// readTemplate decodes a pod template strictly, as the API server reads a
// request: a field the API does not know, or one given twice, is an error,
// and so is a value of the wrong type or a number out of its field's range,
// each naming the field (like "cannot unmarshal number into Go struct field
// EnvVar.spec.containers.env.value of type string"). The unstructured
// converter said "unrecognized type: string" for the first and converted a
// number beyond int64 to -9223372036854775808.
func readTemplate(tmpl map[string]any, t *corev1.PodTemplateSpec) error {
	j, err := json.Marshal(tmpl)
	if err != nil {
		return err
	}
	strict, err := sigsjson.UnmarshalStrict(j, t)
	if err != nil {
		return err
	}
	if len(strict) > 0 {
		return runtime.NewStrictDecodingError(strict)
	}
	return nil
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

func orAny(form string) string {
	if form == "" {
		return "a quoted string"
	}
	return form
}

func orNone(s string) string {
	if strings.TrimSpace(s) == "" {
		return "(no kind)"
	}
	return s
}

// document is one YAML document: the separator line before it (kept as
// read, comment and all) and its body.
type document struct{ separator, body []byte }

var separatorLine = regexp.MustCompile(`^---(\s.*)?$`)

// splitDocuments splits a YAML stream at its "---" lines.
func splitDocuments(raw []byte) []document {
	var (
		docs []document
		cur  document
	)
	for _, line := range bytes.SplitAfter(raw, []byte("\n")) {
		if separatorLine.Match(bytes.TrimRight(line, "\r\n")) {
			docs = append(docs, cur)
			cur = document{separator: line}
			continue
		}
		cur.body = append(cur.body, line...)
	}
	return append(docs, cur)
}

// jsonValues splits a document that is a stream of JSON values; nil if it
// is not JSON.
func jsonValues(body []byte) ([][]byte, error) {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, nil
	}
	d := json.NewDecoder(bytes.NewReader(body))
	var values [][]byte
	for {
		var v json.RawMessage
		err := d.Decode(&v)
		if errors.Is(err, io.EOF) {
			return values, nil
		}
		if err != nil {
			return nil, err
		}
		values = append(values, append(v, '\n'))
	}
}

// invalidUTF8 is the offset of the first byte of raw that is not UTF-8.
func invalidUTF8(raw []byte) int {
	for i := 0; i < len(raw); {
		r, n := utf8.DecodeRune(raw[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return len(raw)
}

// isBlank reports whether a document holds only comments and blank lines.
func isBlank(doc []byte) bool {
	for _, line := range bytes.Split(doc, []byte("\n")) {
		l := bytes.TrimSpace(line)
		if len(l) > 0 && l[0] != '#' {
			return false
		}
	}
	return true
}
