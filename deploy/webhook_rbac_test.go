package deploy_test

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/internal/charttest"
	"github.com/handoff-dev/handoff/internal/kubetest"
)

// needHelm skips the test outside CI (and under -short) when there is no
// pinned helm (charttest.Tool), and fails it in CI.
func needHelm(t *testing.T) {
	t.Helper()
	charttest.Tool(t, "helm") // skips outside CI (and under -short) without helm
}

// installChart creates every object of a rendered chart on the apiserver,
// as the admin (charttest.Create), and returns them by kind.
func installChart(t *testing.T, env *kubetest.Env, rendered []byte) map[string][]*unstructured.Unstructured {
	t.Helper()
	return charttest.Create(t, env.Config, charttest.Decode(t, rendered))
}

// asUser is a client that acts as user, a service account of ns, by
// impersonation.
func asUser(env *kubetest.Env, ns, user string) *kubernetes.Clientset {
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}}
	return kubernetes.NewForConfigOrDie(cfg)
}

// eventually polls cond every 20 ms for up to timeout and reports whether
// it held.
func eventually(timeout time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(timeout); ; time.Sleep(20 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// configChanges are the changes a webhook could make to its own
// MutatingWebhookConfiguration beside its caBundle, each keyed by the field
// it changes: one per field of MutatingWebhook, WebhookClientConfig and
// ServiceReference (TestConfigChangesCoverEveryField), and those of the
// metadata that matter (cert-manager's CA annotation, an owner that would
// have the garbage collector delete the configuration, a finalizer).
var configChanges = map[string]func(c *admissionregistrationv1.MutatingWebhookConfiguration){
	"webhooks": func(c *admissionregistrationv1.MutatingWebhookConfiguration) { c.Webhooks = c.Webhooks[:0] },
	"webhooks[+]": func(c *admissionregistrationv1.MutatingWebhookConfiguration) {
		w := c.Webhooks[0]
		w.Name = "more." + w.Name
		c.Webhooks = append(c.Webhooks, w)
	},
	"name": func(c *admissionregistrationv1.MutatingWebhookConfiguration) {
		c.Webhooks[0].Name = "other.handoff.dev"
	},
	"clientConfig.url": func(c *admissionregistrationv1.MutatingWebhookConfiguration) {
		c.Webhooks[0].ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://attacker.example/inject"), CABundle: c.Webhooks[0].ClientConfig.CABundle}
	},
	"clientConfig.service.name": func(c *admissionregistrationv1.MutatingWebhookConfiguration) {
		c.Webhooks[0].ClientConfig.Service.Name = "attacker"
	},
	"clientConfig.service.namespace": func(c *admissionregistrationv1.MutatingWebhookConfiguration) {
		c.Webhooks[0].ClientConfig.Service.Namespace = "default"
	},
	"clientConfig.service.path": func(c *admissionregistrationv1.MutatingWebhookConfiguration) {
		c.Webhooks[0].ClientConfig.Service.Path = ptr.To("/other")
	},
	"clientConfig.service.port": func(c *admissionregistrationv1.MutatingWebhookConfiguration) {
		c.Webhooks[0].ClientConfig.Service.Port = ptr.To[int32](8443)
	},
	"rules": func(c *admissionregistrationv1.MutatingWebhookConfiguration) {
		c.Webhooks[0].Rules[0].Resources = []string{"*"}
	},
	"failurePolicy": func(c *admissionregistrationv1.MutatingWebhookConfiguration) {
		c.Webhooks[0].FailurePolicy = ptr.To(admissionregistrationv1.Fail)
	},
	"matchPolicy": func(c *admissionregistrationv1.MutatingWebhookConfiguration) {
		c.Webhooks[0].MatchPolicy = ptr.To(admissionregistrationv1.Exact)
	},
	"namespaceSelector": func(c *admissionregistrationv1.MutatingWebhookConfiguration) {
		c.Webhooks[0].NamespaceSelector = &metav1.LabelSelector{}
	},
	"objectSelector": func(c *admissionregistrationv1.MutatingWebhookConfiguration) {
		c.Webhooks[0].ObjectSelector = &metav1.LabelSelector{}
	},
	"sideEffects": func(c *admissionregistrationv1.MutatingWebhookConfiguration) {
		c.Webhooks[0].SideEffects = ptr.To(admissionregistrationv1.SideEffectClassNoneOnDryRun)
	},
	"timeoutSeconds": func(c *admissionregistrationv1.MutatingWebhookConfiguration) {
		c.Webhooks[0].TimeoutSeconds = ptr.To[int32](30)
	},
	"admissionReviewVersions": func(c *admissionregistrationv1.MutatingWebhookConfiguration) {
		c.Webhooks[0].AdmissionReviewVersions = []string{"v1", "v1beta1"}
	},
	"reinvocationPolicy": func(c *admissionregistrationv1.MutatingWebhookConfiguration) {
		c.Webhooks[0].ReinvocationPolicy = ptr.To(admissionregistrationv1.IfNeededReinvocationPolicy)
	},
	"matchConditions": func(c *admissionregistrationv1.MutatingWebhookConfiguration) {
		c.Webhooks[0].MatchConditions = []admissionregistrationv1.MatchCondition{{Name: "never", Expression: "false"}}
	},
	"metadata.labels": func(c *admissionregistrationv1.MutatingWebhookConfiguration) { c.Labels["x"] = "y" },
	"metadata.annotations": func(c *admissionregistrationv1.MutatingWebhookConfiguration) {
		c.Annotations = map[string]string{"cert-manager.io/inject-ca-from": "attacker/cert"}
	},
	"metadata.ownerReferences": func(c *admissionregistrationv1.MutatingWebhookConfiguration) {
		c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Namespace", Name: "gone", UID: "0"}}
	},
	"metadata.finalizers": func(c *admissionregistrationv1.MutatingWebhookConfiguration) {
		c.Finalizers = []string{"example.com/hold"}
	},
}

// Every field of a webhook entry, of its clientConfig (but caBundle) and of
// its service has a change in configChanges: a field a newer k8s.io/api
// adds fails here until the test, and so the chart's policy, covers it.
func TestConfigChangesCoverEveryField(t *testing.T) {
	for prefix, v := range map[string]any{"": admissionregistrationv1.MutatingWebhook{},
		"clientConfig.": admissionregistrationv1.WebhookClientConfig{}, "clientConfig.service.": admissionregistrationv1.ServiceReference{}} {
		typ := reflect.TypeOf(v)
		for i := range typ.NumField() {
			name := prefix + strings.Split(typ.Field(i).Tag.Get("json"), ",")[0]
			if _, ok := configChanges[name]; !ok && name != "clientConfig" && name != "clientConfig.service" && name != "clientConfig.caBundle" {
				t.Errorf("no change of %s in configChanges: add one, and compare the field in the chart's webhook-config-policy.yaml", name)
			}
		}
	}
}

// TestWebhookMayReadItsSecretAndWriteOnlyTheCABundle installs the chart as
// helm template renders it (cert-controller mode, the default) on a real
// apiserver (RBAC authorization and the admission policies, as envtest
// starts it) and acts as the webhook's service account by impersonation: it
// may read, list and watch (by name) and update its own certificate Secret
// and nothing else of Secrets, and update its own
// MutatingWebhookConfiguration's caBundle and nothing else of it or of any
// other configuration; and, for its outcome counter, read (get, list, watch)
// the Events of every namespace, write none, and hold its outcome Lease
// <release>-outcomes by name and no other Lease.
func TestWebhookMayReadItsSecretAndWriteOnlyTheCABundle(t *testing.T) {
	needHelm(t)
	env := kubetest.Get(t)
	ctx := context.Background()
	ns := env.Namespace(t)
	release := "handoff-" + ns // the chart's full name: it contains "handoff"
	webhookSA, secretName := release+"-webhook", release+"-webhook-cert"
	rendered := helm(t, "template", release, "../charts/handoff", "--namespace", ns, "--kube-version", "1.35.0",
		// Sent no pod: the other tests of the package create pods.
		"--set-json", `webhook.namespaceSelector={"matchLabels":{"kubernetes.io/metadata.name":"none"}}`)
	installChart(t, env, rendered)
	user := "system:serviceaccount:" + ns + ":" + webhookSA
	asSA := asUser(env, ns, user)
	kubetest.WaitFor(t, 10*time.Second, "the webhook's Role to take effect", func() bool {
		r, err := asSA.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: ns, Verb: "update", Resource: "secrets", Name: secretName}},
		}, metav1.CreateOptions{})
		return err == nil && r.Status.Allowed
	})
	other, err := env.Client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "database"},
		StringData: map[string]string{"password": "hunter2"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	byName := func(name string) metav1.ListOptions {
		return metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()}
	}

	t.Run("reads, lists and watches its Secret by name, and updates it", func(t *testing.T) {
		secrets := asSA.CoreV1().Secrets(ns)
		s, err := secrets.Get(ctx, secretName, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("get its Secret: %v", err)
		}
		if _, err := secrets.List(ctx, byName(secretName)); err != nil {
			t.Errorf("list its Secret by name: %v", err)
		}
		if w, err := secrets.Watch(ctx, byName(secretName)); err != nil {
			t.Errorf("watch its Secret by name: %v", err)
		} else {
			w.Stop()
		}
		s.Data = map[string][]byte{"tls.crt": []byte("x")}
		if _, err := secrets.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Errorf("update its Secret: %v", err)
		}
	})

	t.Run("is forbidden every other Secret and any create or delete", func(t *testing.T) {
		secrets := asSA.CoreV1().Secrets(ns)
		_, getErr := secrets.Get(ctx, other.Name, metav1.GetOptions{})
		_, listErr := secrets.List(ctx, metav1.ListOptions{})
		_, listOtherErr := secrets.List(ctx, byName(other.Name))
		w, watchErr := secrets.Watch(ctx, metav1.ListOptions{})
		if w != nil {
			w.Stop()
		}
		_, updateErr := secrets.Update(ctx, other, metav1.UpdateOptions{})
		_, createErr := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "new"}}, metav1.CreateOptions{})
		_, patchErr := secrets.Patch(ctx, secretName, types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
		deleteErr := secrets.Delete(ctx, secretName, metav1.DeleteOptions{})
		_, otherNSErr := asSA.CoreV1().Secrets("default").List(ctx, metav1.ListOptions{})
		for what, err := range map[string]error{"get another Secret": getErr, "list every Secret": listErr,
			"list another Secret by name": listOtherErr, "watch every Secret": watchErr, "update another Secret": updateErr,
			"create a Secret": createErr, "patch its Secret": patchErr, "delete its Secret": deleteErr,
			"list the Secrets of another namespace": otherNSErr} {
			if !apierrors.IsForbidden(err) {
				t.Errorf("%s: %v; want Forbidden", what, err)
			}
		}
	})

	t.Run("reads the Events of every namespace and writes none", func(t *testing.T) {
		events := asSA.CoreV1().Events(metav1.NamespaceAll)
		if _, err := events.List(ctx, metav1.ListOptions{FieldSelector: "source=handoff,reason=ShutdownFinished"}); err != nil {
			t.Errorf("list the ShutdownFinished Events of every namespace: %v", err)
		}
		if w, err := events.Watch(ctx, metav1.ListOptions{}); err != nil {
			t.Errorf("watch the Events of every namespace: %v", err)
		} else {
			w.Stop()
		}
		_, createErr := asSA.CoreV1().Events("default").Create(ctx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "forged"},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "p"}, Reason: "ShutdownFinished"}, metav1.CreateOptions{})
		deleteErr := asSA.CoreV1().Events(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		for what, err := range map[string]error{"create an Event": createErr, "delete Events": deleteErr} {
			if !apierrors.IsForbidden(err) {
				t.Errorf("%s: %v; want Forbidden", what, err)
			}
		}
	})

	t.Run("holds its outcome Lease by name, and no other", func(t *testing.T) {
		leases := asSA.CoordinationV1().Leases(ns)
		l, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: release + "-outcomes"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create its outcome Lease: %v", err)
		}
		if l, err = leases.Get(ctx, l.Name, metav1.GetOptions{}); err != nil {
			t.Fatalf("get its outcome Lease: %v", err)
		}
		l.Spec.HolderIdentity = ptr.To("replica-0")
		if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
			t.Errorf("update its outcome Lease: %v", err)
		}
		// A Lease of a workload, as the admin (a sidecar) made it.
		work, err := env.Client.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "orders-leader"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_, getErr := leases.Get(ctx, work.Name, metav1.GetOptions{})
		_, updateErr := leases.Update(ctx, work, metav1.UpdateOptions{})
		_, listErr := leases.List(ctx, metav1.ListOptions{})
		deleteErr := leases.Delete(ctx, release+"-outcomes", metav1.DeleteOptions{})
		_, otherNSErr := asSA.CoordinationV1().Leases("default").Get(ctx, release+"-outcomes", metav1.GetOptions{})
		for what, err := range map[string]error{"get a workload's Lease": getErr, "update a workload's Lease": updateErr,
			"list the Leases": listErr, "delete its outcome Lease": deleteErr, "get a Lease of another namespace": otherNSErr} {
			if !apierrors.IsForbidden(err) {
				t.Errorf("%s: %v; want Forbidden", what, err)
			}
		}
	})

	configs := asSA.AdmissionregistrationV1().MutatingWebhookConfigurations()
	adminConfigs := env.Client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	newCA := func(c *admissionregistrationv1.MutatingWebhookConfiguration, b string) {
		for i := range c.Webhooks {
			c.Webhooks[i].ClientConfig.CABundle = []byte(b)
		}
	}

	t.Run("reads its configuration by name and updates its caBundle", func(t *testing.T) {
		c, err := configs.Get(ctx, release, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("get its configuration: %v", err)
		}
		if _, err := configs.List(ctx, byName(release)); err != nil {
			t.Errorf("list its configuration by name: %v", err)
		}
		if w, err := configs.Watch(ctx, byName(release)); err != nil {
			t.Errorf("watch its configuration by name: %v", err)
		} else {
			w.Stop()
		}
		newCA(c, "ca-1")
		if _, err := configs.Update(ctx, c, metav1.UpdateOptions{}); err != nil {
			t.Errorf("update its caBundle: %v", err)
		}
	})

	t.Run("is refused any other change of its configuration", func(t *testing.T) {
		// The policy is served asynchronously: wait until it refuses a
		// change of the rules.
		refused := func(change func(*admissionregistrationv1.MutatingWebhookConfiguration), ca string) error {
			c, err := adminConfigs.Get(ctx, release, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			newCA(c, ca)
			change(c)
			_, err = configs.Update(ctx, c, metav1.UpdateOptions{})
			return err
		}
		// Each probe changes the rules anew: one let through before the
		// policy was served leaves its rules behind.
		probes := 0
		probe := func(c *admissionregistrationv1.MutatingWebhookConfiguration) {
			probes++
			c.Webhooks[0].Rules[0].Resources = []string{fmt.Sprintf("probe%d", probes)}
		}
		if !eventually(10*time.Second, func() bool { return apierrors.IsForbidden(refused(probe, "ca-2")) }) {
			t.Fatalf("the webhook's service account may change its configuration's rules")
		}
		keys := slices.Sorted(func(yield func(string) bool) {
			for k := range configChanges {
				if !yield(k) {
					return
				}
			}
		})
		for _, field := range keys {
			named := "webhooks[*]." + field
			switch {
			case strings.HasPrefix(field, "metadata."):
				named = field
			case strings.HasPrefix(field, "webhooks"):
				named = "the number of webhooks"
			case strings.HasPrefix(field, "clientConfig.service."):
				named = "webhooks[*].clientConfig.service" // compared whole
			}
			want := "handoff: " + user + " may change only webhooks[*].clientConfig.caBundle of MutatingWebhookConfiguration " + release + ", not " + named
			err := refused(configChanges[field], "ca-3")
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
				t.Errorf("change %s (and the caBundle): %v; want Forbidden: %s", field, err, want)
			}
		}
		// The admin may still change it: the policy is about the webhook.
		c, err := adminConfigs.Get(ctx, release, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c.Webhooks[0].TimeoutSeconds = ptr.To[int32](7)
		if _, err := adminConfigs.Update(ctx, c, metav1.UpdateOptions{}); err != nil {
			t.Errorf("the admin's update of the timeout: %v", err)
		}
	})

	t.Run("is forbidden every other webhook configuration and admission policy", func(t *testing.T) {
		victim, err := adminConfigs.Create(ctx, &admissionregistrationv1.MutatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: "victim-" + ns}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = adminConfigs.Delete(context.Background(), victim.Name, metav1.DeleteOptions{}) })
		_, getErr := configs.Get(ctx, victim.Name, metav1.GetOptions{})
		_, listErr := configs.List(ctx, metav1.ListOptions{})
		_, updateErr := configs.Update(ctx, victim, metav1.UpdateOptions{})
		_, createErr := configs.Create(ctx, &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "mine-" + ns}}, metav1.CreateOptions{})
		_, patchErr := configs.Patch(ctx, release, types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
		deleteErr := configs.Delete(ctx, release, metav1.DeleteOptions{})
		_, validatingErr := asSA.AdmissionregistrationV1().ValidatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
		policyErr := asSA.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(ctx, release+"-webhook-config", metav1.DeleteOptions{})
		bindingErr := asSA.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, release+"-webhook-config", metav1.DeleteOptions{})
		for what, err := range map[string]error{"get another configuration": getErr, "list every configuration": listErr,
			"update another configuration": updateErr, "create a configuration": createErr, "patch its configuration": patchErr,
			"delete its configuration": deleteErr, "list the validating configurations": validatingErr,
			"delete the policy": policyErr, "delete the policy binding": bindingErr} {
			if !apierrors.IsForbidden(err) {
				t.Errorf("%s: %v; want Forbidden", what, err)
			}
		}
	})
}
