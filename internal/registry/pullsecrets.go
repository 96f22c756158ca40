package registry

import (
	"context"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// defaultKeychainTTL bounds how long a pull-secret keychain is reused when
// no TTL is given, and how long a ServiceAccount's imagePullSecrets are.
const defaultKeychainTTL = 10 * time.Minute

// PodAuth is where the pods of one target take their pull secrets from, as
// the kubelet reads them.
type PodAuth struct {
	Namespace string
	// PullSecrets are the pod template's imagePullSecrets.
	PullSecrets []string
	// ServiceAccount is the pod template's ServiceAccount; "" is "default".
	ServiceAccount string
}

// SecretSource is what PullSecrets reads through: the API, each
// ServiceAccount read bounded by APITimeout (R14), and the logger its WARNs
// go to.
type SecretSource struct {
	Kube       kubernetes.Interface
	APITimeout time.Duration
	Log        *slog.Logger
}

// PullSecrets builds the registry auth of an image from the pull secrets of
// the pods that run it, and keeps what it read: the keychain last built for
// each image (Cached), and each ServiceAccount's imagePullSecrets for
// defaultKeychainTTL. The secrets stay in memory; nothing about them is
// logged (R20). The zero value is ready to use.
type PullSecrets struct {
	mu        sync.Mutex
	keychains map[string]cachedKeychain // by the caller's key for an image
	// serviceAccounts holds the imagePullSecrets names of the
	// ServiceAccounts read, by namespace/name.
	serviceAccounts map[string]cachedNames
}

type cachedKeychain struct {
	kc authn.Keychain
	at time.Time
}

type cachedNames struct {
	names []string
	at    time.Time
}

// Cached returns the keychain Keychain last built for key, if it is younger
// than ttl (0 means defaultKeychainTTL).
func (p *PullSecrets) Cached(key string, ttl time.Duration) (authn.Keychain, bool) {
	p.mu.Lock()
	cached, ok := p.keychains[key]
	p.mu.Unlock()
	if ttl <= 0 {
		ttl = defaultKeychainTTL
	}
	if ok && time.Since(cached.at) < ttl {
		return cached.kc, true
	}
	return nil, false
}

// Keychain gives registry auth for the image named image (key is what
// Cached finds it by): the docker config, and the imagePullSecrets of the
// pods that run it. With serviceAccounts (a discovered group, D1), also
// those of the pods' ServiceAccounts, as the kubelet pulls with both.
func (p *PullSecrets) Keychain(ctx context.Context, src SecretSource, image, key string, pods []PodAuth, serviceAccounts bool) authn.Keychain {
	secrets := map[string]map[string]bool{}
	add := func(ns string, names ...string) {
		if secrets[ns] == nil {
			secrets[ns] = map[string]bool{}
		}
		for _, s := range names {
			secrets[ns][s] = true
		}
	}
	for _, pod := range pods {
		if len(pod.PullSecrets) > 0 {
			add(pod.Namespace, pod.PullSecrets...)
		}
		if serviceAccounts {
			if names := p.serviceAccountPullSecrets(ctx, src, image, pod.Namespace, pod.ServiceAccount); len(names) > 0 {
				add(pod.Namespace, names...)
			}
		}
	}
	var extra []authn.Keychain
	defer func() {
		p.mu.Lock()
		if p.keychains == nil {
			p.keychains = map[string]cachedKeychain{}
		}
		p.keychains[key] = cachedKeychain{kc: Keychain(extra...), at: time.Now()}
		p.mu.Unlock()
	}()
	namespaces := make([]string, 0, len(secrets))
	for ns := range secrets {
		namespaces = append(namespaces, ns)
	}
	sort.Strings(namespaces)
	for _, ns := range namespaces {
		names := make([]string, 0, len(secrets[ns]))
		for s := range secrets[ns] {
			names = append(names, s)
		}
		sort.Strings(names)
		kc, missing, err := PullSecretKeychain(ctx, src.Kube, ns, names)
		if len(missing) > 0 {
			src.Log.Warn("imagePullSecrets not found; resolving without them: create them, or remove them from the pod template",
				"image", image, "namespace", ns, "secrets", strings.Join(missing, ","))
		}
		if err != nil {
			src.Log.Warn("cannot read imagePullSecrets; resolving without them",
				"image", image, "namespace", ns, "secrets", strings.Join(names, ","), "error", err)
			continue
		}
		extra = append(extra, kc)
	}
	return Keychain(extra...)
}

// serviceAccountPullSecrets returns the imagePullSecrets of a pod
// template's ServiceAccount ("default" when it names none), read at most
// once per defaultKeychainTTL per ServiceAccount, so that a steady state
// makes no API request for them (C6 issue). A read that fails is a WARN and
// resolves without them, as a missing secret does.
func (p *PullSecrets) serviceAccountPullSecrets(ctx context.Context, src SecretSource, image, namespace, name string) []string {
	if name == "" {
		name = "default"
	}
	key := namespace + "/" + name
	p.mu.Lock()
	cached, ok := p.serviceAccounts[key]
	p.mu.Unlock()
	if ok && time.Since(cached.at) < defaultKeychainTTL {
		return cached.names
	}
	callCtx, cancel := context.WithTimeout(ctx, src.APITimeout)
	defer cancel()
	sa, err := src.Kube.CoreV1().ServiceAccounts(namespace).Get(callCtx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil // no ServiceAccount, no pull secrets of its (the pods cannot start either)
	}
	if err != nil {
		src.Log.Warn("cannot read the ServiceAccount of a target's pods for its imagePullSecrets; resolving without them",
			"image", image, "namespace", namespace, "serviceAccount", name, "error", err)
		return nil
	}
	var out []string
	for _, s := range sa.ImagePullSecrets {
		out = append(out, s.Name)
	}
	p.mu.Lock()
	if p.serviceAccounts == nil {
		p.serviceAccounts = map[string]cachedNames{}
	}
	p.serviceAccounts[key] = cachedNames{names: out, at: time.Now()}
	p.mu.Unlock()
	return out
}
