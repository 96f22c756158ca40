// Package pass carries out passes over groups: it reads what the engine
// needs from the cluster and the registry (Observe), asks internal/refresh
// for a Plan, and executes the plan's writes, waits and reports in the
// order the rules require (Execute). The one-shot tick, status, dry-run and
// the controller all go through it.
package pass

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"k8s.io/client-go/kubernetes"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/gitops"
	"github.com/image-refresh/image-refresh/internal/imageref"
	"github.com/image-refresh/image-refresh/internal/metrics"
	"github.com/image-refresh/image-refresh/internal/refresh"
	"github.com/image-refresh/image-refresh/internal/registry"
	"github.com/image-refresh/image-refresh/internal/state"
	"github.com/image-refresh/image-refresh/internal/statestore"
	"github.com/image-refresh/image-refresh/internal/verify"
	"github.com/image-refresh/image-refresh/internal/workload"
)

// Runner holds what a pass needs; it keeps no state between passes that a
// decision depends on (the annotations are the state).
type Runner struct {
	Config     *config.Config
	ConfigPath string
	Kube       kubernetes.Interface
	Workloads  *workload.Client
	// Events records the Events of a pass; nil means Workloads, which
	// records synchronously (tick). The controller sets the manager's
	// aggregating recorder.
	Events   workload.Recorder
	Resolver *registry.Resolver
	Metrics  *metrics.Metrics
	Log      *slog.Logger
	// Instance names this process in the attempt holder (see InstanceName).
	Instance string
	// Now is the clock of the rollout policy (R21, R22); nil is time.Now.
	Now func() time.Time
	// OnRepin, if set, is called right after a workload's re-pin write
	// landed (the controller measures revert → re-pin latency with it).
	OnRepin func(group string, wc refresh.WorkloadChange)
	// ServiceAccounts makes every image resolve with the imagePullSecrets
	// of its pods' ServiceAccounts too, as the kubelet pulls (`run` with
	// discovery sets it; a discovered group's images always do, D1).
	ServiceAccounts bool
	// PromotionRecheck is how long a digest without a promotion
	// attestation from the signer a group follows (P2) is taken as such
	// before it is looked up again; 0 is DefaultPromotionRecheck. `run`
	// sets it from --promotion-recheck (a tick looks up on every run).
	PromotionRecheck time.Duration
	// ServiceAccountSource is where the ServiceAccounts' imagePullSecrets
	// are read: the API for tick and status (NewRunner), the informer
	// cache for `run` (operator.NewManager), so that its steady state
	// makes no API request for them (C6).
	ServiceAccountSource registry.ServiceAccountSource
	// State reads and writes the groups' state: the anchors' annotations
	// and their copies (R25). nil: one on Kube and Workloads, reading the
	// copies from the API (NewRunner; `run` sets its cache).
	State *statestore.Store
	// Nodes lists the cluster's nodes for V3 (the platforms a new digest
	// must serve): one LIST of their metadata (NewRunner), or the informer
	// cache (`run`). nil: V3 is not checked.
	Nodes workload.Nodes
	// KeychainTTL bounds how long the pull secrets read for an image are
	// reused, so that a rotated secret is picked up (the controller sets
	// its poll interval); 0 means the registry package's default.
	KeychainTTL time.Duration

	// pullSecrets keeps, per image, the keychain of the last read
	// (KeychainFor).
	pullSecrets registry.PullSecrets

	mu sync.Mutex
	// memos keeps registry answers a pass reuses, bounded (memo.go).
	memos    *memos
	memoOnce sync.Once
	// promoterV is the signer of promotion attestations (P2), parsed
	// once (promoter).
	promoterV    *verify.Promoter
	promoterErr  error
	promoterOnce sync.Once
	// countedAsks holds, per group, the failed registry asks whose
	// failures a pass stored toward maxReadFailures (R1): the plans'
	// CountedAsks, passed back as each next observation's.
	countedAsks map[string]map[string]uint64
	// told holds, per group, the Finding.Once keys its last pass told
	// (report): a state is told when it begins, not on every pass.
	told map[string]map[string]bool
	// cachedSettings is SettingsFrom(settingsOf, ConfigPath) (settings).
	cachedSettings refresh.Settings
	settingsOf     *config.Config
}

// Snapshot is one group's observation plus the objects it was read from.
type Snapshot struct {
	Observation refresh.Observation
	Objects     map[config.Workload]*workload.Object
	// State says which copy of the group's state the observation holds
	// (R25): Rewound when the anchor's was older than its copy's.
	State statestore.View
}

// States returns the Runner's state store (State, or one on its clients).
func (r *Runner) States() *statestore.Store {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.State == nil {
		r.State = &statestore.Store{Prefix: r.Config.AnnotationPrefix, Kube: r.Kube, Workloads: r.Workloads, Timeout: r.Config.APITimeout, Log: r.Log}
	}
	return r.State
}

// Latest answers "which digest does the registry serve for this image
// now?" for Observe. A pass over every group (`tick`, `status`) asks the
// registry once per repository:tag (PassSource); the controller answers
// from its poller (C2).
type Latest interface {
	Latest(ctx context.Context, img config.Image, kc func() authn.Keychain) refresh.Resolution
}

// PassSource makes one registry HEAD per distinct repository:tag per pass
// over every group, however many groups and targets use it (C2).
type PassSource struct {
	Resolver *registry.Resolver
	mu       sync.Mutex
	m        map[string]refresh.Resolution
}

// Latest resolves img once per PassSource.
func (s *PassSource) Latest(ctx context.Context, img config.Image, kc func() authn.Keychain) refresh.Resolution {
	key := img.Repository + ":" + img.Tag
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]refresh.Resolution{}
	}
	if res, ok := s.m[key]; ok {
		return res
	}
	d, err := s.Resolver.Latest(ctx, img.Repository, img.Tag, kc())
	res := refresh.Resolution{Digest: d, Err: err}
	s.m[key] = res
	return res
}

// Observe reads one group: the anchor, every workload, the registry's
// latest digest of every image, and the R3 proofs the decision needs.
func (r *Runner) Observe(ctx context.Context, g config.Group, latest Latest) Snapshot {
	obs := refresh.Observation{
		Group:       g,
		Workloads:   map[config.Workload]refresh.Workload{},
		Latest:      map[string]refresh.Resolution{},
		MirrorProof: map[config.Target]refresh.Proof{},
	}
	objs := map[config.Workload]*workload.Object{}
	for _, w := range g.Workloads() {
		obj, err := r.Workloads.GetObserved(ctx, w)
		if err != nil {
			obs.Workloads[w] = refresh.Workload{Err: err}
			continue
		}
		objs[w] = obj
		st := refresh.Workload{Settled: obj.Settled.Settled, Reason: obj.Settled.Reason, Failed: obj.Settled.FailedReason(), Containers: map[string]refresh.Container{}}
		for _, c := range obj.Containers {
			rc := refresh.Container{Image: c.Image, Manager: c.ImageManager}
			if c.Slot != workload.SlotContainer {
				rc.Slot = c.Slot.Noun() // K1: status says what holds it
			}
			if w, ok := gitops.Identify(c.ImageManager, obj.Labels, obj.Annotations); ok {
				rc.GitOps = &w // O2: the revert's writer is a GitOps tool
			}
			st.Containers[c.Name] = rc
		}
		obs.Workloads[w] = st
	}
	var view statestore.View
	if a, ok := objs[g.Anchor]; ok {
		// The anchor's state, or its copy's when a rollback rewound the
		// anchor's (R25).
		v, err := r.States().Read(ctx, a)
		if err != nil {
			obs.AnchorErr = err
		} else {
			view = v
			obs.Anchor = v.State
			if obs.Anchor == nil {
				obs.Anchor = map[string]string{}
			}
		}
		if sk := (state.Keys{Prefix: r.Config.AnnotationPrefix}).Suspend(); obs.Anchor[sk] != "" {
			// O1: who suspended it; not image-refresh, which only puts a
			// suspension a rollback took off back, nor the writer of a
			// rewound anchor (R25): P/suspended-by says who then.
			if by := a.AnnotationManager(sk); by != workload.FieldManager && !view.Rewound {
				obs.SuspendedBy = by
			}
		}
	} else {
		obs.AnchorErr = obs.Workloads[g.Anchor].Err
	}
	keys := state.Keys{Prefix: r.Config.AnnotationPrefix}
	nodes := r.nodesOnce(ctx) // V3, only for a new digest
	r.observePods(ctx, g, objs, &obs)
	r.observeLeader(ctx, g, &obs)
	for _, img := range g.Images {
		var kc authn.Keychain
		keychain := func() authn.Keychain {
			if kc == nil {
				kc = r.keychain(ctx, img, objs, r.ServiceAccounts || g.Discovered)
			}
			return kc
		}
		res := latest.Latest(ctx, img, keychain)
		if res.Err == nil && img.PinnedDigest == "" && obs.Anchor != nil && obs.Anchor[keys.Record(img.Name)] != res.Digest {
			// A digest about to be recorded or pinned is verified first (R1).
			res = r.verifyLatest(ctx, g, img, latest, res, keychain)
			// V1: and its signatures, where a verification policy applies.
			if pol, ok := r.Config.VerificationFor(img.Repository); ok && res.Err == nil {
				v, err := r.signatures(ctx, pol, img, res.Digest, obs.Anchor[keys.Verified(img.Name)], keychain)
				if err != nil {
					res = refresh.Resolution{Err: err, Ask: res.Ask}
				} else {
					if obs.Verification == nil {
						obs.Verification = map[string]refresh.Verification{}
					}
					obs.Verification[img.Name] = v
				}
			}
			// P2: and, for a follower of another cluster, its promotion
			// attestation.
			if res.Err == nil {
				r.observePromotion(ctx, g, img, res.Digest, keychain, &obs)
			}
			// V3: and the platforms it serves against the nodes'.
			if res.Err == nil {
				res = r.checkPlatforms(ctx, img, res, objs, nodes, keychain, &obs)
			}
		}
		obs.Latest[img.Name] = res
		r.observePlatforms(ctx, img, keys, keychain, &obs)
		if res.Err != nil {
			continue
		}
		r.observePins(ctx, img, keychain, &obs)
		r.checkRollbackPlatforms(ctx, g, img, keys, objs, nodes, keychain, &obs)
		for _, t := range img.Targets {
			c, ok := obs.Workloads[t.Workload()].Containers[t.Container]
			if !ok {
				continue
			}
			if repo, need := refresh.NeedsMirrorProof(img, c.Image); need {
				obs.MirrorProof[t] = r.mirrorProof(ctx, repo, res.Digest, keychain)
			}
		}
	}
	return Snapshot{Observation: obs, Objects: objs, State: view}
}

// observePods reads the pods of every target workload's current template
// (N1): from the informer cache in `run`, one LIST per workload otherwise.
func (r *Runner) observePods(ctx context.Context, g config.Group, objs map[config.Workload]*workload.Object, obs *refresh.Observation) {
	obs.Pods = map[config.Workload]refresh.PodsRead{}
	for _, img := range g.Images {
		for _, t := range img.Targets {
			w := t.Workload()
			obj, ok := objs[w]
			if _, done := obs.Pods[w]; done || !ok || obj.Selector == nil {
				continue
			}
			pods, err := r.Workloads.Pods(ctx, obj)
			obs.Pods[w] = refresh.PodsRead{Pods: runningPods(pods), Err: err}
		}
	}
}

// runningPods is what the engine reads of pods (N1, V2).
func runningPods(pods []workload.Pod) []refresh.RunningPod {
	var out []refresh.RunningPod
	for _, p := range pods {
		out = append(out, refresh.RunningPod{Name: p.Name, Node: p.Node, ImageIDs: p.ImageIDs, Failing: p.Failing, Ready: p.Ready, Restarts: p.Restarts})
	}
	return out
}

// observePlatforms finds, for an expected digest that a pod of img's
// targets does not report, whether it is an image index and which platform
// manifests it holds: a node runs one of those for a multi-arch pin (N1).
// Only on such a mismatch, once per digest per process: a steady state
// makes no registry request for it.
func (r *Runner) observePlatforms(ctx context.Context, img config.Image, keys state.Keys, kc func() authn.Keychain, obs *refresh.Observation) {
	recorded := obs.Anchor[keys.Record(img.Name)]
	for _, t := range img.Targets {
		live := obs.Workloads[t.Workload()].Containers[t.Container].Image
		want := refresh.Expected(live, recorded)
		if want == "" || obs.Platforms[want] != nil {
			continue
		}
		if !podsOff(obs.Pods[t.Workload()], t.Container, want) {
			continue
		}
		repo := img.Repository
		if ref, err := imageref.Parse(live); err == nil {
			repo = ref.Repository
		}
		platforms, err := r.platforms(ctx, repo, want, kc)
		if err != nil {
			r.Log.Warn("cannot read the manifest of the expected digest to tell its platforms; pods that report another digest are counted as off it",
				"image", img.Name, "digest", want, "error", err)
			continue
		}
		if obs.Platforms == nil {
			obs.Platforms = map[string][]string{}
		}
		obs.Platforms[want] = platforms
	}
}

func podsOff(read refresh.PodsRead, container, want string) bool {
	for _, p := range read.Pods {
		if got := refresh.RunningDigest(p.ImageIDs[container]); got != "" && got != want {
			return true
		}
	}
	return false
}

// platforms resolves repo@digest's platform digests once per process.
func (r *Runner) platforms(ctx context.Context, repo, digest string, kc func() authn.Keychain) ([]string, error) {
	key := repo + "@" + digest
	got, ok := r.memo().indexes.get(key)
	if ok {
		return got, nil
	}
	got, err := r.Resolver.Platforms(ctx, repo, digest, kc())
	if err != nil {
		return nil, err
	}
	if got == nil {
		got = []string{} // not an index: asked, and nothing to add
	}
	r.memo().indexes.add(key, got)
	return got, nil
}

// pinChecked is one of V4's answers and when it was asked.
type pinChecked struct {
	check refresh.PinCheck
	at    time.Time
}

// observePins asks whether the registry still holds each digest img's
// targets are pinned to or V2 would roll them back to (V4): one HEAD by
// digest per digest per pinCheckInterval, shared by every group of the
// process. A tick's process lives for one tick, so a tick checks every
// time; `run` checks on its first pass and then on the first pass after
// each interval. The answers go to the observation, fresh or kept, so
// that every pass of the interval says what the last check found. An
// image whose tag could not be resolved this pass is not checked: its
// registry failure counts in R1's streak already.
func (r *Runner) observePins(ctx context.Context, img config.Image, kc func() authn.Keychain, obs *refresh.Observation) {
	if obs.Anchor == nil {
		return
	}
	for _, ref := range refresh.PinsToCheck(r.Config.AnnotationPrefix, *obs, img) {
		now := r.now()
		got, ok := r.memo().pinChecks.get(ref)
		if !ok || !now.Before(got.at.Add(r.Config.PinCheckInterval)) {
			has, err := r.Resolver.Has(ctx, ref.Repository, ref.Digest, kc())
			got = pinChecked{check: refresh.PinCheck{Missing: !has && err == nil, Err: err}, at: now}
			r.memo().pinChecks.add(ref, got)
		}
		if obs.PinChecks == nil {
			obs.PinChecks = map[refresh.PinRef]refresh.PinCheck{}
		}
		obs.PinChecks[ref] = got.check
	}
}

// mirrorProof asks the mirror repo whether it holds digest (R3), once per
// repository and digest per process: a digest names immutable content, so
// a mirror that served it once still holds it, and a steady state on a
// mirror makes no registry request for it. Only a proof is kept: a "not
// there" (the mirror may sync it later) and a failed ask are asked again
// on the next pass.
func (r *Runner) mirrorProof(ctx context.Context, repo, digest string, kc func() authn.Keychain) refresh.Proof {
	key := repo + "@" + digest
	proven, _ := r.memo().mirrored.get(key)
	if proven {
		return refresh.Proof{Has: true}
	}
	has, err := r.Resolver.Has(ctx, repo, digest, kc())
	if has && err == nil {
		r.memo().mirrored.add(key, true)
	}
	return refresh.Proof{Has: has, Err: err}
}

// verifyLatest verifies res, the answer latest gave for img (R1). An answer
// of the controller's poller may be older than the tag (C2: one ask per
// interval), and then the GET serves the tag's newer manifest: a stale
// HEAD, not a registry that disagrees with itself. So when the GET
// disagrees and latest can ask again (a Refresher), it asks once; a changed
// answer replaces the stale one and is verified in turn. A registry whose
// HEAD and GET keep disagreeing answers the same HEAD again, and its digest
// is never pinned.
func (r *Runner) verifyLatest(ctx context.Context, g config.Group, img config.Image, latest Latest, res refresh.Resolution, kc func() authn.Keychain) refresh.Resolution {
	err := r.verify(ctx, img, res.Digest, kc)
	var re *registry.Error
	if f, ok := latest.(Refresher); ok && errors.As(err, &re) && re.Kind == registry.KindInconsistent {
		if now := f.Refresh(ctx, img); now.Err == nil && now.Digest != res.Digest {
			r.Log.Info("the registry's answer changed since the last poll; verifying the new one",
				"group", g.Name, "image", img.Name, "was", res.Digest, "now", now.Digest)
			res, err = now, r.verify(ctx, img, now.Digest, kc)
		}
	}
	if err != nil {
		return refresh.Resolution{Err: err}
	}
	return res
}

// verify checks, once per repository:tag and digest, that the registry's
// GET serves the content the HEAD named (registry.Resolver.Verify).
func (r *Runner) verify(ctx context.Context, img config.Image, digest string, kc func() authn.Keychain) error {
	key := img.Repository + ":" + img.Tag
	last, _ := r.memo().verified.get(key)
	done := last == digest
	if done {
		return nil
	}
	if err := r.Resolver.Verify(ctx, img.Repository, img.Tag, digest, kc()); err != nil {
		return err
	}
	r.memo().verified.add(key, digest)
	return nil
}

// KeychainFor gives the registry auth for an image to the controller's
// poller, which has no snapshot at hand: from the pull secrets the last
// pass saw on the image's targets, or, before any pass, by reading them.
// Reading every target on every poll would cost one API read per target per
// interval (C2); in `run` the targets come from the informer cache.
func (r *Runner) KeychainFor(ctx context.Context, img config.Image) authn.Keychain {
	if kc, ok := r.pullSecrets.Cached(keychainKey(img), r.KeychainTTL); ok {
		return kc
	}
	objs := map[config.Workload]*workload.Object{}
	for _, t := range img.Targets {
		if _, ok := objs[t.Workload()]; ok {
			continue
		}
		if obj, err := r.Workloads.Cached(ctx, t.Workload()); err == nil {
			objs[t.Workload()] = obj
		}
	}
	return r.keychain(ctx, img, objs, r.ServiceAccounts)
}

// keychain gives registry auth for an image: the docker config, and the
// imagePullSecrets of the pods that run it (R20: the secrets stay in
// memory; nothing about them is logged). With serviceAccounts (a
// discovered group, D1), also those of the pods' ServiceAccounts, as the
// kubelet pulls with both (registry.PullSecrets).
func (r *Runner) keychain(ctx context.Context, img config.Image, objs map[config.Workload]*workload.Object, serviceAccounts bool) authn.Keychain {
	var pods []registry.PodAuth
	for _, t := range img.Targets {
		obj, ok := objs[t.Workload()]
		if !ok {
			continue
		}
		pods = append(pods, registry.PodAuth{Namespace: t.Namespace, PullSecrets: obj.PullSecrets, ServiceAccount: obj.ServiceAccount})
	}
	src := registry.SecretSource{Kube: r.Kube, ServiceAccounts: r.ServiceAccountSource, Log: r.Log}
	return r.pullSecrets.Keychain(ctx, src, img.Name, keychainKey(img), pods, serviceAccounts)
}

// keychainKey names an image's keychain: its repository:tag and its name.
func keychainKey(img config.Image) string {
	return img.Repository + ":" + img.Tag + "/" + img.Name
}

// observeLeader reads, for a group that follows another (P1), the state on
// the leader's anchor (its copy's when a rollback rewound it, R25), and for
// a group that others follow, their names: its pass keeps their soak clock.
func (r *Runner) observeLeader(ctx context.Context, g config.Group, obs *refresh.Observation) {
	obs.Followers = r.Config.Followers(g.Name)
	if g.Promotion == nil {
		return
	}
	l := &refresh.Leader{Group: g.Promotion.After}
	obs.Leader = l
	leader, ok := r.Config.Group(g.Promotion.After)
	if !ok {
		l.Err = fmt.Errorf("no group %s in the config", g.Promotion.After)
		return
	}
	obj, err := r.Workloads.GetObserved(ctx, leader.Anchor)
	if err != nil {
		l.Err = err
		return
	}
	v, err := r.States().Read(ctx, obj)
	if err != nil {
		l.Err = err
		return
	}
	l.Anchor = v.State
}
