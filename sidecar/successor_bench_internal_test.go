package sidecar

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/internal/kubetest"
)

// BenchmarkListInjected times the successor's pick (listInjected, the
// watch-list of a namespace's injected pods) on a real kube-apiserver, the
// ways it can be asked for, in the same run and alternated, each iteration
// one of each in turn:
//
//   - consistent: resourceVersion unset, the apiserver waits until its
//     watch cache is as fresh as etcd (the pick before issue 32's cut);
//   - stale: resourceVersion "0", the cache as it is (pickResourceVersion);
//   - stale-proto: the same over protobuf.
//
// Sub-benchmarks by injected pods in the namespace (each the size of an
// injected pod, with its sidecar, volumes and status) and by the load the
// apiserver serves meanwhile: quiet (nothing else), writes (100 Lease
// writes a second in another namespace, as a cluster's renewals: each moves
// etcd's revision past the pods cache's) and busy (those writes and a
// consistent list of pods from another client every 50 ms, as controllers
// and kubectl do: the apiserver then asks etcd for progress at most every
// 100 ms for all of them). Between iterations it pauses 100–300 ms, so
// each pick comes alone, as a leaving pod's does. It reports each way's
// p50, p99 and max in milliseconds (ns/op counts the pauses: ignore it).
//
//	KUBEBUILDER_ASSETS=... go test -run '^$' -bench ListInjected -benchtime 100x ./sidecar/
func BenchmarkListInjected(b *testing.B) {
	env := kubetest.Get(b)
	proto := rest.CopyConfig(env.Config)
	proto.ContentType = "application/vnd.kubernetes.protobuf"
	proto.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	protoClient := kubernetes.NewForConfigOrDie(proto)
	for _, n := range []int{20, 100, 200} {
		ns := env.Namespace(b)
		makeInjectedPods(b, env.Client, ns, n)
		for _, load := range []string{"quiet", "writes", "busy"} {
			b.Run(fmt.Sprintf("pods=%d/load=%s", n, load), func(b *testing.B) {
				stop := startLoad(b, env, load)
				defer stop()
				ways := []struct {
					name string
					api  kubernetes.Interface
					rv   string
				}{{"consistent", env.Client, ""}, {"stale", env.Client, "0"}, {"stale-proto", protoClient, "0"}}
				took := make([][]time.Duration, len(ways))
				for i := range b.N {
					for k := range ways {
						w := ways[(i+k)%len(ways)] // each way first in turn
						start := time.Now()
						pods, err := listInjected(context.Background(), w.api.CoreV1().Pods(ns), w.rv)
						d := time.Since(start)
						if err != nil || len(pods) != n {
							b.Fatalf("%s: %d pods, %v; want %d", w.name, len(pods), err, n)
						}
						took[(i+k)%len(ways)] = append(took[(i+k)%len(ways)], d)
					}
					time.Sleep(100*time.Millisecond + rand.N(200*time.Millisecond))
				}
				for k, w := range ways {
					p50, p99, maxd := quantiles(took[k])
					b.ReportMetric(p50, w.name+"-p50-ms")
					b.ReportMetric(p99, w.name+"-p99-ms")
					b.ReportMetric(maxd, w.name+"-max-ms")
				}
			})
		}
	}
}

// BenchmarkPickStaleness measures how stale the pick's view can be: from
// the acknowledgement of a change to an injected pod (its Ready condition
// flipped) until a watch-list at resourceVersion "0" shows it, with 100
// Lease writes a second beside. It reports the p50, p99 and max in
// milliseconds.
func BenchmarkPickStaleness(b *testing.B) {
	env := kubetest.Get(b)
	ns := env.Namespace(b)
	makeInjectedPods(b, env.Client, ns, 20)
	stop := startLoad(b, env, "writes")
	defer stop()
	pods := env.Client.CoreV1().Pods(ns)
	var lags []time.Duration
	for i := range b.N {
		cur, err := pods.Get(context.Background(), "injected-0", metav1.GetOptions{})
		if err != nil {
			b.Fatal(err)
		}
		ready := corev1.ConditionTrue
		if i%2 == 0 {
			ready = corev1.ConditionFalse
		}
		cur.Status.Conditions[0].Status = ready
		if cur, err = pods.UpdateStatus(context.Background(), cur, metav1.UpdateOptions{}); err != nil {
			b.Fatal(err)
		}
		acked := time.Now()
		for {
			list, err := listInjected(context.Background(), pods, "0")
			if err != nil {
				b.Fatal(err)
			}
			j := slices.IndexFunc(list, func(p *corev1.Pod) bool { return p.Name == "injected-0" })
			if j >= 0 && list[j].ResourceVersion == cur.ResourceVersion {
				break
			}
		}
		lags = append(lags, time.Since(acked))
		time.Sleep(50*time.Millisecond + rand.N(100*time.Millisecond))
	}
	p50, p99, maxd := quantiles(lags)
	b.ReportMetric(p50, "lag-p50-ms")
	b.ReportMetric(p99, "lag-p99-ms")
	b.ReportMetric(maxd, "lag-max-ms")
}

// makeInjectedPods creates n pods in ns shaped as injected ones (the
// label, the leases annotation, the native sidecar, the volumes),
// Running and Ready.
func makeInjectedPods(b testing.TB, kube kubernetes.Interface, ns string, n int) {
	b.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			p := injectedPod(ns, fmt.Sprintf("injected-%d", i))
			created, err := kube.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{})
			if err != nil {
				errs <- err
				return
			}
			created.Status = p.Status
			if _, err := kube.CoreV1().Pods(ns).UpdateStatus(context.Background(), created, metav1.UpdateOptions{}); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

// injectedPod is a pod as the injector leaves it and the kubelet reports
// it, about 5 KiB of JSON.
func injectedPod(ns, name string) *corev1.Pod {
	env := func(names ...string) (out []corev1.EnvVar) {
		for _, n := range names {
			out = append(out, corev1.EnvVar{Name: n, Value: "value-of-" + n})
		}
		return out
	}
	mount := []corev1.VolumeMount{{Name: "handoff-run", MountPath: "/run/handoff"}, {Name: "kube-api-access", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}}
	now := metav1.Now()
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Labels: map[string]string{"app": "orders", "pod-template-hash": "5d8f7c9b6", labelInjected: "true"},
			Annotations: map[string]string{annotationLeases: "orders-leader", "handoff.dev/role-leases": "orders-leader",
				"handoff.dev/drain-timeout": "20s", "kubectl.kubernetes.io/restartedAt": now.Format(time.RFC3339)}},
		Spec: corev1.PodSpec{NodeName: "node-1", ServiceAccountName: "default", TerminationGracePeriodSeconds: ptr.To[int64](30),
			InitContainers: []corev1.Container{{Name: "handoff", Image: "registry.example/handoff-sidecar:v0.1.0", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
				Args: []string{"sidecar"}, Env: env("HANDOFF_POD_NAME", "HANDOFF_POD_NAMESPACE", "HANDOFF_POD_UID", "HANDOFF_LEASES", "HANDOFF_CONTROL_ADDR", "HANDOFF_APP_URL", "HANDOFF_TOKEN_FILE"),
				VolumeMounts: mount}},
			Containers: []corev1.Container{{Name: "worker", Image: "registry.example/orders-worker:2026.12.07", Env: env("DATABASE_URL", "HANDOFF_ADDR", "HANDOFF_TOKEN_FILE", "LOG_LEVEL"),
				VolumeMounts: mount, Lifecycle: &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"/run/handoff/bin/handoff", "prestop"}}}}}},
			Volumes: []corev1.Volume{{Name: "handoff-run", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}},
				{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
					{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](3607)}}}}}}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1", HostIP: "192.168.0.1", StartTime: &now,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "worker", Ready: true, Image: "registry.example/orders-worker:2026.12.07", ImageID: "registry.example/orders-worker@sha256:0123456789abcdef",
				ContainerID: "containerd://0123456789abcdef0123456789abcdef", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}},
			InitContainerStatuses: []corev1.ContainerStatus{{Name: "handoff", Ready: true, Started: ptr.To(true), Image: "registry.example/handoff-sidecar:v0.1.0", ImageID: "registry.example/handoff-sidecar@sha256:0123456789abcdef",
				ContainerID: "containerd://fedcba9876543210fedcba9876543210", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}},
		},
	}
}

// startLoad runs what load names (BenchmarkListInjected: "quiet",
// "writes" or "busy") beside a benchmark until the func it returns is
// called.
func startLoad(b testing.TB, env *kubetest.Env, load string) func() {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	if load == "writes" || load == "busy" {
		ns := env.Namespace(b)
		leases := env.Client.CoordinationV1().Leases(ns)
		l, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "load"},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("load"), LeaseDurationSeconds: ptr.To[int32](15)}}, metav1.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		wg.Go(func() {
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
				if next, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err == nil {
					l = next
				}
			}
		})
	}
	if load == "busy" {
		wg.Go(func() {
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				_, _ = env.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{})
			}
		})
	}
	return func() { cancel(); wg.Wait() }
}

// quantiles are the p50, p99 and max of ds, in milliseconds.
func quantiles(ds []time.Duration) (p50, p99, maxd float64) {
	ds = slices.Clone(ds)
	slices.Sort(ds)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	return ms(ds[len(ds)/2]), ms(ds[min(len(ds)-1, len(ds)*99/100)]), ms(ds[len(ds)-1])
}
