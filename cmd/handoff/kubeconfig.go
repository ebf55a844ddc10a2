//go:build !sidecaronly

package main

import (
	"errors"
	"fmt"
	"time"

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
