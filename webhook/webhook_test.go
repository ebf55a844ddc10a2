package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/handoff-dev/handoff/inject"
	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/webhook"
)

// config is the chart's MutatingWebhookConfiguration in brief; envtest
// points its service at the test's server.
var config = &admissionregistrationv1.MutatingWebhookConfiguration{
	ObjectMeta: metav1.ObjectMeta{Name: "handoff"},
	Webhooks: []admissionregistrationv1.MutatingWebhook{{
		Name: "inject.handoff.dev",
		ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{
			Name: "handoff-webhook", Namespace: "handoff", Path: ptr.To(webhook.Path)}},
		Rules: []admissionregistrationv1.RuleWithOperations{{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
		}},
		FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
		SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
		AdmissionReviewVersions: []string{"v1"},
	}},
}

// testVersion is the injector's version in these tests.
const testVersion = "v0.3.0-test.1"

var (
	registry = prometheus.NewRegistry()
	injector = webhook.NewInjector(inject.Options{Image: "handoff:test", ImagePullPolicy: corev1.PullNever, Version: testVersion}, registry, logr.Discard())
)

func TestMain(m *testing.M) {
	kubetest.Run(m, kubetest.WithMutatingWebhooks(config), kubetest.WithSetup(serve))
}

// serve runs the webhook server where envtest sends admission requests, and
// a kube-controller-manager that makes a Deployment's pods.
func serve(env *kubetest.Env) (func(), error) {
	srv := ctrlwebhook.NewServer(ctrlwebhook.Options{
		Host: env.Webhook.LocalServingHost, Port: env.Webhook.LocalServingPort, CertDir: env.Webhook.LocalServingCertDir})
	injector.Register(srv)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var serveErr error
	go func() { serveErr = srv.Start(ctx); close(done) }()
	for deadline := time.Now().Add(10 * time.Second); srv.StartedChecker()(nil) != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			cancel()
			<-done
			return nil, errors.Join(errors.New("webhook server did not start"), serveErr)
		}
	}
	stopKCM, err := env.StartControllerManager("deployment", "replicaset")
	if err != nil {
		cancel()
		return nil, err
	}
	return func() { stopKCM(); cancel(); <-done }, nil
}

func newPod(name string, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "worker", Image: "worker:1"}}},
	}
}

func names(cs []corev1.Container) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}

// checkInjected asserts the documented shape of an injected pod.
func checkInjected(t *testing.T, pod *corev1.Pod, leases string) {
	t.Helper()
	if got := strings.Join(names(pod.Spec.InitContainers), ","); got != "handoff-install,handoff" {
		t.Fatalf("init containers %s, want handoff-install,handoff", got)
	}
	if pod.Annotations[inject.AnnotationStatus] != inject.StatusInjected {
		t.Errorf("annotation %s = %q", inject.AnnotationStatus, pod.Annotations[inject.AnnotationStatus])
	}
	if pod.Annotations[inject.AnnotationVersion] != testVersion || pod.Labels[inject.LabelVersion] != testVersion {
		t.Errorf("annotation %s = %q, label %s = %q; want the injector's version %s in both",
			inject.AnnotationVersion, pod.Annotations[inject.AnnotationVersion], inject.LabelVersion, pod.Labels[inject.LabelVersion], testVersion)
	}
	sidecar := pod.Spec.InitContainers[1]
	if sidecar.RestartPolicy == nil || *sidecar.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Error("sidecar is not a native sidecar (restartPolicy Always)")
	}
	env := map[string]string{}
	for _, e := range sidecar.Env {
		env[e.Name] = e.Value
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			env[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	if env["HANDOFF_LEASES"] != leases || env["HANDOFF_POD_UID"] != "metadata.uid" || env["HANDOFF_GRACE_PERIOD"] != "30s" {
		t.Errorf("sidecar env %v", env)
	}
	if !tokenIn(sidecar) || tokenIn(pod.Spec.Containers[0]) || tokenIn(pod.Spec.InitContainers[0]) || ptr.Deref(pod.Spec.AutomountServiceAccountToken, true) {
		t.Errorf("service account token: in the sidecar %t, the worker %t, the install step %t, automount %v; want the sidecar's alone",
			tokenIn(sidecar), tokenIn(pod.Spec.Containers[0]), tokenIn(pod.Spec.InitContainers[0]), pod.Spec.AutomountServiceAccountToken)
	}
	w := pod.Spec.Containers[0]
	if w.Lifecycle == nil || w.Lifecycle.PreStop == nil || w.Lifecycle.PreStop.Exec == nil ||
		w.Lifecycle.PreStop.Exec.Command[0] != inject.BinDir+"/handoff" {
		t.Errorf("worker preStop %+v, want exec of %s/handoff", w.Lifecycle, inject.BinDir)
	}
}

// A pod that says which version it runs, by annotation and label, is
// injected with the injector's version in both: a pod cannot pass for
// another sidecar version, so the count `handoff version` makes holds.
func TestInjectedPodCannotClaimAVersion(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	p := newPod("claims", map[string]string{"handoff.dev/inject": "true", "handoff.dev/leases": "work", inject.AnnotationVersion: "v9.9.9"})
	p.Labels = map[string]string{inject.LabelVersion: "v9.9.9"}
	pod, err := env.Client.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkInjected(t, pod, "work")
	pods, err := env.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: inject.LabelVersion + "=" + testVersion})
	if err != nil || len(pods.Items) != 1 {
		t.Errorf("pods selected by %s=%s: %v, %v; want the one injected", inject.LabelVersion, testVersion, pods, err)
	}
}

func TestAnnotatedPodIsInjected(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	pod, err := env.Client.CoreV1().Pods(ns).Create(context.Background(),
		newPod("worker", map[string]string{"handoff.dev/inject": "true", "handoff.dev/leases": "work"}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkInjected(t, pod, "work")
}

// tokenIn reports whether c mounts a volume at the service account token's
// path.
func tokenIn(c corev1.Container) bool {
	for _, m := range c.VolumeMounts {
		if m.MountPath == inject.TokenMountPath {
			return true
		}
	}
	return false
}

// warnings collects the warnings the apiserver answers with.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, msg string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, msg)
}

// The token is the sidecar's alone, also when the API server's
// ServiceAccount admission plugin (off in envtest, so stood in for here)
// mounted it into the worker before the webhook: the pod is admitted with
// no automount, the worker without that mount. A pod with
// automountServiceAccountToken false is injected as well. A pod that asks
// for the token everywhere keeps it, and its creator is warned.
func TestOnlyTheSidecarHoldsTheToken(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	automounted := newPod("automounted", map[string]string{"handoff.dev/inject": "true"})
	v := inject.TokenVolume()
	v.Name = "kube-api-access-abcde"
	automounted.Spec.Volumes = []corev1.Volume{v}
	automounted.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: v.Name, MountPath: inject.TokenMountPath, ReadOnly: true}}
	off := newPod("off", map[string]string{"handoff.dev/inject": "true"})
	off.Spec.AutomountServiceAccountToken = ptr.To(false)
	for _, p := range []*corev1.Pod{automounted, off} {
		got, err := env.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("%s: %v", p.Name, err)
		}
		checkInjected(t, got, "")
		for _, v := range got.Spec.Volumes {
			if v.Name == "kube-api-access-abcde" {
				t.Errorf("%s: the automounted token volume is still there", p.Name)
			}
		}
	}

	var warned warnings
	cfg := rest.CopyConfig(env.Config)
	cfg.WarningHandler = &warned
	on := newPod("on", map[string]string{"handoff.dev/inject": "true"})
	on.Spec.AutomountServiceAccountToken = ptr.To(true)
	got, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().Pods(ns).Create(ctx, on, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !ptr.Deref(got.Spec.AutomountServiceAccountToken, false) {
		t.Error("automountServiceAccountToken true was changed")
	}
	if len(warned.msgs) != 1 || !strings.Contains(warned.msgs[0], "spec.automountServiceAccountToken true: every container of the pod holds the service account's token") {
		t.Errorf("warnings %q; want one on automountServiceAccountToken true", warned.msgs)
	}
}

func TestInvalidAnnotationsAreRefusedByName(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	before := outcomes(t, webhook.OutcomeRefused)
	invalid := counter(t, "handoff_webhook_refusals_total", string(inject.ReasonInvalidAnnotation))
	_, err := env.Client.CoreV1().Pods(ns).Create(context.Background(), newPod("bad", map[string]string{
		"handoff.dev/inject": "true", "handoff.dev/layout": "sideways", "handoff.dev/lease-duration": "fast"}), metav1.CreateOptions{})
	if err == nil {
		t.Fatal("created; want the webhook to refuse it")
	}
	for _, want := range []string{`handoff.dev/layout: "sideways" is not accepted; want "native" or "legacy"`,
		"handoff.dev/lease-duration", `"fast"`, "a duration of at least 2s"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
	if got := outcomes(t, webhook.OutcomeRefused); got != before+1 {
		t.Errorf("refused count %v, want %v", got, before+1)
	}
	// Two invalid annotations, one cause: counted once.
	if got := counter(t, "handoff_webhook_refusals_total", string(inject.ReasonInvalidAnnotation)); got != invalid+1 {
		t.Errorf("refusals{reason=invalid-annotation} %v, want %v", got, invalid+1)
	}
}

func TestPlainPodIsUntouched(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	pod, err := env.Client.CoreV1().Pods(ns).Create(context.Background(), newPod("plain", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pod.Spec.InitContainers) != 0 || len(pod.Spec.Volumes) != 0 || pod.Spec.Containers[0].Lifecycle != nil {
		t.Errorf("plain pod changed: init %v, volumes %v", names(pod.Spec.InitContainers), pod.Spec.Volumes)
	}
}

func TestInjectedPodIsNotInjectedTwice(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	first, err := env.Client.CoreV1().Pods(ns).Create(context.Background(),
		newPod("first", map[string]string{"handoff.dev/inject": "true"}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	again := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "again", Annotations: first.Annotations}, Spec: *first.Spec.DeepCopy()}
	again.Spec.NodeName = ""
	second, err := env.Client.CoreV1().Pods(ns).Create(context.Background(), again, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a, b := names(first.Spec.InitContainers), names(second.Spec.InitContainers); fmt.Sprint(a) != fmt.Sprint(b) || len(second.Spec.Volumes) != len(first.Spec.Volumes) {
		t.Errorf("second creation: init containers %v, volumes %d; first had %v, %d", b, len(second.Spec.Volumes), a, len(first.Spec.Volumes))
	}
}

// The Deployment keeps its template; the pods its ReplicaSet creates come
// back injected.
func TestDeploymentPodsAreInjected(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	labels := map[string]string{"app": "orders"}
	d, err := env.Client.AppsV1().Deployments(ns).Create(context.Background(), &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "orders"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{"handoff.dev/inject": "true", "handoff.dev/leases": "orders"}},
				Spec:       newPod("", nil).Spec,
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Spec.Template.Spec.InitContainers) != 0 {
		t.Error("the Deployment's template was changed; only its pods should be")
	}
	var pods []corev1.Pod
	kubetest.WaitFor(t, 60*time.Second, "the Deployment's 2 pods", func() bool {
		list, err := env.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app=orders"})
		if err != nil {
			return false
		}
		pods = list.Items
		return len(pods) == 2
	})
	for i := range pods {
		checkInjected(t, &pods[i], "orders")
	}
}

// Pods the sidecar cannot run in are refused on create, with the cause in
// the message and counted by reason.
func TestPodsTheSidecarCannotRunInAreRefused(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	cases := []struct {
		name   string
		spec   func(*corev1.PodSpec)
		reason inject.Reason
		want   []string
	}{
		{"host-network", func(s *corev1.PodSpec) { s.HostNetwork = true }, inject.ReasonHostNetwork,
			[]string{"handoff: spec.hostNetwork true", "loopback is the node's", "control and app ports", "reach the other pod's sidecar"}},
		// hostPID pods are refused; pods whose containers share a process
		// namespace are refused too, unless they allow it.
		{"host-pid", func(s *corev1.PodSpec) { s.HostPID = true }, inject.ReasonHostPID,
			[]string{"handoff: spec.hostPID true", "node's process namespace", "/proc/PID/root", "the pod's token"}},
		{"share-process-namespace", func(s *corev1.PodSpec) { s.ShareProcessNamespace = ptr.To(true) }, inject.ReasonShareProcessNamespace,
			[]string{"handoff: spec.shareProcessNamespace true", "/proc/PID/root", `handoff.dev/allow-shared-process-namespace: "true"`}},
		// Issue 20: two containers of one name were the API's to refuse,
		// after the webhook had injected the pod; now the webhook names them.
		{"duplicate-container-name", func(s *corev1.PodSpec) {
			s.Containers = append(s.Containers, corev1.Container{Name: "worker", Image: "x"})
		},
			inject.ReasonDuplicateContainerName, []string{`handoff: spec.containers[1].name: "worker" is also the name of spec.containers[0]`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			refused, byReason := counter(t, "handoff_webhook_admissions_total", webhook.OutcomeRefused), counter(t, "handoff_webhook_refusals_total", string(tc.reason))
			p := newPod(tc.name, map[string]string{"handoff.dev/inject": "true", "handoff.dev/leases": "work"})
			tc.spec(&p.Spec)
			_, err := env.Client.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{})
			if err == nil {
				t.Fatal("created; want the webhook to refuse it")
			}
			for _, want := range append(tc.want, `admission webhook "inject.handoff.dev" denied the request`) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
			if got := counter(t, "handoff_webhook_admissions_total", webhook.OutcomeRefused); got != refused+1 {
				t.Errorf("refused count %v, want %v", got, refused+1)
			}
			if got := counter(t, "handoff_webhook_refusals_total", string(tc.reason)); got != byReason+1 {
				t.Errorf("refusals{reason=%s} %v, want %v", tc.reason, got, byReason+1)
			}
		})
	}
	// Without the annotation such pods are not the webhook's business.
	p := newPod("plain-host-network", nil)
	p.Spec.HostNetwork = true
	p.Spec.HostPID = true
	p.Spec.AutomountServiceAccountToken = ptr.To(false)
	if _, err := env.Client.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Errorf("a pod not asking for handoff was refused: %v", err)
	}
	// A shared process namespace the pod allows is injected.
	p = newPod("shared-allowed", map[string]string{"handoff.dev/inject": "true", "handoff.dev/leases": "work", "handoff.dev/allow-shared-process-namespace": "true"})
	p.Spec.ShareProcessNamespace = ptr.To(true)
	created, err := env.Client.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a pod allowing its shared process namespace was refused: %v", err)
	}
	checkInjected(t, created, "work")
}

// outcomes reads handoff_webhook_admissions_total{outcome}.
func outcomes(t *testing.T, outcome string) float64 {
	t.Helper()
	return counter(t, "handoff_webhook_admissions_total", outcome)
}

// counter reads the counter name{label}, the metric's one label set to
// value; 0 when it was never counted.
func counter(t *testing.T, name, value string) float64 {
	t.Helper()
	mfs, err := registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == value {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// Out-of-range grace periods and durations are refused by the webhook,
// naming the field or the annotation and the bound, and counted by reason:
// a probe's 10000000000 s, margins of 2000000h, and a preStop sleep of
// 10000000000 s the webhook is asked to wrap (the API checks it only on
// the pod as the webhook leaves it: wrapped, it would be a hook that
// cannot run).
func TestOutOfRangeDurationsAreRefusedByName(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	probe := func(seconds int64) *corev1.Probe {
		return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}, TerminationGracePeriodSeconds: ptr.To(seconds)}
	}
	for _, tc := range []struct {
		name        string
		annotations map[string]string
		spec        func(*corev1.PodSpec)
		reason      inject.Reason
		want        []string
	}{
		{"liveness-probe", nil, func(s *corev1.PodSpec) { s.Containers[0].LivenessProbe = probe(10000000000) }, inject.ReasonGracePeriod,
			[]string{"handoff: spec.containers[worker].livenessProbe.terminationGracePeriodSeconds 10000000000: must be at most 9223372036"}},
		{"startup-probe", nil, func(s *corev1.PodSpec) { s.Containers[0].StartupProbe = probe(10000000000) }, inject.ReasonGracePeriod,
			[]string{"handoff: spec.containers[worker].startupProbe.terminationGracePeriodSeconds 10000000000: must be at most 9223372036"}},
		{"pod-grace-period", nil, func(s *corev1.PodSpec) { s.TerminationGracePeriodSeconds = ptr.To[int64](9223372036854775807) }, inject.ReasonGracePeriod,
			[]string{"handoff: spec.terminationGracePeriodSeconds 9223372036854775807: must be at most 9223372036"}},
		{"margins", map[string]string{"handoff.dev/deadline-margin": "2000000h", "handoff.dev/handback-reserve": "2000000h"}, nil, inject.ReasonInvalidAnnotation,
			[]string{`invalid value "2000000h" for annotation handoff.dev/deadline-margin: above the maximum 1h0m0s; want a duration from 0s to 1h`,
				`invalid value "2000000h" for annotation handoff.dev/handback-reserve: above the maximum 1h0m0s`}},
		{"wrapped-sleep", map[string]string{"handoff.dev/wrap-prestop": "true"}, func(s *corev1.PodSpec) {
			s.Containers[0].Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 10000000000}}}
		}, inject.ReasonPreStop, []string{"spec.containers[worker].lifecycle.preStop.sleep.seconds 10000000000: must be from 0 to the pod's terminationGracePeriodSeconds (30)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := map[string]string{"handoff.dev/inject": "true"}
			maps.Copy(a, tc.annotations)
			p := newPod(tc.name, a)
			if tc.spec != nil {
				tc.spec(&p.Spec)
			}
			checkRefused(t, env, ns, p, tc.reason, tc.want...)
		})
	}
}

// checkRefused creates p in ns and checks that the webhook refuses it with
// every string of want in the message, counted once as refused and once
// under reason.
func checkRefused(t *testing.T, env *kubetest.Env, ns string, p *corev1.Pod, reason inject.Reason, want ...string) {
	t.Helper()
	refused, byReason := counter(t, "handoff_webhook_admissions_total", webhook.OutcomeRefused), counter(t, "handoff_webhook_refusals_total", string(reason))
	_, err := env.Client.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{})
	if err == nil {
		t.Fatal("created; want the webhook to refuse it")
	}
	for _, w := range append(want, `admission webhook "inject.handoff.dev" denied the request`) {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not contain %q", err, w)
		}
	}
	if got := counter(t, "handoff_webhook_admissions_total", webhook.OutcomeRefused); got != refused+1 {
		t.Errorf("refused count %v, want %v", got, refused+1)
	}
	if got := counter(t, "handoff_webhook_refusals_total", string(reason)); got != byReason+1 {
		t.Errorf("refusals{reason=%s} %v, want %v", reason, got, byReason+1)
	}
}

// A workload sets its sidecar's resources by annotation, through the real
// webhook: the sidecar and its install step get them; a value that is not
// a quantity, or a request above its limit, is refused at admission,
// naming the annotation and the accepted form.
func TestSidecarResourcesByAnnotation(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	pod, err := env.Client.CoreV1().Pods(ns).Create(ctx, newPod("sized", map[string]string{"handoff.dev/inject": "true",
		inject.AnnotationSidecarCPURequest: "250m", inject.AnnotationSidecarMemoryRequest: "96Mi", inject.AnnotationSidecarMemoryLimit: "192Mi"}),
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkInjected(t, pod, "")
	for _, c := range pod.Spec.InitContainers {
		r := c.Resources
		if r.Requests.Cpu().String() != "250m" || r.Requests.Memory().String() != "96Mi" || r.Limits.Memory().String() != "192Mi" {
			t.Errorf("%s resources %v; want requests cpu 250m memory 96Mi, limit memory 192Mi", c.Name, r)
		}
	}
	for _, tc := range []struct {
		annotations map[string]string
		want        []string
	}{
		{map[string]string{inject.AnnotationSidecarCPULimit: "two"},
			[]string{`annotation handoff.dev/sidecar-cpu-limit: "two" is not accepted`, "a Kubernetes quantity above 0"}},
		{map[string]string{inject.AnnotationSidecarMemoryRequest: "256Mi", inject.AnnotationSidecarMemoryLimit: "128Mi"},
			[]string{"annotation handoff.dev/sidecar-memory-request 256Mi is above the memory limit 128Mi of annotation handoff.dev/sidecar-memory-limit"}},
	} {
		a := map[string]string{"handoff.dev/inject": "true"}
		for k, v := range tc.annotations {
			a[k] = v
		}
		_, err := env.Client.CoreV1().Pods(ns).Create(ctx, newPod("bad-size", a), metav1.CreateOptions{})
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%v: error %v; want it refused saying %q", tc.annotations, err, w)
			}
		}
	}
}
