// Package statestore keeps a group's state where a rollback cannot rewind
// it (R25): on the anchor's annotations, as always, and in a copy of its
// own, a ConfigMap beside the anchor that image-refresh owns. Every state
// write goes through Update, which numbers the state (state.Keys
// Generation) on both; every read goes through Read, which takes the copy
// with the higher number (state.Keys.Current). `kubectl rollout undo`
// puts an older ReplicaSet's annotations back on a Deployment, generation
// and all, so the anchor then reads older than the copy: the pass decides
// on the copy's state, and its next write puts it back on the anchor.
package statestore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/state"
	"github.com/image-refresh/image-refresh/internal/workload"
)

// The copy's own metadata. The keys are image-refresh's, whatever the
// config's annotationPrefix: the ConfigMap is image-refresh's object.
const (
	// LabelManagedBy and LabelComponent select the copies (the informer
	// of `run` lists only them).
	LabelManagedBy    = "app.kubernetes.io/managed-by"
	LabelComponent    = "app.kubernetes.io/component"
	managedBy         = "image-refresh"
	component         = "state"
	annotationAnchor  = "image-refresh.io/anchor"
	annotationPrefix  = "image-refresh.io/annotation-prefix"
	annotationPurpose = "image-refresh.io/purpose"
	purpose           = "the state of an image-refresh group, kept beside the anchor's annotations so that a rollback of the anchor cannot rewind it (docs/annotations.md)"
	namePrefix        = "image-refresh-state-"
)

// Selector selects the copies: what `run`'s ConfigMap informer lists.
func Selector() labels.Selector {
	return labels.SelectorFromSet(labels.Set{LabelManagedBy: managedBy, LabelComponent: component})
}

// maxName is the longest object name (a DNS subdomain).
const maxName = 253

// Name is the name of the copy of the state kept on anchor, in the
// anchor's namespace: "image-refresh-state-<kind>-<name>"; when that is
// longer than an object name may be, "image-refresh-state-" and 40 hex
// digits of its SHA-256. One anchor holds one group's state (R10), so one
// copy per anchor.
func Name(anchor config.Workload) string {
	n := namePrefix + strings.ToLower(anchor.Kind) + "-" + anchor.Name
	if len(n) <= maxName {
		return n
	}
	sum := sha256.Sum256([]byte(n))
	return namePrefix + hex.EncodeToString(sum[:])[:40]
}

// Store reads and writes a group's state.
type Store struct {
	Prefix    string
	Kube      kubernetes.Interface
	Workloads *workload.Client
	// Timeout bounds each API call on a copy (R14).
	Timeout time.Duration
	Log     *slog.Logger
	// cache, when set, is where Read and Update find the copies (`run`).
	cache client.Reader

	mu sync.Mutex
	// written holds, per copy (namespace/name), the resourceVersion of
	// this store's last write to it, until the cache shows it.
	written map[string]ownWrite
}

// ownWrite is a copy as a write of this store stored it.
type ownWrite struct {
	resourceVersion string
	at              time.Time
}

// ownWriteFresh bounds how long Update distrusts a cache that does not
// show this store's last write to a copy: the informer delivers it within
// milliseconds, and a cache still older after this long missed it for
// good (the copy was deleted, or written again by someone else).
const ownWriteFresh = 10 * time.Second

// SetCache makes Read and Update take the copies from r, the informer
// cache of `run`: a steady state makes no API request (C6), and a state
// write costs the anchor's GET and PATCH and the copy's write, not a GET
// of the copy too (issue 38).
func (s *Store) SetCache(r client.Reader) { s.cache = r }

func (s *Store) keys() state.Keys { return state.Keys{Prefix: s.Prefix} }

func (s *Store) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	t := s.Timeout
	if t <= 0 {
		t = workload.DefaultAPITimeout
	}
	return context.WithTimeout(ctx, t)
}

// View is a group's state as a pass reads it.
type View struct {
	state.Choice
	// Copy names the ConfigMap that holds the copy.
	Copy string
}

// Read chooses the current state of the group anchored on anchor (as
// read): the anchor's annotations, or the copy's state when the anchor's
// was rewound. A copy that cannot be read is an error: the pass cannot
// tell whether the anchor's state is current.
func (s *Store) Read(ctx context.Context, anchor *workload.Object) (View, error) {
	v := View{Copy: Name(anchor.Ref)}
	var (
		cm  *corev1.ConfigMap
		err error
	)
	if s.cache != nil {
		cm = &corev1.ConfigMap{}
		ctx, cancel := s.bounded(ctx)
		err = s.cache.Get(ctx, client.ObjectKey{Namespace: anchor.Ref.Namespace, Name: v.Copy}, cm)
		cancel()
	} else {
		cm, err = s.get(ctx, anchor.Ref.Namespace, v.Copy)
	}
	if apierrors.IsNotFound(err) {
		cm, err = nil, nil
	}
	if err != nil {
		return v, fmt.Errorf("read the copy of the group's state, ConfigMap %s/%s: %w", anchor.Ref.Namespace, v.Copy, err)
	}
	v.Choice = s.keys().Current(anchor.Annotations, s.copyOf(cm, anchor))
	return v, nil
}

// copyOf is cm's copy of the state of anchor; not Present when there is
// none, when it was written for another object of that name (the anchor
// was deleted and created again: its state starts over, as it did before
// copies) or for another annotationPrefix.
func (s *Store) copyOf(cm *corev1.ConfigMap, anchor *workload.Object) state.Copy {
	if cm == nil || !s.ours(cm, anchor) {
		return state.Copy{}
	}
	return s.keys().FromData(cm.Data)
}

func (s *Store) ours(cm *corev1.ConfigMap, anchor *workload.Object) bool {
	if cm.Annotations[annotationPrefix] != s.Prefix {
		return false
	}
	for _, o := range cm.OwnerReferences {
		if o.UID == anchor.UID {
			return true
		}
	}
	return false
}

func (s *Store) get(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error) {
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	return s.Kube.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
}

// Update is the compare-and-swap on a group's state (UpdateAnnotations'
// contract): expect is checked against the current state (Read's choice,
// on the anchor read afresh and its copy, copyForWrite), set is applied
// to it, and the anchor is written with the
// whole current state (so a rewound anchor is restored in the same write)
// and the next generation; then the copy. A copy that cannot be written
// is a WARN, not a failed write: the anchor holds the newer generation, so
// nothing is lost unless a rollback comes before the next write, which
// writes the copy again. Update with no expect and no set restores a
// rewound anchor.
func (s *Store) Update(ctx context.Context, ref config.Workload, expect, set map[string]*string) (*workload.Object, error) {
	return s.UpdateAs(ctx, ref, workload.FieldManager, expect, set)
}

// UpdateAs is Update written to the anchor as field manager manager: the
// suspend and resume commands write the operator's suspension (O1) through
// the store, so that it lands on the current state (also on an anchor a
// rollback just rewound) and in the copy, which a later rollback cannot
// reach (R25).
func (s *Store) UpdateAs(ctx context.Context, ref config.Workload, manager string, expect, set map[string]*string) (*workload.Object, error) {
	out, writeCopy, err := s.update(ctx, ref, manager, expect, set)
	writeCopy()
	return out, err
}

// UpdateThenCopy is Update with the copy's write handed back instead of
// done: when it returns, the anchor holds the new state and its
// generation, which is what R10 orders before a re-image, and writeCopy
// writes the copy (a failure is Update's WARN). `run` runs writeCopy
// beside the re-pin's image patches, which read no state, so that a
// revert's re-pin waits for no ConfigMap (issue 38). The caller must let
// writeCopy return before its next write of the group's state; until then
// the anchor alone holds the newest generation, as after a copy that
// could not be written. writeCopy is never nil.
func (s *Store) UpdateThenCopy(ctx context.Context, ref config.Workload, expect, set map[string]*string) (out *workload.Object, writeCopy func(), err error) {
	return s.update(ctx, ref, workload.FieldManager, expect, set)
}

// update writes the anchor and returns the write of the copy that follows
// it (a no-op when nothing was written).
func (s *Store) update(ctx context.Context, ref config.Workload, manager string, expect, set map[string]*string) (*workload.Object, func(), error) {
	keys := s.keys()
	var (
		cm   *corev1.ConfigMap // the copy as read for the write that landed
		next map[string]string
		gen  uint64
	)
	out, err := s.Workloads.UpdateAnnotationsAs(ctx, ref, manager, func(obj *workload.Object) (map[string]*string, error) {
		c, err := s.copyForWrite(ctx, obj)
		if err != nil {
			return nil, fmt.Errorf("read the copy of the group's state, ConfigMap %s/%s: %w", ref.Namespace, Name(ref), err)
		}
		if c != nil && c.Annotations[annotationPrefix] != s.Prefix {
			return nil, fmt.Errorf("ConfigMap %s/%s holds the state of annotationPrefix %q, not %q: two installations with different prefixes manage this anchor",
				ref.Namespace, c.Name, c.Annotations[annotationPrefix], s.Prefix)
		}
		ch := keys.Current(obj.Annotations, s.copyOf(c, obj))
		if err := workload.CheckExpected(ch.State, expect); err != nil {
			return nil, err
		}
		want := state.Apply(ch.State, set)
		patch := state.Patch(obj.Annotations, want)
		if len(patch) == 0 {
			next = nil
			return nil, nil
		}
		gen = ch.Next(time.Now())
		g := fmt.Sprint(gen)
		patch[keys.Generation()] = &g
		cm, next = c, want
		return patch, nil
	})
	if err != nil || next == nil {
		return out, func() {}, err
	}
	return out, func() {
		if err := s.writeCopy(ctx, out, cm, keys.Data(next, gen), gen); err != nil {
			log := s.Log
			if log == nil {
				log = slog.Default()
			}
			log.Warn("could not write the copy of the group's state; the anchor holds it, and the next write writes the copy again",
				"anchor", ref.String(), "configMap", ref.Namespace+"/"+Name(ref), "error", err)
		}
	}, nil
}

// copyForWrite reads the copy of obj's state for a write of it (Update),
// nil when there is none. With a cache (`run`) it comes from the cache,
// unless the cache does not show this store's last write to the copy yet,
// or the cached copy would decide the write: newer than the anchor (a
// rollback rewound it, R25) or another prefix's. Then, as without a cache,
// it is read from the API. A cached copy that is merely older than the
// API's decides nothing: the anchor, read from the API, holds the newer
// generation and is the state written on (state.Keys.Current), and the
// copy's own write carries the cached resourceVersion, so a stale base
// answers 409 and writeCopy reads it again.
func (s *Store) copyForWrite(ctx context.Context, obj *workload.Object) (*corev1.ConfigMap, error) {
	ns, name := obj.Ref.Namespace, Name(obj.Ref)
	if s.cache != nil {
		cm := &corev1.ConfigMap{}
		bctx, cancel := s.bounded(ctx)
		err := s.cache.Get(bctx, client.ObjectKey{Namespace: ns, Name: name}, cm)
		cancel()
		switch {
		case apierrors.IsNotFound(err):
			cm = nil
		case err != nil:
			return nil, err
		}
		if s.cacheShowsOwnWrite(ns+"/"+name, cm) && !s.decides(cm, obj) {
			return cm, nil
		}
	}
	cm, err := s.get(ctx, ns, name)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return cm, err
}

// decides reports whether the copy cm would decide a write on obj rather
// than the anchor's own annotations: another prefix's copy (an error) or
// one with a higher generation than the anchor's (Current takes it).
func (s *Store) decides(cm *corev1.ConfigMap, obj *workload.Object) bool {
	if cm == nil {
		return false
	}
	if cm.Annotations[annotationPrefix] != s.Prefix {
		return true
	}
	c := s.copyOf(cm, obj)
	return c.Present && c.Generation > s.keys().FromAnnotations(obj.Annotations).Generation
}

// cacheShowsOwnWrite reports whether the cached copy cm (nil: none) is
// this store's last write to it or later, or no such write is pending.
func (s *Store) cacheShowsOwnWrite(key string, cm *corev1.ConfigMap) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, ok := s.written[key]
	if !ok {
		return true
	}
	if cm != nil && atLeast(cm.ResourceVersion, w.resourceVersion) || time.Since(w.at) > ownWriteFresh {
		delete(s.written, key)
		return true
	}
	return false
}

// wrote remembers a copy this store wrote, for cacheShowsOwnWrite.
func (s *Store) wrote(cm *corev1.ConfigMap) {
	if s.cache == nil || cm == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.written == nil {
		s.written = map[string]ownWrite{}
	}
	s.written[cm.Namespace+"/"+cm.Name] = ownWrite{resourceVersion: cm.ResourceVersion, at: time.Now()}
}

// atLeast reports whether resourceVersion cached is written or a later
// version of the object (KEP-5504: they compare as integers); one that
// does not parse counts only when equal.
func atLeast(cached, written string) bool {
	if cached == written {
		return true
	}
	cmp, err := resourceversion.CompareResourceVersion(cached, written)
	return err == nil && cmp >= 0
}

// writeCopy stores data (of generation gen) in the copy of anchor's state:
// creates it, or updates cm (as read) unless another write has stored a
// later generation meanwhile. A conflict re-reads and tries again.
func (s *Store) writeCopy(ctx context.Context, anchor *workload.Object, cm *corev1.ConfigMap, data map[string]string, gen uint64) error {
	api := s.Kube.CoreV1().ConfigMaps(anchor.Ref.Namespace)
	for retry := 0; ; retry++ {
		var err error
		if cm == nil {
			c := s.newCopy(anchor)
			c.Data = data
			bctx, cancel := s.bounded(ctx)
			var made *corev1.ConfigMap
			made, err = api.Create(bctx, c, metav1.CreateOptions{FieldManager: workload.FieldManager})
			cancel()
			if err == nil {
				s.wrote(made)
			}
		} else {
			if s.ours(cm, anchor) && s.keys().FromData(cm.Data).Generation >= gen {
				return nil // a later write of the state got there first
			}
			c := cm.DeepCopy()
			fresh := s.newCopy(anchor)
			c.Labels, c.Annotations, c.OwnerReferences = merge(c.Labels, fresh.Labels), merge(c.Annotations, fresh.Annotations), fresh.OwnerReferences
			c.Data = data
			bctx, cancel := s.bounded(ctx)
			var stored *corev1.ConfigMap
			stored, err = api.Update(bctx, c, metav1.UpdateOptions{FieldManager: workload.FieldManager})
			cancel()
			if err == nil {
				s.wrote(stored)
			}
		}
		if err == nil {
			return nil
		}
		if retry == 5 || !(apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err)) {
			return err
		}
		cm, err = s.get(ctx, anchor.Ref.Namespace, Name(anchor.Ref))
		if apierrors.IsNotFound(err) {
			cm, err = nil, nil
		}
		if err != nil {
			return err
		}
	}
}

// newCopy is the copy's metadata: labelled for the informer, owned by the
// anchor (deleted with it; no blockOwnerDeletion, which would need more
// RBAC), and saying what it is.
func (s *Store) newCopy(anchor *workload.Object) *corev1.ConfigMap {
	k, _ := workload.LookupKind(anchor.Ref.Kind)
	apiVersion := "v1"
	if k != nil {
		apiVersion = k.Version
		if k.Group != "" {
			apiVersion = k.Group + "/" + k.Version
		}
	}
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name: Name(anchor.Ref), Namespace: anchor.Ref.Namespace,
			Labels: map[string]string{LabelManagedBy: managedBy, LabelComponent: component},
			Annotations: map[string]string{
				annotationAnchor:  anchor.Ref.String(),
				annotationPrefix:  s.Prefix,
				annotationPurpose: purpose,
			},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: apiVersion, Kind: anchor.Ref.Kind, Name: anchor.Ref.Name, UID: anchor.UID}},
		},
	}
}

func merge(have, add map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range have {
		out[k] = v
	}
	for k, v := range add {
		out[k] = v
	}
	return out
}

// Delete removes the copy of anchor's state, when a workload is let go
// (D1) with its state annotations: a copy left behind would bring that
// state back if the workload were managed again. A copy already gone is
// not an error.
func (s *Store) Delete(ctx context.Context, anchor config.Workload) error {
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	s.mu.Lock()
	delete(s.written, anchor.Namespace+"/"+Name(anchor))
	s.mu.Unlock()
	err := s.Kube.CoreV1().ConfigMaps(anchor.Namespace).Delete(ctx, Name(anchor), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete the copy of the state of %s, ConfigMap %s/%s: %w", anchor, anchor.Namespace, Name(anchor), err)
	}
	return nil
}
