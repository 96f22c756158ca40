package registry

import (
	"context"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/lru"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// defaultKeychainTTL bounds how long a pull-secret keychain is reused when
// no TTL is given, and how long a ServiceAccount's imagePullSecrets read
// from the API are (ServiceAccountsFromAPI).
const defaultKeychainTTL = 10 * time.Minute

// pullSecretCacheSize bounds the keychains kept (one per image) and the
// ServiceAccounts' imagePullSecrets kept (one per ServiceAccount): the
// images and namespaces of a cluster come and go, and one forgotten is read
// again, as on a restart.
const pullSecretCacheSize = 4096

// PodAuth is where the pods of one target take their pull secrets from, as
// the kubelet reads them.
type PodAuth struct {
	Namespace string
	// PullSecrets are the pod template's imagePullSecrets.
	PullSecrets []string
	// ServiceAccount is the pod template's ServiceAccount; "" is "default".
	ServiceAccount string
}

// SecretSource is what PullSecrets reads through: the API for the pull
// secrets, the ServiceAccounts for their imagePullSecrets, and the logger
// its WARNs go to.
type SecretSource struct {
	Kube            kubernetes.Interface
	ServiceAccounts ServiceAccountSource
	Log             *slog.Logger
}

// PullSecrets builds the registry auth of an image from the pull secrets of
// the pods that run it, and keeps the keychain last built for each image
// (Cached). The secrets stay in memory; nothing about them is logged
// (R20). The zero value is ready to use.
type PullSecrets struct {
	once sync.Once
	// keychains holds a cachedKeychain by the caller's key for an image;
	// the caller gives the TTL when it asks, so the age is checked then.
	keychains *lru.Cache
}

type cachedKeychain struct {
	kc authn.Keychain
	at time.Time
}

func (p *PullSecrets) cache() *lru.Cache {
	p.once.Do(func() { p.keychains = lru.New(pullSecretCacheSize) })
	return p.keychains
}

// Cached returns the keychain Keychain last built for key, if it is younger
// than ttl (0 means defaultKeychainTTL).
func (p *PullSecrets) Cached(key string, ttl time.Duration) (authn.Keychain, bool) {
	if ttl <= 0 {
		ttl = defaultKeychainTTL
	}
	if v, ok := p.cache().Get(key); ok && time.Since(v.(cachedKeychain).at) < ttl {
		return v.(cachedKeychain).kc, true
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
	defer func() { p.cache().Add(key, cachedKeychain{kc: Keychain(extra...), at: time.Now()}) }()
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
// template's ServiceAccount ("default" when it names none), read through
// src.ServiceAccounts. A read that fails is a WARN and resolves without
// them, as a missing secret does.
func (p *PullSecrets) serviceAccountPullSecrets(ctx context.Context, src SecretSource, image, namespace, name string) []string {
	if name == "" {
		name = "default"
	}
	names, err := src.ServiceAccounts.ImagePullSecrets(ctx, namespace, name)
	if err != nil {
		src.Log.Warn("cannot read the ServiceAccount of a target's pods for its imagePullSecrets; resolving without them",
			"image", image, "namespace", namespace, "serviceAccount", name, "error", err)
		return nil
	}
	return names
}

// ServiceAccountSource reads the imagePullSecrets names of a ServiceAccount:
// none, and no error, when it does not exist (its pods cannot start
// either). tick and status read the API (ServiceAccountsFromAPI); `run`
// reads its informer cache (ServiceAccountsFromCache), as the kubelet's
// view of them need not be fresher than a watch.
type ServiceAccountSource interface {
	ImagePullSecrets(ctx context.Context, namespace, name string) ([]string, error)
}

// ServiceAccountsFromAPI reads each ServiceAccount with a GET bounded by
// timeout (R14), at most once per defaultKeychainTTL per ServiceAccount:
// the source of tick and status, which run no informer.
func ServiceAccountsFromAPI(kube kubernetes.Interface, timeout time.Duration) ServiceAccountSource {
	return &apiServiceAccounts{kube: kube, timeout: timeout, read: cache.NewLRUExpireCache(pullSecretCacheSize)}
}

type apiServiceAccounts struct {
	kube    kubernetes.Interface
	timeout time.Duration
	read    *cache.LRUExpireCache // imagePullSecrets names by namespace/name
}

func (a *apiServiceAccounts) ImagePullSecrets(ctx context.Context, namespace, name string) ([]string, error) {
	key := namespace + "/" + name
	if names, ok := a.read.Get(key); ok {
		return names.([]string), nil
	}
	callCtx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	sa, err := a.kube.CoreV1().ServiceAccounts(namespace).Get(callCtx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := pullSecretNames(sa)
	a.read.Add(key, out, defaultKeychainTTL)
	return out, nil
}

// ServiceAccountsFromCache reads each ServiceAccount from reader, the
// informer cache of `run`'s manager, as Flux's image-reflector reads the
// ServiceAccount of an image repository: no API request once the informer
// synced, so a steady state makes none (C6), and an edited
// imagePullSecrets is seen as soon as the watch delivers it. timeout
// bounds a read (R14), the first of which waits for the informer to sync.
func ServiceAccountsFromCache(reader client.Reader, timeout time.Duration) ServiceAccountSource {
	return cachedServiceAccounts{reader: reader, timeout: timeout}
}

type cachedServiceAccounts struct {
	reader  client.Reader
	timeout time.Duration
}

func (c cachedServiceAccounts) ImagePullSecrets(ctx context.Context, namespace, name string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var sa corev1.ServiceAccount
	err := c.reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &sa)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return pullSecretNames(&sa), nil
}

func pullSecretNames(sa *corev1.ServiceAccount) []string {
	var out []string
	for _, s := range sa.ImagePullSecrets {
		out = append(out, s.Name)
	}
	return out
}

// StripServiceAccount is the informer transform of `run`'s ServiceAccount
// cache: it keeps the name, namespace, resource version and
// imagePullSecrets, all that ServiceAccountsFromCache reads (not the
// token secrets, labels, annotations or managed fields).
func StripServiceAccount(in any) (any, error) {
	sa, ok := in.(*corev1.ServiceAccount)
	if !ok {
		return in, nil
	}
	return &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{
			Name: sa.Name, Namespace: sa.Namespace, UID: sa.UID, ResourceVersion: sa.ResourceVersion,
		},
		ImagePullSecrets: sa.ImagePullSecrets,
	}, nil
}
