// Package kube is where handoff's commands read the cluster: the
// kubeconfig loaded as kubectl loads it, the flags that pick it, and the
// lists and reads of handoff's pods that several commands share (the
// injected pods, their sidecar's settings, the webhook's and the sidecars'
// versions). It imports no command package.
package kube

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/handoff-dev/handoff/version"
)

// ErrNoKubeconfig is ClientConfig's error where there is no kubeconfig
// at all.
var ErrNoKubeconfig = errors.New("no kubeconfig: set --kubeconfig or KUBECONFIG, or write ~/.kube/config")

// ClientConfig loads the client configuration as kubectl does:
// kubeconfig (a file path) if set, else KUBECONFIG, else ~/.kube/config,
// else the in-cluster configuration; kubeContext names the context, ""
// the current one. Each request is bounded by timeout. namespace is the
// context's namespace, else "default". Returns ErrNoKubeconfig where there
// is none, or the kubeconfig's error.
func ClientConfig(kubeconfig, kubeContext string, timeout time.Duration) (rc *rest.Config, namespace string, err error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: kubeContext})
	rc, err = loader.ClientConfig()
	if err != nil {
		if clientcmd.IsEmptyConfig(err) {
			return nil, "", ErrNoKubeconfig
		}
		return nil, "", fmt.Errorf("kubeconfig: %w", err)
	}
	namespace, _, err = loader.Namespace()
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig: %w", err)
	}
	rc = rest.CopyConfig(rc)
	rc.Timeout = timeout
	rc.UserAgent = "handoff/" + version.Get()
	return rc, namespace, nil
}

// Flags are the flags of a command that reads the cluster, as kubectl's:
// --kubeconfig, --context and -n.
type Flags struct {
	Kubeconfig, Context, Namespace string
}

// Add adds the flags to f; namespaceUsage describes -n.
func (k *Flags) Add(f *pflag.FlagSet, namespaceUsage string) {
	f.StringVar(&k.Kubeconfig, "kubeconfig", "", "kubeconfig file; empty: KUBECONFIG, else ~/.kube/config, else in-cluster, as kubectl")
	f.StringVar(&k.Context, "context", "", "kubeconfig context; empty: the current one")
	f.StringVarP(&k.Namespace, "namespace", "n", "", namespaceUsage)
}

// Check returns an error naming --kubeconfig when it names no file.
func (k *Flags) Check() error {
	if k.Kubeconfig != "" {
		if _, err := os.Stat(k.Kubeconfig); err != nil {
			return fmt.Errorf("--kubeconfig: want a kubeconfig file: %w", err)
		}
	}
	return nil
}

// Client returns a client of the cluster, each request bounded by
// timeout, and the namespace: -n, else the context's, else "default".
func (k *Flags) Client(timeout time.Duration) (kubernetes.Interface, string, error) {
	rc, ns, err := ClientConfig(k.Kubeconfig, k.Context, timeout)
	if err != nil {
		return nil, "", err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, "", err
	}
	return client, cmp.Or(k.Namespace, ns), nil
}
