package leaderelection

import (
	"context"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
)

// RequestTimeout bounds each Lease read and write the elector sends:
// max(1s, renewDeadline/2), the timeout client-go's own leader-election
// constructor (resourcelock.NewFromKubeconfig) puts on its client, so that
// one hung request cannot use up the renew deadline. It is applied per
// request rather than as the client's rest.Config.Timeout, which would also
// cut the standby's watch of the Lease every timeout.
func RequestTimeout(renewDeadline time.Duration) time.Duration {
	return max(time.Second, renewDeadline/2)
}

// boundedLeases is a Leases client whose Get, Create, Update and Patch each
// end after timeout; List and Watch are not bounded.
type boundedLeases struct {
	coordinationv1client.LeasesGetter
	timeout time.Duration
}

func (b boundedLeases) Leases(namespace string) coordinationv1client.LeaseInterface {
	return boundedLeaseClient{LeaseInterface: b.LeasesGetter.Leases(namespace), timeout: b.timeout}
}

type boundedLeaseClient struct {
	coordinationv1client.LeaseInterface
	timeout time.Duration
}

func (b boundedLeaseClient) Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	return b.LeaseInterface.Get(ctx, name, opts)
}

func (b boundedLeaseClient) Create(ctx context.Context, l *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	return b.LeaseInterface.Create(ctx, l, opts)
}

func (b boundedLeaseClient) Update(ctx context.Context, l *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	return b.LeaseInterface.Update(ctx, l, opts)
}

func (b boundedLeaseClient) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*coordinationv1.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	return b.LeaseInterface.Patch(ctx, name, pt, data, opts, subresources...)
}
