// Package webhook is the webhook command: the mutating admission webhook
// that adds the sidecar to the pods that ask for it, with its certificate
// rotation, metrics and health ports.
package webhook

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/go-logr/zapr"
	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/handoff-dev/handoff/internal/cli/command"
	"github.com/handoff-dev/handoff/internal/cli/injectflags"
	"github.com/handoff-dev/handoff/version"
	admission "github.com/handoff-dev/handoff/webhook"
	"github.com/handoff-dev/handoff/webhook/outcomes"
)

// Command is the webhook command.
var Command = command.Command{
	Use:   "webhook",
	Short: "Serve the mutating admission webhook that adds the sidecar to the pods that ask for it",
	Long: `webhook serves HTTPS admission requests for pods at ` + admission.Path + ` and adds the
handoff sidecar to every pod it is sent that asks for it: labelled or annotated
handoff.dev/inject: "true". Which pods the API server sends it is the
webhook configuration's selector: with the chart's default (webhook.selectBy:
pod) only pods labelled handoff.dev/inject: "true", so a pod with the
annotation alone is not sent and gets no sidecar (docs/annotations.md, "Which
pods the webhook sees"). Pods with invalid handoff annotations are refused
with a message naming each problem. With --cert-rotation (the default) it makes
and renews its own serving certificate and CA with cert-controller, storing
them in --cert-secret and writing the CA into the caBundle of
--webhook-config; without it, it reads tls.crt and tls.key from --cert-dir
(for cert-manager). The rotator reads, lists and watches only that Secret
and that configuration, by name, and updates them: it needs get, list,
watch and update on each by resourceNames, and creates nothing (the Secret
must exist; the chart makes it).

With --count-outcomes (the default) the replica that holds --outcomes-lease
counts the sidecars' handovers from the ShutdownFinished Event each sidecar
writes on its Pod, into handoff_handovers_total and the other
handoff_handover_* series, labelled by the pods' namespace: the sidecars
then need no scrape before they exit. It reads Events of every namespace
(get, list, watch) and holds the Lease (get, create, update).`,
	Setup: func(f *pflag.FlagSet) func(command.Invocation) error {
		var (
			kubeconfig, certDir, metricsAddr, healthAddr string
			port                                         int
			rotate, metricsSecure                        bool
			namespace, secret, service, configName       string
			extraDNSNames                                []string
			logLevel                                     string
			countOutcomes                                bool
			outcomesLease                                string
			outcomesWindow                               time.Duration
		)
		o := injectflags.Flags{}
		f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file; empty means in-cluster configuration")
		f.IntVar(&port, "port", 9443, "HTTPS port of the webhook")
		f.StringVar(&certDir, "cert-dir", "/tmp/k8s-webhook-server/serving-certs", "directory of tls.crt and tls.key")
		f.StringVar(&metricsAddr, "metrics-addr", ":8080", `address of /metrics, "0" to turn it off`)
		f.BoolVar(&metricsSecure, "metrics-secure", true, "serve /metrics over HTTPS (a self-signed certificate) only to callers whose bearer token the apiserver authenticates and allows to get the non-resource URL /metrics; false: plain HTTP, on a loopback --metrics-addr only")
		f.StringVar(&healthAddr, "health-addr", ":8081", `address of /healthz and /readyz, "0" to turn it off`)
		f.BoolVar(&rotate, "cert-rotation", true, "make and renew the serving certificate with cert-controller (off when cert-manager provides it)")
		f.StringVar(&namespace, "namespace", os.Getenv("POD_NAMESPACE"), "namespace of the webhook's Service and certificate Secret")
		f.StringVar(&secret, "cert-secret", "handoff-webhook-cert", "Secret holding the rotated certificate and CA")
		f.StringVar(&service, "service", "handoff-webhook", "Service in front of the webhook (the certificate's DNS name)")
		f.StringVar(&configName, "webhook-config", "handoff", "MutatingWebhookConfiguration whose caBundle the rotator writes")
		f.StringVar(&logLevel, "log-level", "info", "least level logged: error, warn, info, or debug (also controller-runtime's and client-go's V(1) lines)")
		f.StringSliceVar(&extraDNSNames, "cert-dns-names", nil, "more DNS names for the rotated certificate (e.g. localhost, for a webhook run outside the cluster)")
		f.BoolVar(&countOutcomes, "count-outcomes", true, "count the sidecars' handovers from their ShutdownFinished Events into handoff_handovers_total and the other handoff_handover_* series, on the replica that holds --outcomes-lease (needs get, list and watch on Events in every namespace, and the Lease)")
		f.StringVar(&outcomesLease, "outcomes-lease", "handoff-outcomes", "Lease in --namespace that elects the one replica that counts the handovers")
		f.DurationVar(&outcomesWindow, "outcomes-window", outcomes.DefaultWindow, "how far before its start a newly elected counter counts Events from (what it may count twice, or miss, at a failover: docs/monitoring.md)")
		o.Add(f)
		return func(command.Invocation) error {
			opts, err := o.Options()
			if namespace == "" {
				err = errors.Join(err, errors.New("--namespace: want the webhook's namespace (or POD_NAMESPACE set)"))
			}
			if !metricsSecure {
				err = errors.Join(err, plainMetricsOnLoopback(metricsAddr))
			}
			if countOutcomes && (outcomesWindow < 0 || outcomesWindow > 10*time.Minute) {
				err = errors.Join(err, fmt.Errorf("--outcomes-window %s: want a duration from 0s to 10m, like 30s", outcomesWindow))
			}
			if countOutcomes && outcomesLease == "" {
				err = errors.Join(err, errors.New("--outcomes-lease: want a Lease name, like handoff-outcomes (or --count-outcomes=false)"))
			}
			level, lerr := webhookLogLevel(logLevel)
			err = errors.Join(err, lerr)
			if err != nil {
				return err
			}
			zc := zap.NewProductionConfig()
			zc.Level = zap.NewAtomicLevelAt(level)
			zl, err := zc.Build()
			if err != nil {
				return err
			}
			log := zapr.NewLogger(zl)
			ctrl.SetLogger(log)
			klog.SetLogger(log.WithName("client-go"))

			rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
			if err != nil {
				return fmt.Errorf("kubernetes client configuration: %w", err)
			}
			rc.UserAgent = "handoff-webhook/" + version.Get()
			if rotate {
				// cert-controller's informers list and watch whole
				// collections: narrow them to its Secret and configuration,
				// which is all the chart's RBAC grants.
				rc.Wrap(admission.RotatorReadsByName(namespace, secret, configName))
			}
			metrics := metricsserver.Options{BindAddress: metricsAddr}
			if metricsSecure {
				// HTTPS with a self-signed certificate, and only for a
				// caller whose token the apiserver authenticates
				// (TokenReview) and who may get the non-resource URL
				// /metrics (SubjectAccessReview): anyone else gets 401 or
				// 403. The webhook's service account needs create on
				// tokenreviews and subjectaccessreviews.
				metrics.SecureServing = true
				metrics.FilterProvider = filters.WithAuthenticationAndAuthorization
			}
			mgr, err := manager.New(rc, manager.Options{
				Metrics: metrics,
				// Served by serveHealth, with connection caps.
				HealthProbeBindAddress: "0",
				// The rotator reads only its Secret (and the cluster-scoped webhook configuration).
				Cache: cache.Options{DefaultNamespaces: map[string]cache.Config{namespace: {}}},
			})
			if err != nil {
				return err
			}
			certsReady := make(chan struct{})
			if rotate {
				err := rotator.AddRotator(mgr, &rotator.CertRotator{
					SecretKey:      types.NamespacedName{Namespace: namespace, Name: secret},
					CertDir:        certDir,
					CAName:         "handoff-webhook-ca",
					CAOrganization: "handoff",
					DNSName:        fmt.Sprintf("%s.%s.svc", service, namespace),
					ExtraDNSNames: append([]string{service, fmt.Sprintf("%s.%s", service, namespace),
						fmt.Sprintf("%s.%s.svc.cluster.local", service, namespace)}, extraDNSNames...),
					IsReady:  certsReady,
					Webhooks: []rotator.WebhookInfo{{Name: configName, Type: rotator.Mutating}},
				})
				if err != nil {
					return err
				}
			} else {
				close(certsReady)
			}
			srv := newWebhookServer(port, certDir, log.WithName("webhook-server"))
			if err := ctrlmetrics.Registry.Register(version.NewBuildInfo("webhook")); err != nil {
				return err
			}
			admission.NewInjector(opts, ctrlmetrics.Registry, log.WithName("webhook")).Register(srv)
			if countOutcomes {
				kube, err := kubernetes.NewForConfig(rc)
				if err != nil {
					return err
				}
				window := outcomesWindow
				if window == 0 {
					window = time.Nanosecond // 0 is "the default" to the Runner: here, no window
				}
				if err := mgr.Add(&outcomes.Runner{
					Client: kube, Namespace: namespace, Lease: outcomesLease, Window: window,
					Metrics: outcomes.NewMetrics(ctrlmetrics.Registry), Log: log.WithName("outcomes"),
				}); err != nil {
					return err
				}
			}
			// The server reads its certificate when it starts: start it once
			// the rotator has written one.
			go func() {
				<-certsReady
				if err := mgr.Add(srv); err != nil {
					log.Error(err, "starting the webhook server")
					os.Exit(1)
				}
			}()
			if healthAddr != "0" {
				health, err := serveHealth(healthAddr, map[string]healthz.Checker{"ping": healthz.Ping},
					map[string]healthz.Checker{"webhook": srv.StartedChecker()}, log.WithName("health"))
				if err != nil {
					return fmt.Errorf("--health-addr: %w", err)
				}
				defer func() { _ = health.Close() }()
			}
			log.Info("starting", "version", version.Get(), "port", port, "certRotation", rotate)
			return mgr.Start(ctrl.SetupSignalHandler())
		}
	},
}

// webhookLogLevel parses --log-level: zap's level names, the least a line
// needs to be written.
func webhookLogLevel(s string) (zapcore.Level, error) {
	switch s {
	case "error", "warn", "info", "debug":
		l, err := zapcore.ParseLevel(s)
		return l, err
	}
	return zapcore.InfoLevel, fmt.Errorf("--log-level %q: want error, warn, info or debug", s)
}

// plainMetricsOnLoopback refuses a plain-HTTP metrics address that is not
// on loopback ("0", no metrics server, is accepted): unauthenticated
// metrics must not be reachable from another pod.
func plainMetricsOnLoopback(addr string) error {
	if addr == "0" {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); err == nil && (host == "localhost" || ip != nil && ip.IsLoopback()) {
		return nil
	}
	return fmt.Errorf("--metrics-addr %q: plain-HTTP metrics (--metrics-secure=false) listen on loopback only; want 127.0.0.1:PORT, [::1]:PORT or localhost:PORT, \"0\" for none, or --metrics-secure", addr)
}
