package inject

import "slices"

// Reason is the code of one cause for refusing a pod, for metric labels
// and Events: short, stable, in kebab-case like the webhook's outcomes.
type Reason string

// Reasons Pod refuses a pod for. Every refusal carries one of them.
const (
	// ReasonInvalidAnnotation: a handoff.dev/ annotation has a value that
	// is not accepted, or settings that do not fit together.
	ReasonInvalidAnnotation Reason = "invalid-annotation"
	// ReasonInvalidLabel: the label handoff.dev/inject is not "true" or
	// "false", or disagrees with the annotation of the same key.
	ReasonInvalidLabel Reason = "invalid-label"
	// ReasonUnknownAnnotation: a key under handoff.dev/ is not a handoff
	// annotation.
	ReasonUnknownAnnotation Reason = "unknown-annotation"
	// ReasonPorts: the control, metrics or app port is 0 or shared.
	ReasonPorts Reason = "ports"
	// ReasonGracePeriod: the grace period leaves no time for the handover.
	ReasonGracePeriod Reason = "grace-period"
	// ReasonOS: the pod is not for Linux.
	ReasonOS Reason = "os"
	// ReasonWorker: no worker container, or the one named is not there.
	ReasonWorker Reason = "worker-container"
	// ReasonNameTaken: a container, volume or mount path handoff adds is
	// already used.
	ReasonNameTaken Reason = "name-taken"
	// ReasonPreStop: the worker's own preStop hook cannot be kept.
	ReasonPreStop Reason = "prestop"
	// ReasonHostNetwork: the pod shares the node's network namespace, so
	// its loopback ports are the node's.
	ReasonHostNetwork Reason = "host-network"
	// ReasonHostPID: the pod shares the node's process namespace, where
	// others can reach the sidecar's and the worker's files through /proc.
	ReasonHostPID Reason = "host-pid"
	// ReasonShareProcessNamespace: the pod's containers share one process
	// namespace, where each can reach the sidecar's and the worker's files
	// through /proc, and the pod does not allow it by annotation.
	ReasonShareProcessNamespace Reason = "share-process-namespace"
	// ReasonDuplicateContainerName: two of the pod's containers have one
	// name.
	ReasonDuplicateContainerName Reason = "duplicate-container-name"
	// ReasonNoImage: the injector has no handoff image configured.
	ReasonNoImage Reason = "no-image"
)

// Refusal is one cause for refusing a pod: its Reason and the message
// naming the field or annotation, the value and what is accepted.
type Refusal struct {
	Reason Reason
	Err    error
}

func (r *Refusal) Error() string { return r.Err.Error() }
func (r *Refusal) Unwrap() error { return r.Err }

// refuse wraps err as a Refusal for reason; nil stays nil.
func refuse(reason Reason, err error) error {
	if err == nil {
		return nil
	}
	return &Refusal{Reason: reason, Err: err}
}

// Reasons lists, sorted and once each, the Reasons of the Refusals in err
// (an error of Pod, possibly joined or wrapped). It is empty when err
// holds no Refusal.
func Reasons(err error) []Reason {
	var out []Reason
	var walk func(error)
	walk = func(e error) {
		switch x := e.(type) { //nolint:errorlint // walks every branch of joins and wraps itself; errors.As stops at the first
		case *Refusal:
			out = append(out, x.Reason)
		case interface{ Unwrap() []error }:
			for _, e := range x.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			walk(x.Unwrap())
		}
	}
	walk(err)
	slices.Sort(out)
	return slices.Compact(out)
}
