//go:build !sidecaronly

package main

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

// errNoKubeconfig is kubeClientConfig's error where there is no kubeconfig
// at all.
var errNoKubeconfig = errors.New("no kubeconfig: set --kubeconfig or KUBECONFIG, or write ~/.kube/config")

// kubeClientConfig loads the client configuration as kubectl does:
// kubeconfig (a file path) if set, else KUBECONFIG, else ~/.kube/config,
// else the in-cluster configuration; kubeContext names the context, ""
// the current one. Each request is bounded by timeout. namespace is the
// context's namespace, else "default". Returns errNoKubeconfig where there
// is none, or the kubeconfig's error.
func kubeClientConfig(kubeconfig, kubeContext string, timeout time.Duration) (rc *rest.Config, namespace string, err error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: kubeContext})
	rc, err = loader.ClientConfig()
	if err != nil {
		if clientcmd.IsEmptyConfig(err) {
			return nil, "", errNoKubeconfig
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

// kubeFlags are the flags of a command that reads the cluster, as
// kubectl's: --kubeconfig, --context and -n.
type kubeFlags struct {
	kubeconfig, context, namespace string
}

// add adds the flags to f; namespaceUsage describes -n.
func (k *kubeFlags) add(f *pflag.FlagSet, namespaceUsage string) {
	f.StringVar(&k.kubeconfig, "kubeconfig", "", "kubeconfig file; empty: KUBECONFIG, else ~/.kube/config, else in-cluster, as kubectl")
	f.StringVar(&k.context, "context", "", "kubeconfig context; empty: the current one")
	f.StringVarP(&k.namespace, "namespace", "n", "", namespaceUsage)
}

// check returns an error naming --kubeconfig when it names no file.
func (k *kubeFlags) check() error {
	if k.kubeconfig != "" {
		if _, err := os.Stat(k.kubeconfig); err != nil {
			return fmt.Errorf("--kubeconfig: want a kubeconfig file: %w", err)
		}
	}
	return nil
}

// client returns a client of the cluster, each request bounded by
// timeout, and the namespace: -n, else the context's, else "default".
func (k *kubeFlags) client(timeout time.Duration) (kubernetes.Interface, string, error) {
	rc, ns, err := kubeClientConfig(k.kubeconfig, k.context, timeout)
	if err != nil {
		return nil, "", err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, "", err
	}
	return client, cmp.Or(k.namespace, ns), nil
}
