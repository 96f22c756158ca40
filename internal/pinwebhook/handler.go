package pinwebhook

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/imageref"
	"github.com/image-refresh/image-refresh/internal/metrics"
	"github.com/image-refresh/image-refresh/internal/refresh"
	"github.com/image-refresh/image-refresh/internal/state"
	"github.com/image-refresh/image-refresh/internal/workload"
)

// Annotations returns the annotations of a workload as this process last
// saw it, or nil when it does not exist. It must answer from memory: the
// admission path makes no registry call and waits on no API round trip.
type Annotations func(ctx context.Context, w config.Workload) (map[string]string, error)

// readTimeout bounds the anchor reads of one admission request (R14); the
// API server gives the whole call timeoutSeconds (3 s in the shipped
// configuration).
const readTimeout = time.Second

// Handler is the admission.Handler of the webhook (B1).
type Handler struct {
	prefix string
	format imageref.PinFormat
	// targets indexes the groups' targets; SetGroups replaces it when
	// discovery finds other groups (D1).
	targets     atomic.Pointer[map[config.Target][]binding]
	annotations Annotations
	ready       func() bool
	metrics     *metrics.Metrics
	log         *slog.Logger
	maxBody     int64 // MaxReviewBytes
	// now is the clock a suspension's end is read on (O1).
	now func() time.Time
	// suspendedSaid maps a group to the suspension its last INFO line
	// named: one line per suspension, not one per admitted write (O1).
	suspendedSaid sync.Map
}

// NewHandler builds the handler for a validated config. ready reports
// whether the informer cache behind annotations has synced; m may be nil.
func NewHandler(cfg *config.Config, annotations Annotations, ready func() bool, m *metrics.Metrics, log *slog.Logger) *Handler {
	h := &Handler{
		prefix: cfg.AnnotationPrefix, format: cfg.PinFormat,
		annotations: annotations, ready: ready, metrics: m, log: log, maxBody: MaxReviewBytes, now: time.Now,
	}
	h.SetGroups(cfg.Groups)
	return h
}

// SetClock sets the clock a suspension's end is read on (O1): the
// engine's, so that the webhook and the passes agree; nil keeps time.Now.
func (h *Handler) SetClock(now func() time.Time) {
	if now != nil {
		h.now = now
	}
}

// SetGroups makes the handler pin the targets of groups: the configured
// ones and those discovery found (`run` calls it after each discovery
// pass).
func (h *Handler) SetGroups(groups []config.Group) {
	idx := targetIndex(groups)
	h.targets.Store(&idx)
}

// Handle answers one admission request. It always allows: with a JSON patch
// for the pins, unchanged otherwise, and unchanged after any internal
// error or panic (counted and logged: the webhook fails open, B1).
func (h *Handler) Handle(ctx context.Context, req admission.Request) (resp admission.Response) {
	defer func() {
		if p := recover(); p != nil {
			resp = h.failOpen(req, fmt.Errorf("panic: %v", p))
		}
	}()
	pins, err := h.pins(ctx, req)
	if err != nil {
		return h.failOpen(req, err)
	}
	if len(pins) == 0 {
		return admission.Allowed("")
	}
	dryRun := req.DryRun != nil && *req.DryRun
	ops := make([]jsonpatch.JsonPatchOperation, 0, len(pins))
	for _, p := range pins {
		k, _ := workload.LookupKind(p.Target.Kind)
		ops = append(ops, jsonpatch.NewOperation("replace", p.At.Pointer(k.PodSpecPointer()), p.To))
		if h.metrics != nil && !dryRun {
			h.metrics.AdmissionPins.WithLabelValues(p.Group, p.Image).Inc()
		}
		h.log.Debug("admission: pinned to the recorded digest before it was stored", "group", p.Group, "image", p.Image,
			"target", p.Target.String(), "from", p.From, "to", p.To, "operation", string(req.Operation),
			"user", req.UserInfo.Username, "dryRun", dryRun)
	}
	return admission.Patched("", ops...)
}

func (h *Handler) failOpen(req admission.Request, err error) admission.Response {
	if h.metrics != nil {
		h.metrics.AdmissionErrors.Inc()
	}
	h.log.Warn("admission webhook allowed a request unchanged after an internal error (it fails open, docs/webhook.md); the controller re-pins anything it missed",
		"kind", req.Kind.Kind, "namespace", req.Namespace, "name", req.Name, "operation", string(req.Operation), "error", err.Error())
	return admission.Allowed("")
}

// pins decides what to rewrite in one request.
func (h *Handler) pins(ctx context.Context, req admission.Request) ([]Pin, error) {
	k, supported := workload.LookupKind(req.Kind.Kind)
	if !supported || req.SubResource != "" || req.Kind.Group != k.Group || req.Kind.Version != k.Version ||
		(req.Operation != admissionv1.Create && req.Operation != admissionv1.Update) {
		return nil, nil
	}
	// image-refresh's own writes are fix A's decisions, made with the
	// registry's latest: R6 moves every target to latest before it moves the
	// record, so "correcting" them to the record would undo every refresh.
	if fieldManager(req.Options.Raw) == workload.FieldManager {
		return nil, nil
	}
	obj := k.New()
	if err := utiljson.Unmarshal(req.Object.Raw, obj); err != nil {
		return nil, fmt.Errorf("decode the admitted %s: %w", req.Kind.Kind, err)
	}
	// Every image of the pod template: containers, init containers, image
	// volumes (K1).
	containers := workload.PodImages(workload.PodSpec(obj))
	name := req.Name
	if name == "" {
		name = obj.GetName()
	}
	target := func(container string) config.Target {
		return config.Target{Kind: k.Name, Namespace: req.Namespace, Name: name, Container: container}
	}
	targets := *h.targets.Load()
	managed := false
	for _, c := range containers {
		managed = managed || len(targets[target(c.Key)]) > 0
	}
	if !managed {
		return nil, nil
	}
	before, err := oldImages(k, req)
	if err != nil {
		return nil, err
	}
	if !h.ready() {
		return nil, fmt.Errorf("the informer cache of the anchors has not synced yet")
	}
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	keys := state.Keys{Prefix: h.prefix}
	anchors := map[string]map[string]string{}
	var pins []Pin
	for _, c := range containers {
		// Only an image this request writes: an unchanged one is drift that
		// fix A re-pins under its guards (R4, R10), not a re-render.
		if prev, ok := before[c.Key]; ok && prev == c.Image {
			continue
		}
		t := target(c.Key)
		for _, b := range targets[t] {
			ann, seen := anchors[b.group.Name]
			if !seen {
				if ann, err = h.annotations(ctx, b.group.Anchor); err != nil {
					return nil, fmt.Errorf("read the recorded digest of group %s: %w", b.group.Name, err)
				}
				anchors[b.group.Name] = ann
			}
			if s := refresh.SuspensionOf(h.prefix, ann, "", h.now()); s != nil {
				// O1: a suspended group's targets are written as sent; said
				// at INFO once per suspension, then at DEBUG.
				// One suspension: one P/suspend value and reason (its
				// description also names who once a pass has seen it).
				level, which := slog.LevelDebug, ann[keys.Suspend()]+"\x00"+ann[keys.SuspendReason()]
				if said, _ := h.suspendedSaid.Swap(b.group.Name, which); said != which {
					level = slog.LevelInfo
				}
				h.log.Log(ctx, level, "admission: group suspended, left as sent (docs/states/suspended.md); later writes while it lasts are logged at DEBUG", "group", b.group.Name, "image", b.image.Name,
					"target", t.String(), "suspension", s.Describe())
				continue
			}
			h.suspendedSaid.Delete(b.group.Name)
			if to, ok := pinFor(b.image, c.Image, ann[keys.Record(b.image.Name)], b.group.PinFormat(h.format)); ok {
				pins = append(pins, Pin{Group: b.group.Name, Image: b.image.Name, Target: t, At: c, From: c.Image, To: to})
				break
			}
		}
	}
	return pins, nil
}

// oldImages maps image key → image of the stored object (UPDATE); nil for
// CREATE.
func oldImages(k *workload.Kind, req admission.Request) (map[string]string, error) {
	if req.Operation != admissionv1.Update || len(req.OldObject.Raw) == 0 {
		return nil, nil
	}
	old := k.New()
	if err := utiljson.Unmarshal(req.OldObject.Raw, old); err != nil {
		return nil, fmt.Errorf("decode the stored %s: %w", req.Kind.Kind, err)
	}
	return workload.Images(old), nil
}

// fieldManager returns the field manager of the request's Create- or
// UpdateOptions (a PATCH arrives as UPDATE with its fieldManager), or "".
func fieldManager(options []byte) string {
	var o struct {
		FieldManager string `json:"fieldManager"`
	}
	if len(options) == 0 || utiljson.Unmarshal(options, &o) != nil {
		return ""
	}
	return o.FieldManager
}
