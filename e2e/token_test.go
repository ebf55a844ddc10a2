//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/inject"
)

// TestTokenFileOnARealKubelet checks, on the node's own files, the token
// file the install step writes into the handoff-bin emptyDir
// (docs/security.md, "The token file"), for the two ways the injector
// narrows it:
//   - the worker container sets runAsUser (1000): the file is the worker's
//     user's, group 65532 (the sidecar's), mode 0440;
//   - the pod sets only fsGroup (2000): the install step runs as 65532 and
//     the file takes the fsGroup from the directory, which the kubelet
//     makes setgid for it: group 2000, mode 0440.
//
// Each pod becoming Ready shows that the worker (whose SDK reads the token
// before it serves) and the sidecar both read it. Only on our own cluster,
// whose kubelet's files this machine sees.
func TestTokenFileOnARealKubelet(t *testing.T) {
	if cluster.kubeletRoot == "" {
		t.Skip("needs our own cluster: the kubelet's files are read from this machine")
	}
	for _, tc := range []struct {
		name          string
		pod           *corev1.PodSecurityContext
		worker        *corev1.SecurityContext
		uid, gid      uint32
		setgidDirWant bool
	}{
		{"token-user", nil, &corev1.SecurityContext{RunAsUser: ptr.To[int64](1000)}, 1000, 65532, false},
		{"token-fsgroup", &corev1.PodSecurityContext{FSGroup: ptr.To[int64](2000)}, nil, 65532, 2000, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := worker(tc.name, 1, 10)
			d.Spec.Template.Spec.SecurityContext = tc.pod
			d.Spec.Template.Spec.Containers[0].SecurityContext = tc.worker
			deploy(t, d)
			pods, err := cluster.kube.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + tc.name})
			if err != nil || len(pods.Items) != 1 {
				t.Fatalf("pods of %s: %v, %d; want 1", tc.name, err, len(pods.Items))
			}
			p := pods.Items[0]
			if p.Labels[inject.LabelInjected] != "true" {
				t.Fatalf("pod %s not injected", p.Name)
			}
			dir := filepath.Join(cluster.kubeletRoot, "pods", string(p.UID), "volumes", "kubernetes.io~empty-dir", inject.VolumeName)
			var fi os.FileInfo
			deadline := time.Now().Add(30 * time.Second)
			for fi, err = os.Stat(filepath.Join(dir, "token")); err != nil; fi, err = os.Stat(filepath.Join(dir, "token")) {
				if time.Now().After(deadline) {
					t.Fatalf("the token file of pod %s on the node: %v", p.Name, err)
				}
				time.Sleep(200 * time.Millisecond)
			}
			st := fi.Sys().(*syscall.Stat_t)
			t.Logf("pod %s: %s %s uid %d gid %d", p.Name, filepath.Join(dir, "token"), fi.Mode(), st.Uid, st.Gid)
			if fi.Mode().Perm() != 0o440 {
				t.Errorf("token mode %s; want 0440 (-r--r-----)", fi.Mode().Perm())
			}
			if st.Uid != tc.uid || st.Gid != tc.gid {
				t.Errorf("token owned by %d:%d; want %d:%d", st.Uid, st.Gid, tc.uid, tc.gid)
			}
			di, err := os.Stat(dir)
			if err != nil {
				t.Fatal(err)
			}
			if got := di.Mode()&os.ModeSetgid != 0; got != tc.setgidDirWant {
				t.Errorf("the handoff-bin directory %s setgid: %v; want %v", di.Mode(), got, tc.setgidDirWant)
			}
		})
	}
}
