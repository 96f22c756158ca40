package pinwebhook

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/statestore"
	"github.com/image-refresh/image-refresh/internal/workload"
)

// Path is the URL path of the webhook; the MutatingWebhookConfiguration's
// clientConfig names it.
const Path = "/mutate-workloads"

// caCheckInterval is how often every replica checks that its CA is in the
// caBundle (one GET of one object).
const caCheckInterval = 10 * time.Second

// Options say how the webhook is served.
type Options struct {
	Host string // listen address; "" is every interface
	Port int
	// SelfSigned: the process generates and rotates its own CA and serving
	// certificate and keeps its CA in the caBundle of ConfigName. Otherwise
	// CertDir holds tls.crt and tls.key (e.g. from cert-manager), reloaded
	// when they change, and the caBundle is someone else's (cainjector).
	SelfSigned bool
	CertDir    string
	ConfigName string
	// Service and Namespace name the Service in front of the webhook: the
	// self-signed certificate is valid for its DNS names (and for Host when
	// that is a specific address).
	Service, Namespace string
	// CertValidity is the self-signed certificates' lifetime; 0 means
	// DefaultCertValidity.
	CertValidity time.Duration
}

// Hosts lists the names the self-signed serving certificate is valid for.
func (o Options) Hosts() []string {
	svc := o.Service + "." + o.Namespace
	hosts := []string{svc + ".svc", o.Service, svc, svc + ".svc.cluster.local"}
	if ip := net.ParseIP(o.Host); o.Host != "" && (ip == nil || !ip.IsUnspecified()) {
		hosts = append(hosts, o.Host)
	}
	return hosts
}

// Setup adds the webhook server to mgr. controller-runtime starts webhook
// servers on every replica before leader election, so admission does not
// depend on being the leader (C3); h reads the anchors from the manager's
// cache, which every replica runs too. kube updates the caBundle (only with
// SelfSigned).
func Setup(mgr manager.Manager, o Options, h *Handler, kube kubernetes.Interface, log *slog.Logger) error {
	var certs *SelfSigned
	if o.SelfSigned {
		validity := o.CertValidity
		if validity <= 0 {
			validity = DefaultCertValidity
		}
		var err error
		if certs, err = NewSelfSigned(o.Hosts(), validity, time.Now()); err != nil {
			return err
		}
		inj := &caInjector{
			certs: certs, client: kube.AdmissionregistrationV1().MutatingWebhookConfigurations(), name: o.ConfigName,
			interval: caCheckInterval, timeout: 15 * time.Second, log: log,
		}
		if err := mgr.Add(inj); err != nil {
			return err
		}
	}
	srv := newServer(o, certs, h)
	if err := mgr.Add(srv); err != nil {
		return fmt.Errorf("add the webhook server: %w", err)
	}
	return mgr.AddReadyzCheck("webhook", srv.StartedChecker())
}

// newServer is the webhook's server as Setup adds it to the manager:
// controller-runtime's webhook server, which listens with TLS only (it has
// no plain-HTTP mode), with the TLS settings of modernTLS, serving h (which
// answers AdmissionReviews only) at Path. certs is nil when the certificate
// comes from o.CertDir.
func newServer(o Options, certs *SelfSigned, h *Handler) webhook.Server {
	tlsOpts := []func(*tls.Config){modernTLS}
	if certs != nil {
		tlsOpts = append(tlsOpts, func(c *tls.Config) { c.GetCertificate = certs.GetCertificate })
	}
	srv := webhook.NewServer(webhook.Options{Host: o.Host, Port: o.Port, CertDir: o.CertDir, TLSOpts: tlsOpts})
	srv.Register(Path, h)
	return srv
}

// modernTLS is the webhook's TLS policy: TLS 1.2 or 1.3, and for TLS 1.2
// only ECDHE key exchange (forward secrecy) with an AEAD cipher, for ECDSA
// keys (the self-signed certificate) and RSA keys (a mounted one, e.g.
// cert-manager's default). TLS 1.3's suites are all AEAD and crypto/tls
// does not make them configurable. Both are set explicitly: Go's defaults
// still accept ECDHE with AES-CBC, and GODEBUG (tls10server, tlsrsakex,
// tls3des) can loosen them further.
func modernTLS(c *tls.Config) {
	c.MinVersion = tls.VersionTLS12
	c.CipherSuites = []uint16{
		tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
		tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
		tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
		tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
		tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
		tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
	}
	// HTTP/2 stays off: the API server speaks HTTP/1.1 to webhooks, and it
	// closes the HTTP/2 rapid-reset and stream-flood class of attacks.
	c.NextProtos = []string{"http/1.1"}
}

// CachedAnnotations reads workloads from an informer cache (the manager's,
// which watches every configured namespace for the three kinds): memory,
// no API call.
func CachedAnnotations(cache client.Reader) Annotations {
	return func(ctx context.Context, w config.Workload) (map[string]string, error) {
		obj, err := cached(ctx, cache, w)
		if obj == nil || err != nil {
			return nil, err
		}
		return obj.GetAnnotations(), nil
	}
}

// CachedState is CachedAnnotations with an anchor's current state (R25):
// the copy's, from states (whose copies come from the same manager's
// cache), when a rollback rewound the anchor's annotations. No API call.
func CachedState(cache client.Reader, states *statestore.Store) Annotations {
	return func(ctx context.Context, w config.Workload) (map[string]string, error) {
		obj, err := cached(ctx, cache, w)
		if obj == nil || err != nil {
			return nil, err
		}
		v, err := states.Read(ctx, workload.FromObject(obj))
		if err != nil {
			return nil, err
		}
		return v.State, nil
	}
}

// cached reads a workload from cache; nil when there is none.
func cached(ctx context.Context, cache client.Reader, w config.Workload) (client.Object, error) {
	k, ok := workload.LookupKind(w.Kind)
	if !ok {
		return nil, fmt.Errorf("%s: %w", w, workload.UnsupportedKind(w.Kind))
	}
	obj := k.New()
	err := cache.Get(ctx, client.ObjectKey{Namespace: w.Namespace, Name: w.Name}, obj)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s from the cache: %w", w, err)
	}
	return obj, nil
}
