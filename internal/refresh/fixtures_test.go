package refresh

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/imageref"
	"github.com/image-refresh/image-refresh/internal/state"
	"github.com/image-refresh/image-refresh/internal/workload"
)

// Digests the registry serves. Tests write them as <A>, <B>, <C> in
// expectations; render replaces them so that failures read short.
var (
	dA = "sha256:" + strings.Repeat("a", 64)
	dB = "sha256:" + strings.Repeat("b", 64)
	dC = "sha256:" + strings.Repeat("c", 64)

	short = strings.NewReplacer(dA, "<A>", dB, "<B>", dC, "<C>")
)

const (
	prefix = "tracebloc.io" // the seed script's keys
	repo   = "docker.io/acme/api"
	tag    = "prod"
	onTag  = repo + ":" + tag
	rearm  = "image-refresh rearm --group edge"
)

var k = state.Keys{Prefix: prefix}

// Workloads and targets of the fixture group. web is also the anchor.
var (
	web   = config.Workload{Kind: workload.KindDeployment, Namespace: "tb", Name: "web"}
	agent = config.Workload{Kind: workload.KindDaemonSet, Namespace: "tb", Name: "agent"}

	webAPI   = target(web, "api")
	webProxy = target(web, "proxy")
	agentMon = target(agent, "monitor")
)

func target(w config.Workload, container string) config.Target {
	return config.Target{Kind: w.Kind, Namespace: w.Namespace, Name: w.Name, Container: container}
}

// pinned is repo pinned to d in the digest format.
func pinned(d string) string { return repo + "@" + d }

// --- settings ---

type settingsOpt func(*Settings)

func settings(opts ...settingsOpt) Settings {
	s := Settings{
		Prefix:          prefix,
		MaxAttempts:     3,
		MaxSkipTicks:    3,
		MaxReadFailures: 3,
		FirstInstall:    config.FirstInstallPinNextTick,
		PinFormat:       imageref.PinDigest,
		RearmCommand:    func(g string) string { return "image-refresh rearm --group " + g },
	}
	for _, o := range opts {
		o(&s)
	}
	return s
}

func onlyAfterEverPinned(s *Settings) { s.FirstInstall = config.FirstInstallOnlyAfterEverPinned }
func tagAndDigest(s *Settings)        { s.PinFormat = imageref.PinTagAndDigest }

// --- group ---

type groupOpt func(*config.Group)
type imageOpt func(*config.Image)

// group is group "edge" anchored on web.
func group(opts ...groupOpt) config.Group {
	g := config.Group{Name: "edge", Anchor: web}
	for _, o := range opts {
		o(&g)
	}
	return g
}

func withImage(name string, opts ...imageOpt) groupOpt {
	return func(g *config.Group) {
		img := config.Image{Name: name, Repository: repo, Tag: tag}
		for _, o := range opts {
			o(&img)
		}
		g.Images = append(g.Images, img)
	}
}

func on(targets ...config.Target) imageOpt {
	return func(i *config.Image) { i.Targets = append(i.Targets, targets...) }
}

func fromRepo(r string) imageOpt { return func(i *config.Image) { i.Repository = r } }

func pinnedDigest(d string) imageOpt { return func(i *config.Image) { i.PinnedDigest = d } }

// --- observation ---

type obsOpt func(*Observation)

// observe reads every workload of g as settled with no containers, the
// anchor with no annotations, and nothing from the registry.
func observe(g config.Group, opts ...obsOpt) Observation {
	o := Observation{
		Group:       g,
		Anchor:      map[string]string{},
		Workloads:   map[config.Workload]Workload{},
		Latest:      map[string]Resolution{},
		MirrorProof: map[config.Target]Proof{},
	}
	for _, w := range g.Workloads() {
		o.Workloads[w] = Workload{Settled: true, Containers: map[string]Container{}}
	}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

func withAnchor(ann map[string]string) obsOpt {
	return func(o *Observation) { maps.Copy(o.Anchor, ann) }
}

func anchorErr(err error) obsOpt { return func(o *Observation) { o.AnchorErr = err } }

// withLive puts image in t's container, last written by "helm".
func withLive(t config.Target, image string) obsOpt {
	return writtenBy(t, image, "helm")
}

func writtenBy(t config.Target, image, manager string) obsOpt {
	return func(o *Observation) {
		o.Workloads[t.Workload()].Containers[t.Container] = Container{Image: image, Manager: manager}
	}
}

func withLatest(image, digest string) obsOpt {
	return func(o *Observation) { o.Latest[image] = Resolution{Digest: digest} }
}

func resolveErr(image string, err error) obsOpt {
	return func(o *Observation) { o.Latest[image] = Resolution{Err: err} }
}

// countedErr is a failed answer of the controller's poller that an earlier
// pass already counted (R1).
func countedErr(image string, err error) obsOpt {
	return func(o *Observation) {
		o.Latest[image] = Resolution{Err: err, Ask: 7}
		o.CountedAsks = map[string]uint64{image: 7}
	}
}

func notSettled(w config.Workload, reason string) obsOpt {
	return func(o *Observation) {
		st := o.Workloads[w]
		st.Settled, st.Reason = false, reason
		o.Workloads[w] = st
	}
}

func readErr(w config.Workload, err error) obsOpt {
	return func(o *Observation) { o.Workloads[w] = Workload{Err: err} }
}

func mirrorProof(t config.Target, has bool, err error) obsOpt {
	return func(o *Observation) { o.MirrorProof[t] = Proof{Has: has, Err: err} }
}

// --- expectations ---

// kv is a write's Set as expected: key → value, or deleted.
type kv map[string]string

const deleted = "<deleted>"

// want is the relevant part of a Plan. Every field is compared; a nil
// repin means "no Repin".
type want struct {
	bookkeeping kv
	clearSkip   kv
	repin       *wantRepin
	findings    []string // "image: SEVERITY Reason needs-human|benign"
	rows        []string // "image workload/container: state"
	lockedOut   bool
}

type wantRepin struct {
	attempt    int
	attemptSet kv
	changes    []string // "workload: container FROM -> TO (cause, writer)"
	wait       []string
	clear      kv
	record     kv
	unfinished bool
}

// decide runs Decide, checks the CAS invariant every plan must meet, and
// the want.
func decide(t *testing.T, s Settings, obs Observation, w want) *Plan {
	t.Helper()
	p := Decide(s, obs)
	if p == nil {
		t.Fatal("Decide returned nil")
	}
	checkCAS(t, obs.Anchor, p)
	checkFacts(t, obs, p)
	check(t, "Bookkeeping.Set", renderWrite(p.Bookkeeping), w.bookkeeping)
	check(t, "ClearSkip.Set", renderWrite(p.ClearSkip), w.clearSkip)
	check(t, "Findings", renderFindings(p.Findings), w.findings)
	check(t, "Rows", renderRows(p.Rows), w.rows)
	check(t, "LockedOut", p.LockedOut, w.lockedOut)
	check(t, "NeedsHuman()", p.NeedsHuman(), anyNeedsHuman(w.findings))
	switch {
	case w.repin == nil && p.Repin != nil:
		t.Errorf("Repin = %s, want none", renderRepin(p.Repin))
	case w.repin != nil && p.Repin == nil:
		t.Errorf("Repin = none, want one")
	case w.repin != nil:
		r := p.Repin
		check(t, "Repin.Attempt", r.Attempt, w.repin.attempt)
		check(t, "Repin.AttemptWrite.Set", renderWrite(r.AttemptWrite), w.repin.attemptSet)
		check(t, "Repin.Changes", renderChanges(r.Changes), w.repin.changes)
		check(t, "Repin.Wait", renderWorkloads(r.Wait), w.repin.wait)
		check(t, "Repin.ClearWrite.Set", renderWrite(r.ClearWrite), w.repin.clear)
		check(t, "Repin.RecordWrite.Set", renderWrite(r.RecordWrite), w.repin.record)
		check(t, "Repin.Unfinished", r.Unfinished, w.repin.unfinished)
	}
	return p
}

// checkFacts checks the plan's facts against the writes and the repin they
// sum up: SkipCounted is a skip streak the bookkeeping writes (R4), a
// counted ask a resolve-failure streak it writes (R1);
// InFlight is an async repin, or an attempt left rolling within its
// deadline (R24, NoWait).
func checkFacts(t *testing.T, obs Observation, p *Plan) {
	t.Helper()
	_, counts := p.Bookkeeping.Set[k.SkipStreak()]
	check(t, "SkipCounted", p.SkipCounted, counts)
	for img, res := range obs.Latest {
		_, stored := p.Bookkeeping.Set[k.ResolveFailures(img)]
		want, counts := res.Ask, res.Err != nil && res.Ask != 0 && stored
		if got, ok := p.CountedAsks[img]; ok != counts || (ok && got != want) {
			t.Errorf("CountedAsks[%s] = %d (%v), want %d (%v): the failed ask and whether the bookkeeping stores its streak", img, got, ok, want, counts)
		}
	}
	inFlight := (p.Repin != nil && p.Repin.Async) || (p.Repin == nil && p.Attempts > 0 && !p.LockedOut && !p.WaitUntil.IsZero())
	check(t, "InFlight", p.InFlight, inFlight)
}

func anyNeedsHuman(findings []string) bool {
	for _, f := range findings {
		if strings.HasSuffix(f, " needs-human") {
			return true
		}
	}
	return false
}

func check[T any](t *testing.T, what string, got, want T) {
	t.Helper()
	if rv := reflect.ValueOf(want); rv.Kind() == reflect.Map || rv.Kind() == reflect.Slice {
		if rv.Len() == 0 && reflect.ValueOf(got).Len() == 0 {
			return
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s:\n got: %v\nwant: %v", what, pretty(got), pretty(want))
	}
}

func pretty(v any) string {
	switch v := v.(type) {
	case []string:
		return "[\n\t" + strings.Join(v, "\n\t") + "\n]"
	case kv:
		keys := slices.Sorted(maps.Keys(v))
		var b strings.Builder
		for _, key := range keys {
			fmt.Fprintf(&b, "\n\t%s = %s", key, v[key])
		}
		return "{" + b.String() + "\n}"
	}
	return fmt.Sprint(v)
}

// checkCAS replays the plan's writes in the order the executor runs them
// (plan.go): each write must expect, for every key it sets, exactly the
// value that key holds at that point (nil = absent), so that a concurrent
// writer makes the write fail instead of being overwritten.
func checkCAS(t *testing.T, observed map[string]string, p *Plan) {
	t.Helper()
	cur := maps.Clone(observed)
	if cur == nil {
		cur = map[string]string{}
	}
	type named struct {
		name string
		w    Write
	}
	writes := []named{{"Bookkeeping", p.Bookkeeping}, {"ClearSkip", p.ClearSkip}}
	if r := p.Repin; r != nil {
		writes = append(writes, named{"AttemptWrite", r.AttemptWrite}, named{"ClearWrite", r.ClearWrite}, named{"RecordWrite", r.RecordWrite})
	}
	for _, nw := range writes {
		for key := range nw.w.Set {
			exp, ok := nw.w.Expect[key]
			v, present := cur[key]
			switch {
			case !ok:
				t.Errorf("CAS: %s sets %s without expecting its value", nw.name, key)
			case exp == nil && present:
				t.Errorf("CAS: %s expects %s absent, but it holds %q", nw.name, key, v)
			case exp != nil && !present:
				t.Errorf("CAS: %s expects %s = %q, but it is absent", nw.name, key, *exp)
			case exp != nil && *exp != v:
				t.Errorf("CAS: %s expects %s = %q, but it holds %q", nw.name, key, *exp, v)
			}
		}
		for key, v := range nw.w.Set {
			if v == nil {
				delete(cur, key)
			} else {
				cur[key] = *v
			}
		}
	}
}

func renderWrite(w Write) kv {
	out := kv{}
	for key, v := range w.Set {
		if v == nil {
			out[key] = deleted
		} else {
			out[key] = short.Replace(*v)
		}
	}
	return out
}

func renderFindings(fs []Finding) []string {
	var out []string
	for _, f := range fs {
		who := f.Image
		if who == "" {
			who = "group"
		}
		reason := f.Reason
		if reason == "" {
			reason = "-"
		}
		human := "benign"
		if f.NeedsHuman {
			human = "needs-human"
		}
		out = append(out, fmt.Sprintf("%s: %s %s %s", who, f.Severity, reason, human))
	}
	return out
}

func renderRows(rows []Row) []string {
	var out []string
	for _, r := range rows {
		t := r.TargetRef()
		out = append(out, fmt.Sprintf("%s %s/%s: %s", r.Image, t.Name, t.Container, r.State))
	}
	return out
}

func renderChanges(cs []WorkloadChange) []string {
	var out []string
	for _, c := range cs {
		for _, ic := range c.Images {
			out = append(out, short.Replace(fmt.Sprintf("%s: %s %s -> %s (%s, %s)",
				c.Workload.Name, ic.Container, ic.From, ic.To, ic.Cause, ic.Writer)))
		}
	}
	return out
}

func renderWorkloads(ws []config.Workload) []string {
	var out []string
	for _, w := range ws {
		out = append(out, w.Name)
	}
	return out
}

func renderRepin(r *Repin) string {
	return fmt.Sprintf("{attempt %d %v, changes %v, unfinished %v}", r.Attempt, renderWrite(r.AttemptWrite), renderChanges(r.Changes), r.Unfinished)
}

// findingWith returns the first finding whose Reason is reason.
func findingWith(t *testing.T, p *Plan, reason string) Finding {
	t.Helper()
	for _, f := range p.Findings {
		if f.Reason == reason {
			return f
		}
	}
	t.Fatalf("no finding with reason %q in %v", reason, renderFindings(p.Findings))
	return Finding{}
}

func contains(t *testing.T, what, s, sub string) {
	t.Helper()
	if !strings.Contains(s, sub) {
		t.Errorf("%s = %q, want it to contain %q", what, s, sub)
	}
}

// Repositories of the second and third images of some groups.
const (
	monRepo   = "docker.io/acme/monitor"
	proxyRepo = "docker.io/acme/proxy"
	mirror    = "mirror.local:5000/acme/api"
)

// ann builds anchor annotations from key, value pairs.
func ann(pairs ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(pairs); i += 2 {
		m[pairs[i]] = pairs[i+1]
	}
	return m
}

// pinnedBefore is the anchor state of an image that image-refresh pinned to
// d and confirmed: the record and the ever-pinned marker.
func pinnedBefore(image, d string) map[string]string {
	return ann(k.Record(image), d, k.EverPinned(image), "true")
}

// rollsWebAPI is the repin of group web's one target web/api from digest
// from to digest to, a digest change (R6): the attempt set first, the
// image written, the rollout waited for, the attempt cleared and to
// recorded.
func rollsWebAPI(from, to string) *wantRepin {
	return firstRepin([]string{"web"}, "web: api docker.io/acme/api@"+from+" -> docker.io/acme/api@"+to+" (digest-change, helm)").recording("api", to)
}

// repinsWebAPI is the re-pin of group web's one target web/api, reverted
// to the tag, to digest to (R7): nothing is recorded.
func repinsWebAPI(to string) *wantRepin {
	return firstRepin([]string{"web"}, "web: api docker.io/acme/api:prod -> docker.io/acme/api@"+to+" (revert, helm)")
}

// firstRepin is a repin at its first attempt (R10): the attempt set to 1,
// changes written, the workloads wait waited for, the attempt cleared.
func firstRepin(wait []string, changes ...string) *wantRepin {
	return &wantRepin{
		attempt: 1, attemptSet: kv{k.Attempt(): "1"},
		changes: changes,
		wait:    wait,
		clear:   kv{k.Attempt(): deleted},
	}
}

// recording adds to r the record of image's digest d, written after the
// rollout (R6).
func (r *wantRepin) recording(image, d string) *wantRepin {
	r.record = kv{k.Record(image): d}
	return r
}
