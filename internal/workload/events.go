package workload

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Component is the reporting component of image-refresh's Events.
const Component = "image-refresh"

// Event records a core/v1 Event on the workload, so that a state that
// stopped images from updating shows in `kubectl describe` and not only in
// an exit code (R15). Messages must not carry credentials (R20).
//
// The Create is synchronous, unlike client-go's EventBroadcaster: a
// one-shot tick exits right after, and an asynchronous broadcaster could
// drop the event on exit.
//
// The Event's name is derived from the workload's UID, the type, reason and
// message, so a repeat finds the same Event (Create answers AlreadyExists)
// and increments its count and lastTimestamp instead of piling up new
// Events every tick; two instances doing so at once resolve through the
// resourceVersion of the Update. RBAC: events create, get, update.
func (c *Client) Event(ctx context.Context, obj *Object, eventType, reason, message string) error {
	involved, err := eventRef(obj, eventType, reason)
	if err != nil {
		return err
	}
	ref := obj.Ref
	now := metav1.NewTime(c.now())
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: eventName(obj, eventType, reason, message), Namespace: ref.Namespace},
		InvolvedObject: *involved,
		Type:           eventType, Reason: reason, Message: message,
		Count: 1, FirstTimestamp: now, LastTimestamp: now,
		Source:              corev1.EventSource{Component: Component},
		ReportingController: Component,
	}
	events := c.kube.CoreV1().Events(ref.Namespace)
	callCtx, cancel := c.bounded(ctx)
	_, err = events.Create(callCtx, ev, metav1.CreateOptions{})
	cancel()
	if err == nil {
		return nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("record event %s on %s: %w", reason, ref, err)
	}
	for range conflictRetries + 1 {
		if err = c.bumpEvent(ctx, ev.Name, ref.Namespace, now); !apierrors.IsConflict(err) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("record event %s on %s: count a repeat: %w", reason, ref, err)
	}
	return nil
}

// now is the time of an Event (Client.Now).
func (c *Client) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// bumpEvent counts one more occurrence of an existing Event.
func (c *Client) bumpEvent(ctx context.Context, name, namespace string, now metav1.Time) error {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	events := c.kube.CoreV1().Events(namespace)
	ev, err := events.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	ev.Count = max(ev.Count, 1) + 1
	ev.LastTimestamp = now
	_, err = events.Update(ctx, ev, metav1.UpdateOptions{})
	return err
}

// eventName is "<workload>.<hash>": a DNS subdomain, stable for one
// workload incarnation and one (type, reason, message).
func eventName(obj *Object, eventType, reason, message string) string {
	h := sha256.New()
	for _, s := range []string{obj.Ref.Kind, string(obj.UID), eventType, reason, message} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	prefix := obj.Ref.Name
	if len(prefix) > 200 {
		prefix = strings.TrimRight(prefix[:200], "-.")
	}
	return prefix + "." + hex.EncodeToString(h.Sum(nil))[:16]
}

// Recorder records an Event on a workload (R15). Client records
// synchronously, for the one-shot modes (tick, rearm) that exit right
// after; Aggregating hands Events to the controller manager's recorder.
type Recorder interface {
	Event(ctx context.Context, obj *Object, eventType, reason, message string) error
}

var _ Recorder = (*Client)(nil)

// EventSink is the events.k8s.io recorder of client-go and
// controller-runtime (manager.GetEventRecorder).
type EventSink interface {
	Eventf(regarding runtime.Object, related runtime.Object, eventType, reason, action, note string, args ...any)
}

// Aggregating records through an events.k8s.io recorder, for `run`: the
// recorder sends in the background and folds a repeat of the same Event
// into an EventSeries whose count it writes at most every 30 minutes, so a
// group that stays locked out does not create or update an Event on every
// pass. RBAC: events.k8s.io events create and patch.
type Aggregating struct{ Sink EventSink }

// Event validates like Client.Event and hands the Event to the sink.
func (a Aggregating) Event(_ context.Context, obj *Object, eventType, reason, message string) error {
	ref, err := eventRef(obj, eventType, reason)
	if err != nil {
		return err
	}
	a.Sink.Eventf(ref, nil, eventType, reason, eventAction, "%s", message)
	return nil
}

// eventAction is the action of every Event (events.k8s.io requires one):
// what image-refresh was doing when it recorded it.
const eventAction = "Refresh"

// eventRef checks an Event's object, type and reason and names the object.
func eventRef(obj *Object, eventType, reason string) (*corev1.ObjectReference, error) {
	if obj == nil {
		return nil, errors.New("record event: no object")
	}
	ref := obj.Ref
	if err := validate(ref); err != nil {
		return nil, err
	}
	if eventType != corev1.EventTypeNormal && eventType != corev1.EventTypeWarning {
		return nil, fmt.Errorf("record event on %s: type %q is neither %s nor %s", ref, eventType, corev1.EventTypeNormal, corev1.EventTypeWarning)
	}
	if reason == "" {
		return nil, fmt.Errorf("record event on %s: no reason", ref)
	}
	k, _ := LookupKind(ref.Kind)
	return &corev1.ObjectReference{APIVersion: k.APIVersion(), Kind: ref.Kind, Name: ref.Name, Namespace: ref.Namespace, UID: obj.UID}, nil
}
