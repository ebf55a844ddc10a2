package prestop_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/handoff-dev/handoff/prestop"
	"github.com/handoff-dev/handoff/protocol"
)

func TestDeadline(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	deleting := metav1.NewTime(now.Add(7 * time.Second))
	for _, tc := range []struct {
		name       string
		pod        *corev1.Pod
		want       time.Time
		wantSource string
	}{
		{"deleting pod: its deletionTimestamp less the margin",
			&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", DeletionTimestamp: &deleting}},
			now.Add(5 * time.Second), prestop.SourceDeletionTimestamp},
		{"pod not being deleted: the grace period",
			&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}},
			now.Add(28 * time.Second), prestop.SourceGracePeriod},
		{"pod not found: the grace period",
			&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "other"}},
			now.Add(28 * time.Second), prestop.SourceGracePeriod},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(tc.pod)
			got, source, _ := prestop.Deadline(context.Background(), client.CoreV1(), "ns", "p", now, 30*time.Second, 2*time.Second)
			if !got.Equal(tc.want) || source != tc.wantSource {
				t.Errorf("Deadline = %s from %s, want %s from %s", got, source, tc.want, tc.wantSource)
			}
		})
	}
}

func TestCallUnreachableSidecar(t *testing.T) {
	start := time.Now()
	for _, control := range []protocol.Endpoint{
		{Network: "tcp", Address: "127.0.0.1:1"},
		{Network: "unix", Address: filepath.Join(t.TempDir(), "control.sock")}, // not made yet
	} {
		_, err := prestop.Call(context.Background(), control, testToken, 300*time.Millisecond)
		if !errors.Is(err, prestop.ErrUnreachable) {
			t.Fatalf("Call = %v, want ErrUnreachable", err)
		}
		if !strings.Contains(err.Error(), control.String()) || !strings.Contains(err.Error(), "is the handoff sidecar running") {
			t.Errorf("error %q does not name the address and the likely cause", err)
		}
	}
	if time.Since(start) < 600*time.Millisecond {
		t.Errorf("gave up after %s, before the connect timeout", time.Since(start))
	}
}
