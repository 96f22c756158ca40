package workload

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// O1: status names who suspended a group, the field manager that last wrote
// the anchor's suspend annotation.
func TestAnnotationManager_O1_NamesTheLastWriterOfTheKey(t *testing.T) {
	at := func(s int) *metav1.Time { return &metav1.Time{Time: time.Date(2026, 12, 2, 12, 0, s, 0, time.UTC)} }
	entry := func(manager string, when *metav1.Time, fields string) metav1.ManagedFieldsEntry {
		return metav1.ManagedFieldsEntry{Manager: manager, Time: when, FieldsV1: &metav1.FieldsV1{Raw: []byte(fields)}}
	}
	const suspend = `{"f:metadata":{"f:annotations":{"f:p/suspend":{},"f:p/suspend-reason":{}}}}`
	for name, tc := range map[string]struct {
		entries []metav1.ManagedFieldsEntry
		want    string
	}{
		"no managed fields":        {nil, ""},
		"one writer":               {[]metav1.ManagedFieldsEntry{entry("kubectl-annotate", at(1), suspend)}, "kubectl-annotate"},
		"another key only":         {[]metav1.ManagedFieldsEntry{entry("helm", at(1), `{"f:metadata":{"f:annotations":{"f:p/suspended-since":{}}}}`)}, ""},
		"the most recent of two":   {[]metav1.ManagedFieldsEntry{entry("argocd-controller", at(1), suspend), entry("image-refresh-suspend", at(5), suspend)}, "image-refresh-suspend"},
		"an entry that is no JSON": {[]metav1.ManagedFieldsEntry{entry("broken", at(9), `{`), entry("kubectl-annotate", at(1), suspend)}, "kubectl-annotate"},
		"image and annotations in one entry": {[]metav1.ManagedFieldsEntry{entry("helm", at(1),
			`{"f:metadata":{"f:annotations":{"f:p/suspend":{}}},"f:spec":{"f:template":{}}}`)}, "helm"},
	} {
		t.Run(name, func(t *testing.T) {
			o := &Object{managedFields: tc.entries}
			if got := o.AnnotationManager("p/suspend"); got != tc.want {
				t.Errorf("AnnotationManager = %q, want %q", got, tc.want)
			}
		})
	}
}
