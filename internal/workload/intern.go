package workload

import (
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// internMax bounds the table of shared strings: when it is full it starts
// over (the strings handed out stay valid; only later copies stop being
// shared with them), so values that are each object's own (a timestamp)
// cannot grow it without bound.
const internMax = 1 << 14

// interned holds one copy of each string the cache transform shares
// between objects: the annotation keys and values of a group (its
// records, digests, generations), namespaces, images, container names,
// field managers, the kept field sets and their times, which the API
// decodes anew for every object, and the stripped container lists and
// managedFields entries (issue 38).
var interned = struct {
	sync.Mutex
	strs       map[string]string
	fields     map[string]*metav1.FieldsV1
	times      map[time.Time]*metav1.Time
	containers map[string][]corev1.Container
	entries    map[string][]metav1.ManagedFieldsEntry
}{
	strs: map[string]string{}, fields: map[string]*metav1.FieldsV1{}, times: map[time.Time]*metav1.Time{},
	containers: map[string][]corev1.Container{}, entries: map[string][]metav1.ManagedFieldsEntry{},
}

// intern is s, or an equal string handed out before.
func intern(s string) string {
	if s == "" {
		return ""
	}
	interned.Lock()
	defer interned.Unlock()
	if v, ok := interned.strs[s]; ok {
		return v
	}
	if len(interned.strs) >= internMax {
		clear(interned.strs)
	}
	interned.strs[s] = s
	return s
}

// internFields is a field set of these bytes, or an equal one handed out
// before; the cached objects' field sets are read only (the cache hands
// out deep copies, or lists that the reader must not change).
func internFields(raw []byte) *metav1.FieldsV1 {
	interned.Lock()
	defer interned.Unlock()
	if v, ok := interned.fields[string(raw)]; ok {
		return v
	}
	if len(interned.fields) >= internMax {
		clear(interned.fields)
	}
	v := &metav1.FieldsV1{Raw: raw}
	interned.fields[string(raw)] = v
	return v
}

// internTime is t, or an equal time handed out before (a managedFields
// entry's time has whole seconds: the writes of one pass share them).
func internTime(t *metav1.Time) *metav1.Time {
	if t == nil {
		return nil
	}
	interned.Lock()
	defer interned.Unlock()
	if v, ok := interned.times[t.Time]; ok {
		return v
	}
	if len(interned.times) >= internMax {
		clear(interned.times)
	}
	interned.times[t.Time] = t
	return t
}

// internContainers is the container list of key (each container's name,
// image and restart policy) handed out before, or the one build makes.
func internContainers(key string, build func() []corev1.Container) []corev1.Container {
	interned.Lock()
	v, ok := interned.containers[key]
	interned.Unlock()
	if ok {
		return v
	}
	v = build() // interns its strings: not under the lock
	interned.Lock()
	defer interned.Unlock()
	if w, ok := interned.containers[key]; ok {
		return w
	}
	if len(interned.containers) >= internMax {
		clear(interned.containers)
	}
	interned.containers[key] = v
	return v
}

// internEntries is es, or an equal list of managedFields entries handed
// out before: the workloads one writer created or changed in the same
// second (a chart's install, a pass's writes) have equal stripped entries.
func internEntries(es []metav1.ManagedFieldsEntry) []metav1.ManagedFieldsEntry {
	if len(es) == 0 {
		return nil
	}
	var key strings.Builder
	for _, e := range es {
		for _, f := range []string{e.Manager, string(e.Operation), e.APIVersion, e.FieldsType, e.Subresource} {
			key.WriteString(f)
			key.WriteByte(0)
		}
		if e.Time != nil {
			key.WriteString(strconv.FormatInt(e.Time.UnixNano(), 10))
		}
		key.WriteByte(0)
		if e.FieldsV1 != nil {
			key.Write(e.FieldsV1.Raw)
		}
		key.WriteByte(0)
	}
	interned.Lock()
	defer interned.Unlock()
	if v, ok := interned.entries[key.String()]; ok {
		return v
	}
	if len(interned.entries) >= internMax {
		clear(interned.entries)
	}
	es = slices.Clip(es)
	interned.entries[key.String()] = es
	return es
}
