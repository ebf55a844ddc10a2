// Command floor is the footprint floor of bench/footprint: the least a Go
// program needs to hold one Lease with client-go. It builds a client-go
// clientset and runs one client-go leader elector with a LeaseLock at the
// sidecar's default timings (lease duration 15s, renew deadline 10s, retry
// period 2s), releasing on SIGTERM. Nothing else: no metrics, no Events,
// klog's default logger. Built with -tags metrics, it also serves
// prometheus/client_golang's default registry (metrics.go).
//
// Usage: floor -kubeconfig FILE -namespace NS -lease NAME -identity ID
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
)

// serveMetrics, set by metrics.go, serves the metrics; nil without it.
var serveMetrics func() error

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file")
	namespace := flag.String("namespace", "default", "the Lease's namespace")
	lease := flag.String("lease", "floor", "the Lease's name")
	identity := flag.String("identity", "floor", "holder identity")
	flag.Parse()
	if err := run(*kubeconfig, *namespace, *lease, *identity); err != nil {
		fmt.Fprintln(os.Stderr, "floor:", err)
		os.Exit(1)
	}
}

func run(kubeconfig, namespace, lease, identity string) error {
	if serveMetrics != nil {
		if err := serveMetrics(); err != nil {
			return err
		}
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock: &rl.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: namespace, Name: lease},
			Client:     client.CoordinationV1(),
			LockConfig: rl.ResourceLockConfig{Identity: identity},
		},
		LeaseDuration:   15 * time.Second,
		RenewDeadline:   10 * time.Second,
		RetryPeriod:     2 * time.Second,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { fmt.Println("leading") },
			OnStoppedLeading: func() {},
		},
	})
	return nil
}
